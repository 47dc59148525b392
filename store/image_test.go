package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// peekAll returns the per-rule used counts of every recipient in rcps.
func peekAll(t *testing.T, st *Store, ref Ref, rcps []string, now int64) map[string][window.MaxRules]int {
	t.Helper()
	out := map[string][window.MaxRules]int{}
	var dec window.Decision
	for _, rcp := range rcps {
		key, tag := keyOf(rcp)
		if _, _, err := apply(st, ref, key, tag, now, window.Item{Mode: window.Peek, Content: 1}, 0, &dec); err != nil {
			t.Fatal(err)
		}
		var used [window.MaxRules]int
		for i := range dec.NumRules {
			used[i] = dec.Rules[i].Used
		}
		out[rcp] = used
	}
	return out
}

// fill records random sends for n recipients into st and returns their names.
func fill(t *testing.T, st *Store, ref Ref, rng *rand.Rand, n, sends int, now int64) []string {
	t.Helper()
	var rcps []string
	for i := range n {
		rcps = append(rcps, fmt.Sprintf("+86%09d", i))
	}
	var dec window.Decision
	for i := range sends {
		rcp := rcps[rng.IntN(n)]
		key, tag := keyOf(rcp)
		if _, _, err := apply(st, ref, key, tag, now+int64(i), window.Item{Content: uint64(rng.IntN(3))}, uint64(i+1), &dec); err != nil {
			t.Fatal(err)
		}
	}
	return rcps
}

func bindTo(refs ...Ref) func(string) (Ref, bool) {
	return func(name string) (Ref, bool) {
		for _, r := range refs {
			if r.Rules().Name() == name {
				return r, true
			}
		}
		return Ref{}, false
	}
}

// TestImageRoundTrip moves every partition of one store into an empty one
// through images, under the same and under another partition count: every
// recipient answers the same, and (same count) retried ids stay duplicates.
// Images of version 1 (records in window's format 1, for older peers) move
// the same state.
func TestImageRoundTrip(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	rng := rand.New(rand.NewPCG(1, 1))
	src, sref := newTestStore(t, d, 16)
	rcps := fill(t, src, sref, rng, 500, 5000, t0)
	now := t0 + 5000
	want := peekAll(t, src, sref, rcps, now)
	for _, tc := range []struct{ parts, version int }{{16, ImageVersion}, {7, ImageVersion}, {16, 2}, {7, 2}, {16, 1}, {7, 1}} {
		parts := tc.parts
		dst, dref := newTestStore(t, d, parts)
		var total int64
		for p := range src.Partitions() {
			img, n, err := src.AppendImageVersion(nil, p, false, tc.version)
			if err != nil {
				t.Fatal(err)
			}
			h, ms, err := dst.MergeImage(img, now, bindTo(dref))
			if err != nil {
				t.Fatal(err)
			}
			if h.Version != tc.version || h.Partition != p || h.Partitions != 16 || h.Seq != src.Seq(p) || ms.Records != n {
				t.Fatalf("partition %d: header %+v stats %+v, want %d records", p, h, ms, n)
			}
			if parts != 16 && ms.DroppedIDs == 0 && ms.IDs != 0 {
				t.Fatalf("ids kept across a partition count change: %+v", ms)
			}
			total += n
		}
		if s := dst.Stats(dref); s.Records != total || total != src.Stats(sref).Records {
			t.Fatalf("%d partitions: %d records, want %d", parts, s.Records, total)
		}
		if got := peekAll(t, dst, dref, rcps, now); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%d partitions, image version %d: answers differ after the move", parts, tc.version)
		}
		if parts == 16 && src.Stats(sref).IDs != dst.Stats(dref).IDs {
			t.Fatalf("ids: %d moved, want %d", dst.Stats(dref).IDs, src.Stats(sref).IDs)
		}
	}
	if _, _, err := src.AppendImageVersion(nil, 0, false, ImageVersion+1); err == nil {
		t.Fatalf("AppendImageVersion wrote version %d", ImageVersion+1)
	}
}

