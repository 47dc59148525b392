package window

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Merge, Insert (WAL replay), Build and Remove (refund) of each algorithm
// alone, with sends of several costs at repeated milliseconds, long idle
// gaps and record-only sends beyond the limits.

// costSend is a send of a cost.
type costSend struct {
	at   int64
	cost int
}

// oneRuleDomains returns a one-rule domain per algorithm (and variants of
// capacity and buckets), limit 6 per 900 ms: small enough to be over the
// limit often.
func oneRuleDomains(t *testing.T) []*Domain {
	t.Helper()
	var ds []*Domain
	for _, r := range []Rule{
		{Algorithm: SlidingLog},
		{Algorithm: SlidingCounter, Buckets: 9},
		{Algorithm: SlidingCounter, Buckets: 1},
		{Algorithm: FixedWindow},
		{Algorithm: TokenBucket},
		{Algorithm: TokenBucket, Capacity: 2},
		{Algorithm: LeakyBucket},
		{Algorithm: GCRA, Capacity: 11},
	} {
		r.Name, r.Scope, r.Limit, r.Window = "r", ScopeRecipient, 6, 900*time.Millisecond
		d, err := NewDomain(fmt.Sprintf("%v-cap%d-b%d", r.Algorithm, r.Capacity, r.Buckets), []Rule{r})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

// randomCostSends returns n sends in time order: costs 1 to 5 (1 when
// unit), often at the same ms, sometimes after an idle gap of a few windows.
func randomCostSends(rng *rand.Rand, n int, unit bool) []costSend {
	out := make([]costSend, n)
	at := t0
	for i := range out {
		switch x := rng.IntN(10); {
		case x < 3: // the same ms
		case x == 3:
			at += 900 + rng.Int64N(3000)
		default:
			at += rng.Int64N(200)
		}
		out[i] = costSend{at, 1}
		if !unit && rng.IntN(3) == 0 {
			out[i].cost = 1 + rng.IntN(5)
		}
	}
	return out
}

func insertCosts(t *testing.T, d *Domain, sends []costSend) []byte {
	t.Helper()
	var s Scratch
	var rec []byte
	for _, snd := range sends {
		out, err := d.Insert(&s, rec, 3, snd.at, Item{Cost: snd.cost})
		if err != nil {
			t.Fatal(err)
		}
		rec = slices.Clone(out)
	}
	return rec
}

func applyCosts(t *testing.T, d *Domain, sends []costSend) []byte {
	t.Helper()
	var s Scratch
	var dec Decision
	var rec []byte
	for _, snd := range sends {
		out, err := d.Apply(&s, rec, 3, snd.at, Item{Cost: snd.cost, Mode: RecordOnly}, &dec)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			rec = slices.Clone(out)
		}
	}
	return rec
}

func merge(t *testing.T, d *Domain, a, b []byte) []byte {
	t.Helper()
	var s Scratch
	m, err := d.Merge(&s, a, b)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(m)
}

// peekAll returns the decisions of a Peek of cost 1 and of cost 2 at each
// of several times after at.
func peekAll(t *testing.T, d *Domain, rec []byte, at int64) []Decision {
	t.Helper()
	var s Scratch
	var out []Decision
	for _, dt := range []int64{0, 1, 37, 150, 450, 899, 900, 901, 1799, 5000} {
		for _, cost := range []int{1, 2} {
			var dec Decision
			if _, err := d.Apply(&s, rec, 3, at+dt, Item{Cost: cost, Mode: Peek}, &dec); err != nil {
				t.Fatal(err)
			}
			out = append(out, dec)
		}
	}
	return out
}

// TestCounterMergeEachAlgorithm: a record of any subset of the sends (a
// prefix among them) merged with the record of all of them is that record,
// either way round; merge is commutative on any two records; merging with
// an empty record returns the other.
func TestCounterMergeEachAlgorithm(t *testing.T) {
	for _, d := range oneRuleDomains(t) {
		t.Run(d.Name(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(17, uint64(d.Rule(0).Algorithm)))
			for i := range 200 {
				sends := randomCostSends(rng, 1+rng.IntN(30), false)
				whole := insertCosts(t, d, sends)
				var subset, other []costSend
				k := rng.IntN(len(sends) + 1)
				for j, snd := range sends {
					if (i%2 == 0 && j < k) || (i%2 == 1 && rng.IntN(2) == 0) {
						subset = append(subset, snd)
					}
					if rng.IntN(2) == 0 {
						other = append(other, snd)
					}
				}
				sub := insertCosts(t, d, subset)
				for _, m := range [][]byte{merge(t, d, sub, whole), merge(t, d, whole, sub)} {
					if !bytes.Equal(m, whole) {
						t.Fatalf("case %d: merge of %v and %v = %x, want %x", i, subset, sends, m, whole)
					}
				}
				// Two copies neither of which includes the other.
				o := insertCosts(t, d, other)
				if ab, ba := merge(t, d, sub, o), merge(t, d, o, sub); !bytes.Equal(ab, ba) {
					t.Fatalf("case %d: merge(a, b) = %x, merge(b, a) = %x", i, ab, ba)
				}
				if m := merge(t, d, whole, nil); !bytes.Equal(m, whole) {
					t.Fatalf("case %d: merge with empty = %x, want %x", i, m, whole)
				}
				if m := merge(t, d, nil, whole); !bytes.Equal(m, whole) {
					t.Fatalf("case %d: merge of empty with = %x, want %x", i, m, whole)
				}
			}
			if m := merge(t, d, nil, nil); m != nil {
				t.Fatalf("merge of two empty records = %x", m)
			}
		})
	}
}

