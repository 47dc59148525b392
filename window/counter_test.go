package window

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// step is one Apply of a boundary case: at t0+at, of cost (0 means 1), in mode.
type step struct {
	at   int64
	cost int
	mode Mode
}

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestCounterBoundaries pins each algorithm at its edges with hand-computed
// answers: the last step's admission, exact retry-after, used and remaining.
func TestCounterBoundaries(t *testing.T) {
	const month = 31 * 24 * time.Hour
	for _, tc := range []struct {
		name            string
		rule            Rule
		steps           []step // all but the last must be admitted
		admitted        bool
		retry           int64
		used, remaining int
		invalid         bool // the last step fails with ErrInvalid
	}{
		// Token bucket of 10 refilled at 10/s: a token per 100 ms.
		{"token: 11th send waits a token", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second},
			append(repeat(10, step{0, 1, CheckAndRecord}), step{0, 1, CheckAndRecord}), false, 100, 10, 0, false},
		{"token: cost 2 waits two tokens", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second},
			append(repeat(10, step{0, 1, CheckAndRecord}), step{0, 2, CheckAndRecord}), false, 200, 10, 0, false},
		{"token: a token back after 100 ms", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second},
			append(repeat(10, step{0, 1, CheckAndRecord}), step{100, 1, CheckAndRecord}), true, 0, 10, 0, false},
		{"token: 99 ms is one short", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second},
			append(repeat(10, step{0, 1, CheckAndRecord}), step{99, 1, CheckAndRecord}), false, 1, 10, 0, false},
		// Capacity 5 below the rate: the burst is 5; cost 5 from full waits 500 ms.
		{"token: capacity is the burst", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second, Capacity: 5},
			append(repeat(5, step{0, 1, CheckAndRecord}), step{0, 5, CheckAndRecord}), false, 500, 5, 0, false},
		{"token: cost above capacity", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second, Capacity: 5},
			[]step{{0, 6, CheckAndRecord}}, false, 0, 0, 0, true},
		{"token: cost at capacity from empty", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second, Capacity: 5},
			[]step{{0, 5, CheckAndRecord}}, true, 0, 5, 0, false},
		// GCRA 5/s (T = 200 ms), capacity 1: strict pacing, a send every 200 ms.
		{"gcra: paced at T", Rule{Algorithm: GCRA, Limit: 5, Window: time.Second, Capacity: 1},
			[]step{{0, 1, CheckAndRecord}, {150, 1, CheckAndRecord}}, false, 50, 1, 0, false},
		{"gcra: admitted at TAT", Rule{Algorithm: GCRA, Limit: 5, Window: time.Second, Capacity: 1},
			[]step{{0, 1, CheckAndRecord}, {200, 1, CheckAndRecord}}, true, 0, 1, 0, false},
		{"gcra: half drained reads as one used", Rule{Algorithm: GCRA, Limit: 5, Window: time.Second, Capacity: 3},
			[]step{{0, 1, CheckAndRecord}, {100, 1, Peek}}, true, 0, 1, 2, false},
		// Leaky bucket 3/s, capacity 3: a send leaks in 333.3 ms; the 4th waits ceil = 334 ms.
		{"leaky: 4th send waits 334 ms", Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second},
			append(repeat(3, step{0, 1, CheckAndRecord}), step{0, 1, CheckAndRecord}), false, 334, 3, 0, false},
		{"leaky: 333 ms is 1 ms short", Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second},
			append(repeat(3, step{0, 1, CheckAndRecord}), step{333, 1, CheckAndRecord}), false, 1, 3, 0, false},
		{"leaky: 334 ms admits", Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second},
			append(repeat(3, step{0, 1, CheckAndRecord}), step{334, 1, CheckAndRecord}), true, 0, 3, 0, false},
		// Fixed window 3/s aligned to the epoch (t0 is a whole second).
		{"fixed: full until the window ends", Rule{Algorithm: FixedWindow, Limit: 3, Window: time.Second},
			append(repeat(3, step{990, 1, CheckAndRecord}), step{999, 1, CheckAndRecord}), false, 1, 3, 0, false},
		{"fixed: next window starts empty", Rule{Algorithm: FixedWindow, Limit: 3, Window: time.Second},
			append(repeat(3, step{990, 1, CheckAndRecord}), step{1000, 1, CheckAndRecord}), true, 0, 1, 2, false},
		{"fixed: cost at the limit, then 1 more", Rule{Algorithm: FixedWindow, Limit: 3, Window: time.Second},
			[]step{{10, 3, CheckAndRecord}, {10, 1, CheckAndRecord}}, false, 990, 3, 0, false},
		{"fixed: cost above the limit", Rule{Algorithm: FixedWindow, Limit: 3, Window: time.Second},
			[]step{{10, 4, CheckAndRecord}}, false, 0, 0, 0, true},
		// Sliding counter 4/s in 10 sub-windows of 100 ms: sends at +50 and +450
		// (2 each). The sub-window [0, 100) counts until 99+1000 = 1099.
		{"counter: full", Rule{Algorithm: SlidingCounter, Limit: 4, Window: time.Second, Buckets: 10},
			[]step{{50, 2, CheckAndRecord}, {450, 2, CheckAndRecord}, {1049, 1, CheckAndRecord}}, false, 50, 4, 0, false},
		// At +1060 the exact window (60, 1060] holds only the 2 sends at +450,
		// but the sub-window of +50 still overlaps it: the counter denies early.
		{"counter: denies early, never late", Rule{Algorithm: SlidingCounter, Limit: 4, Window: time.Second, Buckets: 10},
			[]step{{50, 2, CheckAndRecord}, {450, 2, CheckAndRecord}, {1060, 1, CheckAndRecord}}, false, 39, 4, 0, false},
		{"counter: the sub-window leaves at 1099", Rule{Algorithm: SlidingCounter, Limit: 4, Window: time.Second, Buckets: 10},
			[]step{{50, 2, CheckAndRecord}, {450, 2, CheckAndRecord}, {1099, 1, CheckAndRecord}}, true, 0, 3, 1, false},
		// Large limits: a million per second filled by record-only sends of
		// cost 1000, then exactly the millionth admitted, then one denied
		// until the first sub-window (100 ms) leaves: 99+1000 ms.
		{"counter: 1,000,000 per second", Rule{Algorithm: SlidingCounter, Limit: 1_000_000, Window: time.Second, Buckets: 10},
			append(append(repeat(999, step{0, 1000, RecordOnly}), step{0, 1000, CheckAndRecord}), step{0, 1, CheckAndRecord}), false, 1099, 1_000_000, 0, false},
		// Ten million per 31 days: one send drains in 2,678,400,000/10^7 =
		// 267.84 ms, so a send over a full bucket waits 268 ms.
		{"token: 10,000,000 per 31 days", Rule{Algorithm: TokenBucket, Limit: MaxCounterLimit, Window: month},
			append(append(repeat(9999, step{0, 1000, RecordOnly}), step{0, 1000, CheckAndRecord}), step{0, 1, CheckAndRecord}), false, 268, MaxCounterLimit, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.rule
			r.Name, r.Scope = "r", ScopeRecipient
			h := newHarness(t, r)
			last := len(tc.steps) - 1
			for _, s := range tc.steps[:last] {
				if d := h.apply(t0+s.at, Item{Cost: s.cost, Mode: s.mode}); !d.Admitted {
					t.Fatalf("step %+v denied: %+v", s, d.Rules[0])
				}
			}
			s := tc.steps[last]
			var dec Decision
			out, err := h.d.Apply(&h.s, h.rec, 7, t0+s.at, Item{Cost: s.cost, Mode: s.mode}, &dec)
			if tc.invalid {
				if !errors.Is(err, ErrInvalid) || out != nil {
					t.Fatalf("Apply = %x, %v; want ErrInvalid and nothing recorded", out, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := dec.Rules[0]
			if dec.Admitted != tc.admitted || dec.RetryAfter != tc.retry || got.Used != tc.used || got.Remaining != tc.remaining {
				t.Fatalf("admitted %v retry %d used %d remaining %d; want %v %d %d %d", dec.Admitted, dec.RetryAfter, got.Used, got.Remaining, tc.admitted, tc.retry, tc.used, tc.remaining)
			}
		})
	}
}

