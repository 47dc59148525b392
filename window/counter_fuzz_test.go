package window

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// FuzzApplyCounters (counter_test.go) fuzzes decisions against the
// reference. FuzzCounterRecordOps fuzzes the ways a record is written
// without deciding: record-only sends, Insert in and out of time order,
// Merge and Remove, over domains of every algorithm (recipient scope, small
// windows), and decides the result against the reference.

// fuzzCounterDomains are the domains of FuzzCounterRecordOps: all six
// algorithms mixed, with a borrowing fixed-window, and the counters alone
// (whose records do not depend on the order of Insert; a borrowing rule's
// do).
func fuzzCounterDomains(f *testing.F) (mixed, counters *Domain) {
	mixed, err := NewDomain("fuzz-mixed", []Rule{
		{Name: "log", Scope: ScopeRecipient, Limit: 6, Window: 900 * time.Millisecond},
		{Name: "counter", Scope: ScopeRecipient, Algorithm: SlidingCounter, Limit: 9, Window: 1200 * time.Millisecond, Buckets: 4},
		{Name: "token", Scope: ScopeRecipient, Algorithm: TokenBucket, Limit: 7, Window: time.Second, Capacity: 10},
		{Name: "funnel", Scope: ScopeRecipient, Algorithm: LeakyBucket, Limit: 3, Window: 700 * time.Millisecond, Capacity: 6},
		{Name: "gcra", Scope: ScopeRecipient, Algorithm: GCRA, Limit: 11, Window: 1300 * time.Millisecond, Capacity: 8},
		{Name: "fixed", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 8, Window: 1100 * time.Millisecond},
		{Name: "borrow", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Window: 400 * time.Millisecond, Borrow: 7},
	})
	if err != nil {
		f.Fatal(err)
	}
	counters, err = NewDomain("fuzz-counters", []Rule{
		{Name: "counter", Scope: ScopeRecipient, Algorithm: SlidingCounter, Limit: 9, Window: 1200 * time.Millisecond, Buckets: 4},
		{Name: "counter1", Scope: ScopeRecipient, Algorithm: SlidingCounter, Limit: 5, Window: 500 * time.Millisecond, Buckets: 1},
		{Name: "fixed", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 8, Window: 1100 * time.Millisecond},
	})
	if err != nil {
		f.Fatal(err)
	}
	return mixed, counters
}

// FuzzCounterRecordOps reads fuzz bytes as sends, 3 bytes each (clock step
// forward up to 1.27 s, or a repeat of the same ms; cost 1 to 8; a
// position for the shuffled order), and checks, in both domains:
//   - Apply record-only in time order equals Insert in time order, and its
//     decisions at the end match the reference fed the same record-only
//     sends;
//   - Insert in a shuffled order: the counters' record is the same; the
//     mixed domain never admits more (Remaining <= in every rule);
//   - Merge of the record of every other send with the whole is the whole;
//   - Remove of the newest send never leaves more remaining than the
//     history without it, and in the counters' domain exactly as much.
func FuzzCounterRecordOps(f *testing.F) {
	f.Add([]byte{0, 1, 0, 10, 2, 1, 0, 3, 2, 200, 8, 3})
	f.Add([]byte("record-only sends of every cost, over and over again"))
	f.Add([]byte{1, 7, 3, 0, 7, 2, 0, 7, 1, 81, 7, 0, 161, 0, 9}) // costs of 8 in a window, then across the borrow's windows
	mixed, counters := fuzzCounterDomains(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*200 {
			ops = ops[:3*200] // the reference is quadratic
		}
		var sends []costSend
		var order []int
		at := t0
		for i := 0; i+3 <= len(ops); i += 3 {
			op := ops[i : i+3]
			if op[0]&1 == 1 {
				at += int64(op[0]) * 5
			}
			sends = append(sends, costSend{at, 1 + int(op[1]%8)})
			order = append(order, int(op[2]))
		}
		if len(sends) == 0 {
			return
		}
		// A shuffle from the fuzz bytes: a stable sort by the order bytes.
		idx := make([]int, len(sends))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int { return order[a] - order[b] })
		shuffled := make([]costSend, len(sends))
		for i, j := range idx {
			shuffled[i] = sends[j]
		}
		last := sends[len(sends)-1].at
		for _, d := range []*Domain{mixed, counters} {
			inOrder := insertCosts(t, d, sends)
			if applied := applyCosts(t, d, sends); !bytes.Equal(applied, inOrder) {
				t.Fatalf("%s: apply %x, insert %x", d.Name(), applied, inOrder)
			}
			// The reference, fed the same record-only sends, decides as
			// the record does.
			var ref refKey
			for _, snd := range sends {
				ref.decide(d, snd.at, Item{Cost: snd.cost, Mode: RecordOnly})
			}
			var s Scratch
			for _, dt := range []int64{0, 1, 99, 400, 1000, 1500} {
				for _, cost := range []int{1, 3} {
					want, _ := ref.decide(d, last+dt, Item{Cost: cost, Mode: Peek}) // a peek changes nothing
					var got Decision
					if _, err := d.Apply(&s, inOrder, 3, last+dt, Item{Cost: cost, Mode: Peek}, &got); err != nil || got != want {
						t.Fatalf("%s: peek cost %d at +%d after %v: %v\n got %+v\nwant %+v", d.Name(), cost, dt, sends, err, got, want)
					}
				}
			}

			anyOrder := insertCosts(t, d, shuffled)
			if d == counters && !bytes.Equal(anyOrder, inOrder) {
				t.Fatalf("%s: order %v gives %x, time order %x", d.Name(), shuffled, anyOrder, inOrder)
			}
			a, b := peekAll(t, d, anyOrder, last), peekAll(t, d, inOrder, last)
			for j := range a {
				for r := range d.NumRules() {
					if a[j].Rules[r].Remaining > b[j].Rules[r].Remaining {
						t.Fatalf("%s: order %v, peek %d rule %d: remaining %d, in time order %d", d.Name(), shuffled, j, r, a[j].Rules[r].Remaining, b[j].Rules[r].Remaining)
					}
				}
			}

			var half []costSend
			for i, snd := range sends {
				if i%2 == 0 {
					half = append(half, snd)
				}
			}
			h := insertCosts(t, d, half)
			if m := merge(t, d, h, inOrder); !bytes.Equal(m, inOrder) {
				t.Fatalf("%s: merge of every other send and all = %x, want %x", d.Name(), m, inOrder)
			}

			k := len(sends) - 1
			refunded, _, emptied, err := d.Remove(&s, inOrder, 3, sends[k].at, Item{Cost: sends[k].cost})
			if err != nil {
				t.Fatal(err)
			}
			if refunded == nil && !emptied {
				refunded = inOrder
			}
			refunded = slices.Clone(refunded)
			without := insertCosts(t, d, sends[:k])
			a, b = peekAll(t, d, refunded, last), peekAll(t, d, without, last)
			for j := range a {
				for r := range d.NumRules() {
					ra, rb := a[j].Rules[r], b[j].Rules[r]
					if ra.Remaining > rb.Remaining || d == counters && ra != rb {
						t.Fatalf("%s: refund of %+v from %v, peek %d rule %d: %+v, without the send %+v", d.Name(), sends[k], sends, j, r, ra, rb)
					}
				}
			}
		}
	})
}