// TestImageCarriesCounterStates moves the records of a domain of counting
// algorithms in the current image version, and refuses to write them in an
// older one (whose record format has no room for them), changing nothing.
func TestImageCarriesCounterStates(t *testing.T) {
	d, err := window.NewDomain("api", []window.Rule{
		{Name: "hour", Scope: window.ScopeRecipient, Algorithm: window.SlidingCounter, Limit: 10_000, Window: time.Hour},
		{Name: "burst", Scope: window.ScopeRecipient, Algorithm: window.GCRA, Limit: 100, Window: time.Minute},
		{Name: "day", Scope: window.ScopeRecipient, Algorithm: window.FixedWindow, Limit: 1_000_000, Window: 24 * time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	src, sref := newTestStore(t, d, 4)
	rcps := fill(t, src, sref, rng, 200, 3000, t0)
	now := t0 + 3000
	want := peekAll(t, src, sref, rcps, now)
	dst, dref := newTestStore(t, d, 4)
	for p := range src.Partitions() {
		if _, _, err := src.AppendImageVersion(nil, p, true, 2); !errors.Is(err, window.ErrNeedsFormat3) {
			t.Fatalf("partition %d: image version 2 of counter states: %v, want ErrNeedsFormat3", p, err)
		}
		img, _, err := src.AppendImageVersion(nil, p, false, ImageVersion)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dst.MergeImage(img, now, bindTo(dref)); err != nil {
			t.Fatal(err)
		}
	}
	if got := peekAll(t, src, sref, rcps, now); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatal("a refused older image changed the source")
	}
	if got := peekAll(t, dst, dref, rcps, now); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatal("answers differ after moving counter states")
	}
}

// TestMergeImageIsAUnion splits one history between two stores, as an old
// and a new owner might hold it, and merges one into the other both ways.
func TestMergeImageIsAUnion(t *testing.T) {
	d, _ := window.NewDomain("default", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 100, Window: time.Hour}})
	whole, wref := newTestStore(t, d, 4)
	a, aref := newTestStore(t, d, 4)
	b, bref := newTestStore(t, d, 4)
	rng := rand.New(rand.NewPCG(2, 2))
	var rcps []string
	for i := range 50 {
		rcps = append(rcps, fmt.Sprint("r", i))
	}
	var dec window.Decision
	for i := range 2000 {
		rcp := rcps[rng.IntN(len(rcps))]
		key, tag := keyOf(rcp)
		at := t0 + int64(i)
		targets := []struct {
			st  *Store
			ref Ref
		}{{whole, wref}}
		switch rng.IntN(3) {
		case 0:
			targets = append(targets, struct {
				st  *Store
				ref Ref
			}{a, aref})
		case 1:
			targets = append(targets, struct {
				st  *Store
				ref Ref
			}{b, bref})
		default:
			targets = append(targets, struct {
				st  *Store
				ref Ref
			}{a, aref}, struct {
				st  *Store
				ref Ref
			}{b, bref})
		}
		for _, tg := range targets {
			if _, _, err := apply(tg.st, tg.ref, key, tag, at, window.Item{Mode: window.RecordOnly}, 0, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := t0 + 2000
	want := peekAll(t, whole, wref, rcps, now)
	for p := range 4 {
		img, _ := b.AppendImage(nil, p)
		if _, _, err := a.MergeImage(img, now, bindTo(aref)); err != nil {
			t.Fatal(err)
		}
		// Merging the same image again changes nothing.
		if _, _, err := a.MergeImage(img, now, bindTo(aref)); err != nil {
			t.Fatal(err)
		}
	}
	if got := peekAll(t, a, aref, rcps, now); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("union differs from the whole history:\n got %v\nwant %v", got, want)
	}
}

func TestDropAndForEach(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, ref := newTestStore(t, d, 8)
	rng := rand.New(rand.NewPCG(3, 3))
	fill(t, st, ref, rng, 200, 1000, t0)
	var seen int64
	for p := range 8 {
		n := st.PartitionStats(p, ref).Records
		var listed int64
		st.ForEach(p, func(domain string, key uint64, rec []byte) bool {
			if domain != "default" || st.PartitionOf(key) != p {
				t.Fatalf("partition %d lists key %x of domain %q", p, key, domain)
			}
			listed++
			return true
		})
		if listed != n {
			t.Fatalf("partition %d: listed %d of %d", p, listed, n)
		}
		seen += n
	}
	total := st.Stats(ref).Records
	if seen != total {
		t.Fatalf("partitions hold %d, store %d", seen, total)
	}
	seq := st.Seq(3)
	dropped := st.Drop(3)
	if after := st.Stats(ref).Records; after != total-dropped || st.PartitionStats(3, ref).Records != 0 || st.Seq(3) != seq {
		t.Fatalf("drop: %d left of %d after dropping %d; seq %d, was %d", after, total, dropped, st.Seq(3), seq)
	}
}

// TestBadImageChangesNothing damages an image in many ways: each is refused
// with ErrBadImage and the store is left as it was.
func TestBadImageChangesNothing(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	src, sref := newTestStore(t, d, 4)
	fill(t, src, sref, rand.New(rand.NewPCG(4, 4)), 50, 300, t0)
	img, _ := src.AppendImage(nil, 1)
	dst, dref := newTestStore(t, d, 4)
	for cut := range len(img) {
		if _, _, err := dst.MergeImage(img[:cut], t0, bindTo(dref)); !errors.Is(err, ErrBadImage) {
			t.Fatalf("prefix of %d bytes: %v, want ErrBadImage", cut, err)
		}
	}
	for _, bad := range [][]byte{
		append([]byte{9}, img[1:]...),                   // unknown version
		append(bytes.Clone(img), 0),                     // trailing byte
		append(img[:1:1], 0xff, 0xff, 0, 0, 4, 0, 0, 0), // partition out of range
	} {
		if _, _, err := dst.MergeImage(bad, t0, bindTo(dref)); !errors.Is(err, ErrBadImage) {
			t.Fatalf("%x: %v, want ErrBadImage", bad[:min(len(bad), 16)], err)
		}
	}
	if s := dst.Stats(dref); s.Records != 0 || dst.Seq(1) != 0 {
		t.Fatalf("a refused image changed the store: %+v", s)
	}
}

func FuzzMergeImage(f *testing.F) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	src, err := New(Config{Partitions: 2})
	if err != nil {
		f.Fatal(err)
	}
	sref := src.Bind(d)
	var dec window.Decision
	for i := range 20 {
		key, tag := keyOf(fmt.Sprint(i))
		apply(src, sref, key, tag, t0+int64(i), window.Item{Content: uint64(i % 3)}, uint64(i), &dec)
	}
	for p := range 2 {
		img, _ := src.AppendImage(nil, p)
		f.Add(img)
		old, _, _ := src.AppendImageVersion(nil, p, false, 1)
		f.Add(old)
	}
	f.Fuzz(func(t *testing.T, img []byte) {
		dst, _ := New(Config{Partitions: 2})
		ref := dst.Bind(d)
		_, _, err := dst.MergeImage(img, t0+100, bindTo(ref))
		if err != nil {
			if dst.Stats(ref).Records != 0 && errors.Is(err, ErrBadImage) {
				t.Fatalf("a refused image changed the store: %v", err)
			}
			return
		}
		// Its parts merge as it does.
		parts, err := SplitImage(img, 300)
		if err != nil {
			t.Fatalf("an image MergeImage took does not split: %v", err)
		}
		split, _ := New(Config{Partitions: 2})
		sref := split.Bind(d)
		for _, part := range parts {
			if _, _, err := split.MergeImage(part, t0+100, bindTo(sref)); err != nil {
				t.Fatalf("a part does not merge: %v", err)
			}
		}
		if a, b := split.Stats(sref), dst.Stats(ref); a.Records != b.Records || a.IDs != b.IDs {
			t.Fatalf("parts merge to %+v, the whole image to %+v", a, b)
		}
		// What was merged can be exported and merged again.
		for p := range 2 {
			out, _ := dst.AppendImage(nil, p)
			again, _ := New(Config{Partitions: 2})
			if _, _, err := again.MergeImage(out, t0+100, bindTo(again.Bind(d))); err != nil {
				t.Fatalf("re-export of partition %d does not merge: %v", p, err)
			}
		}
	})
}

