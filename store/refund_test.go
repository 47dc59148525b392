package store

import (
	"errors"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// TestRefundFreesExactlyOneSend: a refund takes back one recorded send, a
// repeated refund frees nothing, and refunds of unknown ids or of another
// content fail and change nothing.
func TestRefundFreesExactlyOneSend(t *testing.T) {
	d, err := window.NewDomain("d", []window.Rule{
		{Name: "r-5-1h", Scope: window.ScopeRecipient, Limit: 5, Window: time.Hour},
		{Name: "c-3-1h", Scope: window.ScopeContent, Limit: 3, Window: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := New(Config{Partitions: 4, IDHorizon: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	key, tag := keyOf("+1")
	p := st.PartitionOf(storedKey(key))
	send := func(now int64, content, id uint64) window.Decision {
		t.Helper()
		var dec window.Decision
		if _, _, err := st.Apply(p, ref, key, tag, now, window.Item{Content: content}, id, &dec); err != nil {
			t.Fatal(err)
		}
		return dec
	}
	used := func(now int64, content uint64) (int, int) {
		var dec window.Decision
		if _, _, err := st.Apply(p, ref, key, tag, now, window.Item{Content: content, Mode: window.Peek}, 0, &dec); err != nil {
			t.Fatal(err)
		}
		return dec.Rules[0].Used, dec.Rules[1].Used
	}
	send(t0, 7, 1)
	send(t0, 7, 2) // the same ms and content: a refund of id 2 takes back one of the two
	send(t0+5, 8, 3)
	// Logs below their capacity (5 and 3): a refund is exact (see
	// window.Domain.Remove for full logs).
	seq0 := st.Seq(p)
	var rdec window.Decision
	seq, cost, again, err := st.Refund(p, ref, key, tag, t0+10, window.Item{Content: 7}, 2, &rdec)
	at := rdec.At
	if err != nil || again || at != t0 || cost != 1 || seq != seq0+1 || rdec.Rules[0].Used != 2 || rdec.Recorded {
		t.Fatalf("refund: seq %d at %d cost %d again %v err %v", seq, at, cost, again, err)
	}
	if r, c := used(t0+11, 7); r != 2 || c != 1 {
		t.Fatalf("after the refund: used %d, content %d; want 2, 1", r, c)
	}
	if _, _, again, err := st.Refund(p, ref, key, tag, t0+12, window.Item{Content: 7}, 2, &rdec); err != nil || !again {
		t.Fatalf("a second refund: again %v, err %v; want again", again, err)
	}
	if r, c := used(t0+13, 7); r != 2 || c != 1 {
		t.Fatalf("after a second refund: used %d, content %d; want still 2, 1", r, c)
	}
	// A new attempt under the refunded id is decided and recorded afresh
	// (not answered as a retry, which would let it be sent uncounted); a
	// retry of that attempt is a retry again.
	st3, _ := New(Config{Partitions: 4, IDHorizon: time.Minute})
	ref3 := st3.Bind(d)
	var d3 window.Decision
	for i, want := range []struct {
		mode     window.Mode
		dup      bool
		used     int
		refunded bool
	}{{window.CheckAndRecord, false, 1, false}, {0, false, 0, true}, {window.CheckAndRecord, false, 1, false}, {window.CheckAndRecord, true, 1, false}} {
		var err error
		dup := false
		if want.refunded {
			_, _, _, err = st3.Refund(p, ref3, key, tag, t0+int64(i), window.Item{Content: 7}, 42, &d3)
		} else {
			_, dup, err = st3.Apply(p, ref3, key, tag, t0+int64(i), window.Item{Content: 7}, 42, &d3)
		}
		if err != nil || dup != want.dup || d3.Rules[0].Used != want.used {
			t.Fatalf("step %d: dup %v used %d err %v; want dup %v used %d", i, dup, d3.Rules[0].Used, err, want.dup, want.used)
		}
	}
	if _, _, _, err := st.Refund(p, ref, key, tag, t0+14, window.Item{Content: 7}, 99, &rdec); !errors.Is(err, ErrRefundUnknown) {
		t.Fatalf("refund of an unknown id: %v", err)
	}
	if _, _, _, err := st.Refund(p, ref, key, tag, t0+14, window.Item{Content: 8}, 1, &rdec); !errors.Is(err, ErrIDReused) {
		t.Fatalf("refund with another content: %v", err)
	}
	if _, _, _, err := st.Refund(p, ref, key, tag, t0+5+time.Minute.Milliseconds(), window.Item{Content: 8}, 3, &rdec); !errors.Is(err, ErrRefundUnknown) {
		t.Fatalf("refund past the id horizon: %v", err)
	}
	if r, c := used(t0+15, 7); r != 2 || c != 1 {
		t.Fatalf("after failed refunds: used %d, content %d; want still 2, 1", r, c)
	}

	// Replay: the same sends and the refund give the same counts.
	st2, _ := New(Config{Partitions: 4, IDHorizon: time.Minute})
	ref2 := st2.Bind(d)
	for i, s := range []struct {
		at      int64
		content uint64
	}{{t0, 7}, {t0, 7}, {t0 + 5, 8}} {
		if err := st2.Insert(p, ref2, key, tag, s.at, window.Item{Content: s.content}, uint64(i+1), uint64(i+1), t0+20); err != nil {
			t.Fatal(err)
		}
	}
	if _, applied, err := st2.Unrecord(p, ref2, key, tag, t0, window.Item{Content: 7, Cost: 1}, 2, 4, t0+20); err != nil || !applied {
		t.Fatal(applied, err)
	}
	if _, applied, err := st2.Unrecord(p, ref2, key, tag, t0, window.Item{Content: 7, Cost: 1}, 2, 4, t0+20); err != nil || applied { // replayed twice
		t.Fatal(applied, err)
	}
	var dec window.Decision
	if _, _, err := st2.Apply(p, ref2, key, tag, t0+21, window.Item{Content: 7, Mode: window.Peek}, 0, &dec); err != nil {
		t.Fatal(err)
	}
	if dec.Rules[0].Used != 2 || dec.Rules[1].Used != 1 || st2.Seq(p) != 4 {
		t.Fatalf("replayed: used %d, content %d, seq %d; want 2, 1, 4", dec.Rules[0].Used, dec.Rules[1].Used, st2.Seq(p))
	}
}

// TestImageCarriesNoRefundedIDs: a store that merges an image of a
// partition treats a request id whose send was refunded, or marked
// unconfirmed, as the writer does: a new attempt under it is decided and
// recorded afresh, and a repeated refund of it takes back nothing. Before,
// the image carried such ids as recorded: after a snapshot and restart, or
// a handoff, the attempt was answered as admitted without counting, and a
// repeated refund took back another send of the same millisecond.
func TestImageCarriesNoRefundedIDs(t *testing.T) {
	d, err := window.NewDomain("d", []window.Rule{{Name: "r-5-1h", Scope: window.ScopeRecipient, Limit: 5, Window: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	newStore := func() (*Store, Ref) {
		st, err := New(Config{Partitions: 4, IDHorizon: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return st, st.Bind(d)
	}
	src, ref := newStore()
	key, tag := keyOf("+1")
	p := src.PartitionOf(storedKey(key))
	for id := uint64(1); id <= 4; id++ { // four sends in one ms
		if _, dup, err := src.Record(p, ref, key, tag, t0, window.Item{Cost: 1}, id, t0); err != nil || dup {
			t.Fatalf("record id %d: dup %v, err %v", id, dup, err)
		}
	}
	var dec window.Decision
	if _, _, _, err := src.Refund(p, ref, key, tag, t0+1, window.Item{}, 1, &dec); err != nil {
		t.Fatal(err)
	}
	if !src.Unconfirmed(p, ref, key, 2) {
		t.Fatal("Unconfirmed: id 2 unknown")
	}
	img, _ := src.AppendImage(nil, p)
	dst, dref := newStore()
	if _, _, err := dst.MergeImage(img, t0+2, func(string) (Ref, bool) { return dref, true }); err != nil {
		t.Fatal(err)
	}
	used := func() int {
		var dec window.Decision
		if _, _, err := dst.Apply(p, dref, key, tag, t0+3, window.Item{Mode: window.Peek}, 0, &dec); err != nil {
			t.Fatal(err)
		}
		return dec.Rules[0].Used
	}
	if u := used(); u != 3 {
		t.Fatalf("after the merge: %d sends counted, want 3", u)
	}
	// A repeated refund of id 1 takes back nothing.
	if _, _, _, err := dst.Refund(p, dref, key, tag, t0+4, window.Item{}, 1, &dec); !errors.Is(err, ErrRefundUnknown) {
		t.Fatalf("a repeated refund of id 1 after the merge: %v, want ErrRefundUnknown", err)
	}
	if u := used(); u != 3 {
		t.Fatalf("after a repeated refund: %d sends counted, want 3", u)
	}
	// New attempts under ids 1 and 2 are decided and recorded afresh; a
	// retry of id 3 is still a retry.
	for _, c := range []struct {
		id  uint64
		dup bool
	}{{1, false}, {2, false}, {3, true}} {
		if _, dup, err := dst.Record(p, dref, key, tag, t0+5, window.Item{Cost: 1}, c.id, t0+5); err != nil || dup != c.dup {
			t.Fatalf("id %d after the merge: dup %v, err %v; want dup %v", c.id, dup, err, c.dup)
		}
	}
	if u := used(); u != 5 {
		t.Fatalf("at the end: %d sends counted, want 5", u)
	}
}