// TestCounterReplayEachAlgorithm: Insert in time order, Apply record-only
// in time order and (for sends of cost 1) Build give the same bytes; the
// counters give them in any order; the buckets, in any order, never leave
// more remaining than in time order.
func TestCounterReplayEachAlgorithm(t *testing.T) {
	for _, d := range oneRuleDomains(t) {
		t.Run(d.Name(), func(t *testing.T) {
			alg := d.Rule(0).Algorithm
			rng := rand.New(rand.NewPCG(18, uint64(alg)))
			for i := range 200 {
				unit := i%2 == 0
				sends := randomCostSends(rng, 1+rng.IntN(30), unit)
				inOrder := insertCosts(t, d, sends)
				if applied := applyCosts(t, d, sends); !bytes.Equal(applied, inOrder) {
					t.Fatalf("case %d %v: apply %x, insert %x", i, sends, applied, inOrder)
				}
				if unit {
					ss := make([]Send, len(sends))
					for j, snd := range sends {
						ss[j] = Send{At: snd.at}
					}
					var s Scratch
					built, err := d.Build(&s, 3, ss)
					if err != nil || !bytes.Equal(built, inOrder) {
						t.Fatalf("case %d %v: build %x %v, insert %x", i, sends, built, err, inOrder)
					}
				}
				shuffled := slices.Clone(sends)
				rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
				anyOrder := insertCosts(t, d, shuffled)
				last := sends[len(sends)-1].at
				if !alg.isBucket() {
					if !bytes.Equal(anyOrder, inOrder) {
						t.Fatalf("case %d %v: order %v gives %x, time order %x", i, sends, shuffled, anyOrder, inOrder)
					}
					continue
				}
				a, b := peekAll(t, d, anyOrder, last), peekAll(t, d, inOrder, last)
				for j := range a {
					if a[j].Rules[0].Remaining > b[j].Rules[0].Remaining || a[j].Admitted && !b[j].Admitted {
						t.Fatalf("case %d %v order %v, peek %d: out of order %+v admitted %v, in order %+v admitted %v", i, sends, shuffled, j, a[j].Rules[0], a[j].Admitted, b[j].Rules[0], b[j].Admitted)
					}
				}
			}
		})
	}
}

// TestCounterRefundEachAlgorithm: Remove of one recorded send. Fixed-window,
// sliding-counter (and sliding-log, below its capacity): every later
// decision is the one of the history without the send. Buckets: never more
// remaining than that history, and the same when the refunded send is at
// the record's newest ms and the bucket was never full beyond capacity.
func TestCounterRefundEachAlgorithm(t *testing.T) {
	for _, d := range oneRuleDomains(t) {
		t.Run(d.Name(), func(t *testing.T) {
			alg := d.Rule(0).Algorithm
			rng := rand.New(rand.NewPCG(19, uint64(alg)))
			for i := range 300 {
				sends := randomCostSends(rng, 1+rng.IntN(20), false)
				k := rng.IntN(len(sends))
				if i%3 == 0 {
					k = len(sends) - 1 // the newest: at the record's newest ms
				}
				with := insertCosts(t, d, sends)
				without := insertCosts(t, d, slices.Delete(slices.Clone(sends), k, k+1))
				var s Scratch
				refunded, _, emptied, err := d.Remove(&s, with, 3, sends[k].at, Item{Cost: sends[k].cost})
				if err != nil {
					t.Fatal(err)
				}
				if refunded == nil && !emptied {
					refunded = with
				}
				refunded = slices.Clone(refunded)
				last := sends[len(sends)-1].at
				a, b := peekAll(t, d, refunded, last), peekAll(t, d, without, last)
				var st state
				if err := st.decode(with); err != nil {
					t.Fatal(err)
				}
				neverClamped := !alg.isBucket() || len(st.counterVals(&d.counters[0])) == 2
				exact := !alg.isBucket() || (sends[k].at == last && neverClamped)
				if alg == SlidingLog {
					// A log at its capacity cannot tell which send it dropped (Remove).
					var sum int
					for _, snd := range sends {
						sum += snd.cost
					}
					exact = sum < d.Rule(0).Limit
				}
				for j := range a {
					ra, rb := a[j].Rules[0], b[j].Rules[0]
					if ra.Remaining > rb.Remaining || a[j].Admitted && !b[j].Admitted {
						t.Fatalf("case %d %v refund %d, peek %d: refund leaves %+v admitted %v, without the send %+v admitted %v", i, sends, k, j, ra, a[j].Admitted, rb, b[j].Admitted)
					}
					if exact && (ra != rb || a[j].Admitted != b[j].Admitted) {
						t.Fatalf("case %d %v refund %d, peek %d: refund gives %+v admitted %v, without the send %+v admitted %v", i, sends, k, j, ra, a[j].Admitted, rb, b[j].Admitted)
					}
				}
			}
		})
	}
}