// TestMixedDomainIsAtomic: a send that one rule denies is recorded in no
// rule's state, whatever their algorithms.
func TestMixedDomainIsAtomic(t *testing.T) {
	h := newHarness(t,
		Rule{Name: "log", Scope: ScopeRecipient, Limit: 100, Window: time.Minute},
		Rule{Name: "counter", Scope: ScopeRecipient, Algorithm: SlidingCounter, Limit: 1000, Window: time.Hour},
		Rule{Name: "bucket", Scope: ScopeRecipient, Algorithm: GCRA, Limit: 3, Window: time.Second},
		Rule{Name: "fixed", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 1000, Window: time.Hour},
	)
	for range 3 {
		h.send(t0)
	}
	before := h.apply(t0, Item{Mode: Peek})
	if d := h.send(t0); d.Admitted || d.DeniedBy != 2 {
		t.Fatalf("4th send: admitted %v denied by %d, want denied by the bucket", d.Admitted, d.DeniedBy)
	}
	if after := h.apply(t0, Item{Mode: Peek}); after.Rules != before.Rules {
		t.Fatalf("a denied send changed the rules' states:\nbefore %+v\n after %+v", before.Rules, after.Rules)
	}
	if before.Rules[0].Used != 3 || before.Rules[1].Used != 3 || before.Rules[3].Used != 3 {
		t.Fatalf("used %+v, want 3 in every counting rule", before.Rules)
	}
}

