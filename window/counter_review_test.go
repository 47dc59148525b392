package window

import (
	"errors"
	"testing"
	"time"
)

// TestSlidingCounterIdleGapStaysSmall: a send after a long idle spell, an
// old replayed send and a merge across a long gap write at most the rule's
// sub-windows, not a zero per idle sub-window.
func TestSlidingCounterIdleGapStaysSmall(t *testing.T) {
	d, _ := NewDomain("d", []Rule{{Name: "sc", Scope: ScopeRecipient, Limit: 10, Window: time.Second, Algorithm: SlidingCounter, Buckets: 1000}})
	var s Scratch
	var dec Decision
	const day = 86_400_000
	rec, _ := d.Apply(&s, nil, 1, t0, Item{}, &dec)
	rec = append([]byte(nil), rec...)
	late, err := d.Apply(&s, rec, 1, t0+3*day, Item{}, &dec)
	if err != nil || cap(s.cbuf) > 2000 || len(late) > 64 {
		t.Fatalf("after an idle gap: %v, %d values buffered, %d bytes", err, cap(s.cbuf), len(late))
	}
	late = append([]byte(nil), late...)
	if _, err := d.Insert(&s, late, 1, t0, Item{}); err != nil || cap(s.cbuf) > 2000 {
		t.Fatalf("old replayed send: %v, %d values buffered", err, cap(s.cbuf))
	}
	if _, err := d.Merge(&s, rec, late); err != nil || cap(s.cbuf) > 2000 {
		t.Fatalf("merge across a gap: %v, %d values buffered", err, cap(s.cbuf))
	}
}

// TestBucketCapacityLoweredByReload: a state kept across a reload that
// lowers the capacity reads as a full bucket of the new capacity, so it
// drains within the new domain's Longest (the sweeper's horizon).
func TestBucketCapacityLoweredByReload(t *testing.T) {
	old, _ := NewDomain("d", []Rule{{Name: "tb", Scope: ScopeRecipient, Limit: 10, Window: time.Hour, Algorithm: TokenBucket, Capacity: 100}})
	nw, _ := NewDomain("d", []Rule{{Name: "tb", Scope: ScopeRecipient, Limit: 10, Window: time.Hour, Algorithm: TokenBucket, Capacity: 10}})
	var s Scratch
	var dec Decision
	rec, _ := old.Apply(&s, nil, 1, t0, Item{Cost: 100}, &dec)
	rec = append([]byte(nil), rec...)
	if nw.Apply(&s, rec, 1, t0, Item{Mode: Peek}, &dec); dec.Admitted || dec.Rules[0].Used != 10 || dec.RetryAfter != 360_000 {
		t.Fatalf("right after the reload: %+v, want a full bucket of 10 (a send in 6 minutes)", dec.Rules[0])
	}
	if nw.Apply(&s, rec, 1, t0+nw.Longest(), Item{Mode: Peek}, &dec); !dec.Admitted || dec.Rules[0].Used != 0 {
		t.Fatalf("at the new Longest: %+v, want empty", dec.Rules[0])
	}
}

// TestMisalignedCounterStatesAreRefused: states that do not fit their rule
// (which the encoder never writes) fail as corrupt, rather than admitting.
func TestMisalignedCounterStatesAreRefused(t *testing.T) {
	d, _ := NewDomain("d", []Rule{
		{Name: "fw", Scope: ScopeRecipient, Limit: 3, Window: time.Minute, Algorithm: FixedWindow},
		{Name: "sc", Scope: ScopeRecipient, Limit: 3, Window: time.Minute, Algorithm: SlidingCounter, Buckets: 6},
	})
	for i, vals := range [][]int64{{t0 + 5, 1}, nil} {
		var st state
		st.reset(1)
		st.newest = t0 + 10
		if vals != nil {
			st.setCounter(&d.counters[0], vals)
		} else {
			st.setCounter(&d.counters[1], []int64{t0 + 7, 1, 1})
		}
		rec := st.encode(nil)
		var s Scratch
		var dec Decision
		if _, err := d.Apply(&s, rec, 1, t0+20, Item{}, &dec); !errors.Is(err, ErrCorruptRecord) {
			t.Fatalf("case %d: Apply = %v, want ErrCorruptRecord", i, err)
		}
	}
}