// TestBucketRefundByHand: a token bucket of 10 per second (a send drains
// in 100 ms).
func TestBucketRefundByHand(t *testing.T) {
	d, err := NewDomain("d", []Rule{{Name: "tb", Scope: ScopeRecipient, Algorithm: TokenBucket, Limit: 10, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	remaining := func(rec []byte, at int64) int {
		var s Scratch
		var dec Decision
		if _, err := d.Apply(&s, rec, 3, at, Item{Mode: Peek}, &dec); err != nil {
			t.Fatal(err)
		}
		return dec.Rules[0].Remaining
	}
	refund := func(rec []byte, at int64) []byte {
		var s Scratch
		out, _, _, err := d.Remove(&s, rec, 3, at, Item{})
		if err != nil || out == nil {
			t.Fatalf("refund at t0%+d: %x %v", at-t0, out, err)
		}
		return slices.Clone(out)
	}
	// 5 sends at 0, one refunded: 4 sends, D = 4, remaining 6, exactly.
	five := insertCosts(t, d, repeatCost(5, costSend{t0, 1}))
	if got := remaining(refund(five, t0), t0); got != 6 {
		t.Fatalf("refund at the send's ms: remaining %d, want 6", got)
	}
	// 5 at 0 and 1 at +50: D(+50) = 5-0.5+1 = 5.5. Refunding a send of 0
	// takes back only what has not drained: 1-0.5 = 0.5, D = 5 (remaining 5);
	// without the send D = 4-0.5+1 = 4.5 (remaining floor(5.5) = 5). At +100
	// D = 4.5 (remaining 5) against 4 (remaining 6): never more.
	six := insertCosts(t, d, append(repeatCost(5, costSend{t0, 1}), costSend{t0 + 50, 1}))
	r := refund(six, t0)
	for _, c := range []struct {
		at         int64
		got, never int
	}{{t0 + 50, 5, 5}, {t0 + 100, 5, 6}, {t0 + 550, 10, 10}} {
		if got := remaining(r, c.at); got != c.got {
			t.Fatalf("refund then peek at t0%+d: remaining %d, want %d", c.at-t0, got, c.got)
		}
		without := insertCosts(t, d, append(repeatCost(4, costSend{t0, 1}), costSend{t0 + 50, 1}))
		if got := remaining(without, c.at); got != c.never {
			t.Fatalf("without the send, at t0%+d: remaining %d, want %d", c.at-t0, got, c.never)
		}
	}
	// Full beyond capacity: record-only 12 at 0 keeps 10; a refund then
	// takes nothing back (the send's share is unknown): still full.
	var s Scratch
	var dec Decision
	full, _ := d.Apply(&s, nil, 3, t0, Item{Cost: 12, Mode: RecordOnly}, &dec)
	full = slices.Clone(full)
	if out, removed, _, err := d.Remove(&s, full, 3, t0, Item{}); err != nil || out != nil || removed != 0 {
		t.Fatalf("refund from a bucket full beyond capacity: %x %d %v; want nothing", out, removed, err)
	}
	if got := remaining(full, t0); got != 0 {
		t.Fatalf("full bucket: remaining %d", got)
	}
}

func repeatCost(n int, c costSend) []costSend {
	out := make([]costSend, n)
	for i := range out {
		out[i] = c
	}
	return out
}