// FuzzApplyCounters drives a domain of every algorithm from fuzz bytes (an
// op per 4 bytes: clock step, cost, mode) against the brute-force reference.
func FuzzApplyCounters(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("the quick brown fox jumps over the lazy dog, twice over"))
	d, err := NewDomain("fuzz", []Rule{
		{Name: "log", Scope: ScopeRecipient, Limit: 6, Window: 900 * time.Millisecond},
		{Name: "counter", Scope: ScopeRecipient, Algorithm: SlidingCounter, Limit: 9, Window: 1200 * time.Millisecond, Buckets: 4},
		{Name: "token", Scope: ScopeRecipient, Algorithm: TokenBucket, Limit: 7, Window: time.Second, Capacity: 4},
		{Name: "funnel", Scope: ScopeRecipient, Algorithm: LeakyBucket, Limit: 3, Window: 700 * time.Millisecond},
		{Name: "gcra", Scope: ScopeRecipient, Algorithm: GCRA, Limit: 11, Window: 1300 * time.Millisecond, Capacity: 5, Shadow: true},
		{Name: "fixed", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 8, Window: 1100 * time.Millisecond},
		{Name: "borrow", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Window: 400 * time.Millisecond, Borrow: 7},
	})
	if err != nil {
		f.Fatal(err)
	}
	// Costs of 3, 100 ms apart, some record-only: the borrowing rule runs
	// into debt, then repays it.
	f.Add([]byte{55, 2, 0, 0, 55, 2, 2, 0, 55, 2, 0, 0, 55, 2, 2, 0, 55, 2, 0, 0, 55, 0, 0, 0, 55, 2, 0, 0, 100, 2, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var (
			s   Scratch
			rec []byte
			ref refKey
			now = t0
		)
		for i := 0; i+4 <= len(ops); i += 4 {
			op := ops[i : i+4]
			now = max(0, now+int64(op[0])*20-1000+int64(op[3]>>4)*100) // back up to 1 s, forward up to 5.6 s
			it := Item{Cost: 1 + int(op[1]%5), Mode: Mode(op[2] % 3)}
			stepReference(t, d, &s, &rec, 0, &ref, now, it, func() string { return fmt.Sprintf("op %d", i/4) })
		}
	})
}