// TestSplitImage splits images of two domains (records and request ids) at
// many sizes: every part fits, checks, and the parts merged in any order
// answer as the whole image does, with the same records and ids.
func TestSplitImage(t *testing.T) {
	d1, _ := window.NewDomain("default", window.DefaultRules())
	d2, _ := window.NewDomain("second-domain", window.DefaultRules())
	src, err := New(Config{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := src.Bind(d1), src.Bind(d2)
	rng := rand.New(rand.NewPCG(8, 8))
	rcps := fill(t, src, r1, rng, 300, 3000, t0)
	var dec window.Decision
	for i := range 2000 { // the second domain: other request ids
		key, tag := keyOf(rcps[rng.IntN(200)])
		if _, _, err := apply(src, r2, key, tag, t0+3000+int64(i), window.Item{Content: uint64(rng.IntN(3))}, uint64(100_000+i), &dec); err != nil {
			t.Fatal(err)
		}
	}
	now := t0 + 5000
	img, n := src.AppendImage(nil, 0)
	want1, want2 := peekAll(t, src, r1, rcps, now), peekAll(t, src, r2, rcps[:200], now)
	wantStats := src.Stats(r1).plus(src.Stats(r2))
	if _, err := SplitImage(img[:len(img)-1], 1<<20); !errors.Is(err, ErrBadImage) {
		t.Fatalf("a truncated image: %v, want ErrBadImage", err)
	}
	// Small parts exercise every boundary; records here take under 200 bytes.
	for _, limit := range []int{len(img), len(img) - 1, len(img) / 2, 250, 333, 1000, 4096} {
		{
			parts, err := SplitImage(img, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(img) <= limit && (len(parts) != 1 || &parts[0][0] != &img[0]) {
				t.Fatalf("limit %d: an image that fits was split into %d", limit, len(parts))
			}
			dst, _ := New(Config{Partitions: 1})
			d1r, d2r := dst.Bind(d1), dst.Bind(d2)
			var recs int64
			for _, i := range rng.Perm(len(parts)) {
				if len(parts[i]) > limit {
					t.Fatalf("limit %d: part of %d bytes", limit, len(parts[i]))
				}
				_, ms, err := dst.MergeImage(parts[i], now, bindTo(d1r, d2r))
				if err != nil {
					t.Fatalf("limit %d part %d: %v", limit, i, err)
				}
				recs += ms.Records
			}
			got := dst.Stats(d1r).plus(dst.Stats(d2r))
			if recs != n || got.Records != wantStats.Records || got.IDs != wantStats.IDs {
				t.Fatalf("limit %d, %d parts: %d records merged, %+v; want %d, %+v", limit, len(parts), recs, got, n, wantStats)
			}
			if fmt.Sprint(peekAll(t, dst, d1r, rcps, now)) != fmt.Sprint(want1) || fmt.Sprint(peekAll(t, dst, d2r, rcps[:200], now)) != fmt.Sprint(want2) {
				t.Fatalf("limit %d: parts answer otherwise than the whole image", limit)
			}
		}
	}
}
