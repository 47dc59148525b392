package window

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomCounterSends returns n sends of cost 1 in time order, over span ms.
func randomCounterSends(rng *rand.Rand, n int, span int64) []Send {
	sends := make([]Send, n)
	for i := range sends {
		sends[i] = Send{At: t0 + rng.Int64N(span)}
	}
	slices.SortFunc(sends, func(a, b Send) int { return int(a.At - b.At) })
	return sends
}

func insertAll(t *testing.T, d *Domain, sends []Send) []byte {
	t.Helper()
	var s Scratch
	var rec []byte
	for _, snd := range sends {
		out, err := d.Insert(&s, rec, 3, snd.At, Item{})
		if err != nil {
			t.Fatal(err)
		}
		rec = slices.Clone(out)
	}
	return rec
}

// TestCountersReplayMergeAndBuild: for domains of every algorithm, Insert
// in time order, Apply record-only in time order and Build give the same
// record; the counters (not the buckets, nor a borrowing fixed-window, to
// which a send of an earlier window adds its whole cost to the debt) give
// it in any order too; Merge
// of a prefix copy and the whole copy is the whole, both ways round.
func TestCountersReplayMergeAndBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2))
	for i := range 300 {
		d := randomCounterDomain(rng, false)
		sends := randomCounterSends(rng, 1+rng.IntN(40), 1+rng.Int64N(3*d.Longest()))
		inOrder := insertAll(t, d, sends)

		var s Scratch
		var dec Decision
		var applied []byte
		for _, snd := range sends {
			out, err := d.Apply(&s, applied, 3, snd.At, Item{Mode: RecordOnly}, &dec)
			if err != nil {
				t.Fatal(err)
			}
			if out != nil {
				applied = slices.Clone(out)
			}
		}
		built, err := d.Build(&s, 3, sends)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(inOrder, applied) || !bytes.Equal(inOrder, built) {
			t.Fatalf("case %d rules %+v: insert %x, apply %x, build %x", i, d.rules, inOrder, applied, built)
		}

		shuffled := slices.Clone(sends)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		anyOrder := insertAll(t, d, shuffled)
		buckets := false
		for _, r := range d.rules {
			buckets = buckets || r.Algorithm.isBucket() || r.Borrow > 0
		}
		if !buckets && !bytes.Equal(anyOrder, inOrder) {
			t.Fatalf("case %d rules %+v: out-of-order insert %x, in order %x", i, d.rules, anyOrder, inOrder)
		}
		if buckets {
			// Out of order can only deny early: never more remaining.
			var a, b Decision
			for _, at := range []int64{0, 1, 100, 1000, d.Longest() / 2} {
				now := sends[len(sends)-1].At + at
				if _, err := d.Apply(&s, anyOrder, 3, now, Item{Mode: Peek}, &a); err != nil {
					t.Fatal(err)
				}
				if _, err := d.Apply(&s, inOrder, 3, now, Item{Mode: Peek}, &b); err != nil {
					t.Fatal(err)
				}
				for j := range d.NumRules() {
					if a.Rules[j].Remaining > b.Rules[j].Remaining {
						t.Fatalf("case %d rule %+v at +%d: out of order leaves %d remaining, in order %d", i, d.rules[j], at, a.Rules[j].Remaining, b.Rules[j].Remaining)
					}
				}
			}
		}

		prefix := insertAll(t, d, sends[:rng.IntN(len(sends)+1)])
		for _, pair := range [][2][]byte{{prefix, inOrder}, {inOrder, prefix}} {
			m, err := d.Merge(&s, pair[0], pair[1])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m, inOrder) {
				t.Fatalf("case %d rules %+v: merge of a prefix and the whole = %x, want %x", i, d.rules, m, inOrder)
			}
		}
	}
}

// TestCounterRefunds: a refund in the counters (fixed-window,
// sliding-counter) decides as if the send was never made; in a bucket it
// never leaves more room than that history, and exactly as much when the
// refund comes at the send's own millisecond and the bucket was never full
// beyond its capacity (record-only sends). A borrowing fixed-window gives
// back only a send of its newest window (not the debt an earlier one left):
// never more room, and exactly as much for a send of that window.
func TestCounterRefunds(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 3))
	for i := range 400 {
		d := randomCounterDomain(rng, false)
		sends := randomCounterSends(rng, 2+rng.IntN(30), 1+rng.Int64N(2*d.Longest()))
		k := rng.IntN(len(sends))
		with := insertAll(t, d, sends)
		without := insertAll(t, d, slices.Delete(slices.Clone(sends), k, k+1))
		var s Scratch
		refunded, _, emptied, err := d.Remove(&s, with, 3, sends[k].At, Item{})
		if err != nil {
			t.Fatal(err)
		}
		if refunded == nil && !emptied {
			refunded = with // nothing counted the send any more
		}
		refunded = slices.Clone(refunded)
		atItsMs := sends[k].At == sends[len(sends)-1].At
		var st state
		if err := st.decode(with); err != nil {
			t.Fatal(err)
		}
		var a, b Decision
		for _, at := range []int64{0, 1, 50, 500, d.Longest()} {
			now := sends[len(sends)-1].At + at
			if _, err := d.Apply(&s, refunded, 3, now, Item{Mode: Peek}, &a); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Apply(&s, without, 3, now, Item{Mode: Peek}, &b); err != nil {
				t.Fatal(err)
			}
			for j, r := range d.rules {
				ra, rb := a.Rules[j].Remaining, b.Rules[j].Remaining
				switch {
				case r.Algorithm == SlidingLog:
				case r.Borrow > 0 && ra > rb:
					t.Fatalf("case %d rule %+v at +%d: refund leaves %d remaining, the history without the send %d", i, r, at, ra, rb)
				case r.Borrow > 0 && sends[k].At/r.WindowMillis() == sends[len(sends)-1].At/r.WindowMillis() && ra != rb:
					t.Fatalf("case %d rule %+v at +%d: refund of a send of the newest window leaves %d remaining, want %d", i, r, at, ra, rb)
				case r.Borrow > 0:
				case r.Algorithm.isBucket() && ra > rb:
					t.Fatalf("case %d rule %+v at +%d: refund leaves %d remaining, the history without the send %d", i, r, at, ra, rb)
				case r.Algorithm.isBucket() && atItsMs && len(st.counterVals(&d.counters[d.cidx[j]])) == 2 && ra != rb:
					// Exact unless the bucket was ever full beyond its capacity.
					t.Fatalf("case %d rule %+v: refund at the send's ms leaves %d remaining, want %d", i, r, ra, rb)
				case !r.Algorithm.isBucket() && ra != rb:
					t.Fatalf("case %d rule %+v at +%d: refund leaves %d remaining, want %d", i, r, at, ra, rb)
				}
			}
		}
	}
}
