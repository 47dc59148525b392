package window

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// randomSends returns n sends in ascending time order over a span of up to
// span ms, with contents drawn from k values (0, none, among them).
func randomSends(rng *rand.Rand, n int, span int64, k int) []Send {
	sends := make([]Send, n)
	for i := range sends {
		sends[i] = Send{At: t0 + rng.Int64N(span+1), Content: uint64(rng.IntN(k))}
	}
	slices.SortStableFunc(sends, func(a, b Send) int { return int(a.At - b.At) })
	return sends
}

// TestBuildEqualsInsertAndApply: for random domains and send lists, Build
// gives byte for byte the record that Insert gives from the sends in a
// random order, and that Apply with RecordOnly gives in time order.
func TestBuildEqualsInsertAndApply(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 9))
		d := randomDomain(rng, seed%2 == 0)
		if seed%4 == 0 {
			d, _ = NewDomain("default", DefaultRules())
		}
		var sends []Send
		switch seed % 3 {
		case 0: // the seed's steady state, then some
			sends = SteadyStateSends(rng, t0+86_400_000)
		case 1: // dense: many sends per window, repeated milliseconds
			sends = randomSends(rng, rng.IntN(200), 1+rng.Int64N(300_000), 1+rng.IntN(6))
		default: // sparse: most pruned
			sends = randomSends(rng, rng.IntN(60), 1+rng.Int64N(10_000_000), 1+rng.IntN(40))
		}
		var s Scratch
		got, err := d.Build(&s, 7, sends)
		if err != nil {
			t.Fatalf("seed %d: Build: %v", seed, err)
		}
		got = slices.Clone(got)

		var applied []byte
		var dec Decision
		for _, snd := range sends {
			out, err := d.Apply(&s, applied, 7, snd.At, Item{Content: snd.Content, Mode: RecordOnly}, &dec)
			if err != nil {
				t.Fatalf("seed %d: Apply: %v", seed, err)
			}
			if out != nil {
				applied = append(applied[:0], out...)
			}
		}
		if string(got) != string(applied) {
			t.Fatalf("seed %d (%d sends): Build differs from Apply\n got %x\nwant %x", seed, len(sends), got, applied)
		}

		shuffled := slices.Clone(sends)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		var inserted []byte
		for _, snd := range shuffled {
			out, err := d.Insert(&s, inserted, 7, snd.At, Item{Content: snd.Content})
			if err != nil {
				t.Fatalf("seed %d: Insert: %v", seed, err)
			}
			if out != nil {
				inserted = append(inserted[:0], out...)
			}
		}
		if string(got) != string(inserted) {
			t.Fatalf("seed %d (%d sends): Build differs from Insert\n got %x\nwant %x", seed, len(sends), got, inserted)
		}
	}
}

func TestBuildEdgeCases(t *testing.T) {
	def, _ := NewDomain("default", DefaultRules())
	contentOnly, _ := NewDomain("c", []Rule{{Name: "c", Scope: ScopeContent, Limit: 2, Window: time.Minute}})
	var s Scratch
	for _, tc := range []struct {
		name  string
		d     *Domain
		sends []Send
		nil   bool
		err   error
	}{
		{"no sends", def, nil, true, nil},
		{"content-only rules, no content", contentOnly, []Send{{At: t0}, {At: t0 + 5}}, true, nil},
		{"out of order", def, []Send{{At: t0 + 5}, {At: t0}}, false, ErrInvalid},
		{"negative time", def, []Send{{At: -1}}, false, ErrInvalid},
		{"time past 2^44", def, []Send{{At: maxTime + 1}}, false, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := tc.d.Build(&s, 1, tc.sends)
			if !errors.Is(err, tc.err) || (err == nil && (rec == nil) != tc.nil) {
				t.Fatalf("Build = %x, %v; want nil %v, error %v", rec, err, tc.nil, tc.err)
			}
		})
	}
	// Content-only rules: sends without content leave newest alone, as Insert does.
	sends := []Send{{At: t0, Content: 3}, {At: t0 + 10}}
	got, err := contentOnly.Build(&s, 1, sends)
	if err != nil {
		t.Fatal(err)
	}
	got = slices.Clone(got)
	var want []byte
	for _, snd := range sends {
		if out, _ := contentOnly.Insert(&s, want, 1, snd.At, Item{Content: snd.Content}); out != nil {
			want = append(want[:0], out...)
		}
	}
	if string(got) != string(want) {
		t.Fatalf("content-only: Build %x, Insert %x", got, want)
	}
}

func TestBuildTooManyContents(t *testing.T) {
	d, _ := NewDomain("c", []Rule{{Name: "c", Scope: ScopeContent, Limit: 2, Window: time.Hour}})
	sends := make([]Send, MaxContents+1)
	for i := range sends {
		sends[i] = Send{At: t0 + int64(i), Content: uint64(i+1) * 0x9e3779b97f4a7c15}
	}
	var s Scratch
	if _, err := d.Build(&s, 1, sends); !errors.Is(err, ErrFull) {
		t.Fatalf("Build of %d contents: %v, want ErrFull", len(sends), err)
	}
	if _, err := d.Build(&s, 1, sends[:MaxContents]); err != nil {
		t.Fatalf("Build of %d contents: %v", MaxContents, err)
	}
}

func TestBuildDoesNotAllocate(t *testing.T) {
	d, _ := NewDomain("default", DefaultRules())
	sends := SteadyStateSends(rand.New(rand.NewPCG(1, 1)), t0+86_400_000)
	var s Scratch
	d.Build(&s, 1, sends)
	if n := testing.AllocsPerRun(100, func() { d.Build(&s, 1, sends) }); n != 0 {
		t.Fatalf("Build allocates %v times per call", n)
	}
}

// TestDeadContentsDoNotFill checks that content logs no rule counts any
// more do not count towards MaxContents: a recipient whose MaxContents
// contents are all older than the content window can still be sent a new
// one, by Apply, Insert and Merge; and that live ones still do.
func TestDeadContentsDoNotFill(t *testing.T) {
	d, err := NewDomain("c", []Rule{
		{Name: "day", Scope: ScopeRecipient, Limit: 1000, Window: 24 * time.Hour},
		{Name: "c", Scope: ScopeContent, Limit: 2, Window: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	var s Scratch
	var dec Decision
	var full []byte
	for i := range MaxContents {
		out, err := d.Insert(&s, full, 1, t0+int64(i), Item{Content: uint64(i+1) * 0x9e3779b97f4a7c15})
		if err != nil {
			t.Fatal(err)
		}
		full = slices.Clone(out)
	}
	// Record-only: the day's rule, full, would deny a check.
	fresh := Item{Content: 42, Mode: RecordOnly}
	if _, err := d.Apply(&s, full, 1, t0+MaxContents, fresh, &dec); !errors.Is(err, ErrFull) {
		t.Fatalf("a new content beside %d live ones: %v, want ErrFull", MaxContents, err)
	}
	if _, err := d.Insert(&s, full, 1, t0+MaxContents, fresh); !errors.Is(err, ErrFull) {
		t.Fatalf("Insert of a new content beside %d live ones: %v, want ErrFull", MaxContents, err)
	}
	later := t0 + time.Hour.Milliseconds() + MaxContents // every content log is dead
	out, err := d.Apply(&s, full, 1, later, fresh, &dec)
	if err != nil || !dec.Admitted || !dec.Recorded {
		t.Fatalf("a new content after the window: %+v, %v", dec, err)
	}
	applied := slices.Clone(out)
	var fromNothing []byte
	for i := range MaxContents {
		// The recipient log alone, then the new send: what Apply's record must hold.
		o, err := d.Insert(&s, fromNothing, 1, t0+int64(i), Item{})
		if err != nil {
			t.Fatal(err)
		}
		fromNothing = slices.Clone(o)
	}
	o, err := d.Insert(&s, fromNothing, 1, later, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if string(applied) != string(o) {
		t.Fatalf("Apply after the window kept dead logs: %d bytes, want %d", len(applied), len(o))
	}
	if out, err := d.Insert(&s, full, 1, later, fresh); err != nil || string(out) != string(applied) {
		t.Fatalf("Insert after the window: %v, %d bytes, want %d", err, len(out), len(applied))
	}
	// A merge with a record whose only send is new content.
	one, _ := d.Insert(&s, nil, 1, later, fresh)
	one = slices.Clone(one)
	if out, err := d.Merge(&s, full, one); err != nil || string(out) != string(applied) {
		t.Fatalf("Merge after the window: %v, %d bytes, want %d", err, len(out), len(applied))
	}

	// The window's edge: a log whose newest entry is exactly a window
	// before counts no more; one a millisecond later still does.
	hour := time.Hour.Milliseconds()
	var same []byte // MaxContents logs, every entry at t0
	for i := range MaxContents {
		out, err := d.Insert(&s, same, 1, t0, Item{Content: uint64(i+1) * 0x9e3779b97f4a7c15})
		if err != nil {
			t.Fatal(err)
		}
		same = slices.Clone(out)
	}
	if _, err := d.Apply(&s, same, 1, t0+hour-1, fresh, &dec); !errors.Is(err, ErrFull) {
		t.Fatalf("a millisecond before the logs leave the window: %v, want ErrFull", err)
	}
	if _, err := d.Apply(&s, same, 1, t0+hour, fresh, &dec); err != nil || !dec.Recorded {
		t.Fatalf("when the logs leave the window: %+v, %v", dec, err)
	}
	if _, err := d.Insert(&s, same, 1, t0+hour-1, fresh); !errors.Is(err, ErrFull) {
		t.Fatalf("Insert a millisecond before the logs leave the window: %v, want ErrFull", err)
	}
	if _, err := d.Insert(&s, same, 1, t0+hour, fresh); err != nil {
		t.Fatalf("Insert when the logs leave the window: %v", err)
	}

	// A send older than the content window before the record's newest, to
	// a recipient with MaxContents live logs (a write-ahead log replayed out
	// of order, a merge with a stale copy): no rule counts it, so it is no
	// new content.
	stale := Item{Content: 43}
	newest := t0 + MaxContents - 1 // the newest send of full
	if out, err := d.Insert(&s, full, 1, newest-hour, stale); err != nil {
		t.Fatalf("Insert of a stale send beside %d live logs: %v", MaxContents, err)
	} else if want, _ := d.Insert(&s, full, 1, newest-hour, Item{}); string(out) != string(want) {
		t.Fatalf("Insert of a stale send kept its content")
	}
	old, _ := d.Insert(&s, nil, 1, newest-hour, stale)
	old = slices.Clone(old)
	for _, pair := range [][2][]byte{{full, old}, {old, full}} {
		if _, err := d.Merge(&s, pair[0], pair[1]); err != nil {
			t.Fatalf("Merge with a stale copy beside %d live logs: %v", MaxContents, err)
		}
	}
}
