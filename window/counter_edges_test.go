package window

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"
)

// Boundary tables of the counting algorithms, one test per concern, each
// with a row per algorithm. Times are offsets from t0, which is a whole
// multiple of 10 s (t0 mod 60,000 = 20,000 and t0 mod 3,600,000 = 800,000:
// the rows that need those say so). Every expectation is worked out by hand
// from the definitions in the doc comment of Algorithm.

// edgeRule returns r as a recipient rule named "r".
func edgeRule(r Rule) Rule {
	r.Name, r.Scope = "r", ScopeRecipient
	return r
}

// play applies every step but the last, which must all be admitted (or
// recorded, for RecordOnly), and returns the last step's decision and
// record bytes.
func play(t *testing.T, h *harness, steps []step) (Decision, []byte, error) {
	t.Helper()
	last := len(steps) - 1
	for i, s := range steps[:last] {
		d := h.apply(t0+s.at, Item{Cost: s.cost, Mode: s.mode})
		if !d.Admitted || (s.mode != Peek && !d.Recorded) {
			t.Fatalf("step %d %+v: not admitted and recorded: %+v", i, s, d.Rules[:d.NumRules])
		}
	}
	s := steps[last]
	var dec Decision
	out, err := h.d.Apply(&h.s, h.rec, 7, t0+s.at, Item{Cost: s.cost, Mode: s.mode}, &dec)
	return dec, out, err
}

// TestCounterRetryAfterEdge: the retry-after of a denied send, exact to the
// ms, one ms before the edge and at the edge.
func TestCounterRetryAfterEdge(t *testing.T) {
	tb := Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second} // a token per 100 ms, capacity 10
	lb := Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second}  // leaks a send per 333.3 ms, capacity 3
	gc := Rule{Algorithm: GCRA, Limit: 4, Window: time.Second}         // T = 250 ms, burst 4
	fw := Rule{Algorithm: FixedWindow, Limit: 3, Window: 10 * time.Second}
	sc := Rule{Algorithm: SlidingCounter, Limit: 4, Window: time.Second, Buckets: 10} // sub-windows of 100 ms
	sl := Rule{Algorithm: SlidingLog, Limit: 3, Window: time.Second}
	for _, tc := range []struct {
		name     string
		rule     Rule
		steps    []step // the last is decided
		admitted bool
		retry    int64
	}{
		// 10 sends at 0: D = 10 = capacity. Cost 1 needs D <= 9: 1 send drains in 1000/10 = 100 ms.
		{"token cost 1", tb, append(repeat(10, step{0, 1, 0}), step{0, 1, 0}), false, 100},
		// Cost 2 needs D <= 8: 2 sends drain in 200 ms.
		{"token cost 2", tb, append(repeat(10, step{0, 1, 0}), step{0, 2, 0}), false, 200},
		// At +99: D = 10 - 0.99 = 9.01; 9.01+1-10 = 0.01 send = 1 ms.
		{"token cost 1 at +99", tb, append(repeat(10, step{0, 1, 0}), step{99, 1, 0}), false, 1},
		// At +100: D = 9, 9+1 <= 10.
		{"token cost 1 at +100", tb, append(repeat(10, step{0, 1, 0}), step{100, 1, 0}), true, 0},
		// At +150 cost 2: D = 8.5, 8.5+2-10 = 0.5 send = 50 ms.
		{"token cost 2 at +150", tb, append(repeat(10, step{0, 1, 0}), step{150, 2, 0}), false, 50},
		// 3 sends at 0: D = 3. Cost 1: 1 send drains in ceil(1000/3) = ceil(333.33) = 334 ms.
		{"leaky cost 1", lb, append(repeat(3, step{0, 1, 0}), step{0, 1, 0}), false, 334},
		// Cost 2: 2 sends drain in ceil(2000/3) = ceil(666.67) = 667 ms.
		{"leaky cost 2", lb, append(repeat(3, step{0, 1, 0}), step{0, 2, 0}), false, 667},
		// At +666 cost 2: D = 3 - 666*3/1000 = 1.002; 1.002+2-3 = 0.002 send = 0.67 ms -> 1.
		{"leaky cost 2 at +666", lb, append(repeat(3, step{0, 1, 0}), step{666, 2, 0}), false, 1},
		// At +667 cost 2: D = 3 - 2.001 = 0.999, 0.999+2 <= 3.
		{"leaky cost 2 at +667", lb, append(repeat(3, step{0, 1, 0}), step{667, 2, 0}), true, 0},
		// 4 sends at 0: TAT = 0+4*250 = 1000. Cost 3 admits when TAT-t <= (4-3)*250: t = 750.
		{"gcra cost 3", gc, append(repeat(4, step{0, 1, 0}), step{0, 3, 0}), false, 750},
		{"gcra cost 3 at +749", gc, append(repeat(4, step{0, 1, 0}), step{749, 3, 0}), false, 1},
		{"gcra cost 3 at +750", gc, append(repeat(4, step{0, 1, 0}), step{750, 3, 0}), true, 0},
		// Cost 4 (the burst) waits for an empty bucket: TAT 1000 -> 1000 ms.
		{"gcra cost 4 (the burst)", gc, append(repeat(4, step{0, 1, 0}), step{0, 4, 0}), false, 1000},
		// 3 sends at +2500 in the window [0, 10000): retry = 10000 - 7300 = 2700.
		{"fixed at +7300", fw, append(repeat(3, step{2500, 1, 0}), step{7300, 1, 0}), false, 2700},
		// At +9999: 10000 - 9999 = 1.
		{"fixed at +9999", fw, append(repeat(3, step{2500, 1, 0}), step{9999, 1, 0}), false, 1},
		// At +10000 the next window starts empty.
		{"fixed at +10000", fw, append(repeat(3, step{2500, 1, 0}), step{10000, 1, 0}), true, 0},
		// The retry does not depend on the cost: any cost <= limit fits a new window. 10000 - 2500.
		{"fixed cost 3 at +2500", fw, append(repeat(3, step{2500, 1, 0}), step{2500, 3, 0}), false, 7500},
		// 2 sends at +50 (sub-window [0,100), leaves at 0+100-1+1000 = 1099) and 2 at +450
		// ([400,500), leaves at 1499). At +1049 cost 1: 4+1 > 4 until 1099: 1099-1049 = 50.
		{"counter cost 1 at +1049", sc, []step{{50, 2, 0}, {450, 2, 0}, {1049, 1, 0}}, false, 50},
		// At +1098: 1 ms before the oldest sub-window leaves.
		{"counter cost 1 at +1098", sc, []step{{50, 2, 0}, {450, 2, 0}, {1098, 1, 0}}, false, 1},
		{"counter cost 1 at +1099", sc, []step{{50, 2, 0}, {450, 2, 0}, {1099, 1, 0}}, true, 0},
		// Cost 3 at +1100: estimate 2 (from [400,500)), 2+3 > 4 until 1499: 1499-1100 = 399.
		{"counter cost 3 at +1100", sc, []step{{50, 2, 0}, {450, 2, 0}, {1100, 3, 0}}, false, 399},
		// Cost 3 at +1049: the first sub-window leaves at 1099 (estimate 2, 2+3 > 4), the second at 1499: 450.
		{"counter cost 3 at +1049", sc, []step{{50, 2, 0}, {450, 2, 0}, {1049, 3, 0}}, false, 450},
		// One sub-window of the whole window: sends at +10 count until 0+1000-1+1000 = 1999; at +1500: 499.
		{"counter one bucket", Rule{Algorithm: SlidingCounter, Limit: 4, Window: time.Second, Buckets: 1},
			[]step{{10, 4, 0}, {1500, 1, 0}}, false, 499},
		// Sliding log, for comparison: sends at 0, 100, 200; the oldest leaves at 1000: 1000-500.
		{"log cost 1 at +500", sl, []step{{0, 1, 0}, {100, 1, 0}, {200, 1, 0}, {500, 1, 0}}, false, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, edgeRule(tc.rule))
			dec, _, err := play(t, h, tc.steps)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Admitted != tc.admitted || dec.RetryAfter != tc.retry || dec.Rules[0].RetryAfter != tc.retry {
				t.Fatalf("admitted %v retry %d (rule %+v); want %v %d", dec.Admitted, dec.RetryAfter, dec.Rules[0], tc.admitted, tc.retry)
			}
			if !tc.admitted && dec.DeniedBy != 0 {
				t.Fatalf("denied by %d, want 0", dec.DeniedBy)
			}
		})
	}
}

// TestCounterCostAtAndAboveTheLimit: a cost equal to the limit (the
// capacity, for a bucket) is admitted from empty; one more is ErrInvalid,
// from empty and from a used record, and records nothing.
func TestCounterCostAtAndAboveTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule Rule
		most int // the largest cost ever admitted
	}{
		{"sliding-log", Rule{Algorithm: SlidingLog, Limit: 7, Window: time.Second}, 7},
		{"sliding-counter", Rule{Algorithm: SlidingCounter, Limit: 7, Window: time.Second, Buckets: 4}, 7},
		{"fixed-window", Rule{Algorithm: FixedWindow, Limit: 7, Window: time.Second}, 7},
		{"token-bucket", Rule{Algorithm: TokenBucket, Limit: 7, Window: time.Second}, 7},
		{"leaky-bucket", Rule{Algorithm: LeakyBucket, Limit: 7, Window: time.Second}, 7},
		{"gcra", Rule{Algorithm: GCRA, Limit: 7, Window: time.Second}, 7},
		// A capacity below the limit caps the cost: 5 < 7.
		{"token-bucket capacity 5", Rule{Algorithm: TokenBucket, Limit: 7, Window: time.Second, Capacity: 5}, 5},
		// A capacity above the limit allows a cost above the limit: 12 > 7.
		{"gcra capacity 12", Rule{Algorithm: GCRA, Limit: 7, Window: time.Second, Capacity: 12}, 12},
		{"leaky-bucket capacity 1", Rule{Algorithm: LeakyBucket, Limit: 7, Window: time.Second, Capacity: 1}, 1},
		{"sliding-counter limit 1000", Rule{Algorithm: SlidingCounter, Limit: MaxCost, Window: time.Hour}, MaxCost},
		{"fixed-window limit 1000", Rule{Algorithm: FixedWindow, Limit: MaxCost, Window: time.Hour}, MaxCost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, edgeRule(tc.rule))
			var dec Decision
			// Above, from empty.
			if out, err := h.d.Apply(&h.s, nil, 7, t0, Item{Cost: tc.most + 1}, &dec); !errors.Is(err, ErrInvalid) || out != nil {
				t.Fatalf("cost %d from empty: %x, %v; want ErrInvalid", tc.most+1, out, err)
			}
			// At, from empty: admitted, everything used.
			d := h.apply(t0, Item{Cost: tc.most})
			if !d.Admitted || !d.Recorded || d.Rules[0].Used != tc.most || d.Rules[0].Remaining != 0 {
				t.Fatalf("cost %d from empty: %+v, want admitted, used %d, remaining 0", tc.most, d, tc.most)
			}
			// Above, from a used record (later, so something has drained): nothing recorded.
			before := h.apply(t0+400, Item{Mode: Peek})
			rec := slices.Clone(h.rec)
			// (RecordOnly is not checked: it records any cost, see
			// TestCounterUsedRemainingAfterAdmit.)
			for _, mode := range []Mode{CheckAndRecord, Peek} {
				out, err := h.d.Apply(&h.s, h.rec, 7, t0+400, Item{Cost: tc.most + 1, Mode: mode}, &dec)
				if !errors.Is(err, ErrInvalid) || out != nil {
					t.Fatalf("%v cost %d: %x, %v; want ErrInvalid", mode, tc.most+1, out, err)
				}
			}
			if after := h.apply(t0+400, Item{Mode: Peek}); after.Rules != before.Rules || !bytes.Equal(h.rec, rec) {
				t.Fatalf("an invalid cost changed the record: before %+v after %+v", before.Rules[0], after.Rules[0])
			}
		})
	}
}

// TestCounterUsedRemainingAfterAdmit: Used and Remaining in the decision of
// an admitted send are the state after it is recorded. Record-only sends
// are not checked, whatever their cost.
func TestCounterUsedRemainingAfterAdmit(t *testing.T) {
	for _, tc := range []struct {
		name            string
		rule            Rule
		steps           []step // the last is decided, and admitted
		used, remaining int
	}{
		// 3+4 = 7 of 10.
		{"log", Rule{Algorithm: SlidingLog, Limit: 10, Window: time.Second}, []step{{0, 3, 0}, {0, 4, 0}}, 7, 3},
		// D = 4 at 0; at +150 D = 4-1.5 = 2.5, +1 = 3.5: used ceil = 4, remaining floor(10-3.5) = 6.
		{"token partly drained", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second}, []step{{0, 4, 0}, {150, 1, 0}}, 4, 6},
		// D = 2 at 0; at +100 D = 2-0.3 = 1.7, +1 = 2.7: used 3, remaining floor(0.3) = 0.
		{"leaky partly drained", Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second}, []step{{0, 2, 0}, {100, 1, 0}}, 3, 0},
		// A peek at +100 of the same: D = 1.7: used 2, remaining floor(1.3) = 1.
		{"leaky peek", Rule{Algorithm: LeakyBucket, Limit: 3, Window: time.Second}, []step{{0, 2, 0}, {100, 1, Peek}}, 2, 1},
		// GCRA 4/s capacity 8: D = 6 at 0; at +500 D = 6-2 = 4, +2 = 6: used 6, remaining 2.
		{"gcra capacity above limit", Rule{Algorithm: GCRA, Limit: 4, Window: time.Second, Capacity: 8}, []step{{0, 6, 0}, {500, 2, 0}}, 6, 2},
		// Fully drained: D = 1 at 0, 0 at +250; +1 = 1: used 1, remaining 3.
		{"gcra drained", Rule{Algorithm: GCRA, Limit: 4, Window: time.Second}, []step{{0, 1, 0}, {250, 1, 0}}, 1, 3},
		// Window [0, 1000) holds 3, the next starts at 1000: 2 of 10.
		{"fixed new window", Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Second}, []step{{900, 3, 0}, {1000, 2, 0}}, 2, 8},
		{"fixed same window", Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Second}, []step{{0, 3, 0}, {999, 2, 0}}, 5, 5},
		// 3 in [0,100), counted until 1099: at +1098, 3+2 = 5 of 10.
		{"counter oldest still counted", Rule{Algorithm: SlidingCounter, Limit: 10, Window: time.Second, Buckets: 10}, []step{{50, 3, 0}, {1098, 2, 0}}, 5, 5},
		// At +1099 it has left: 2 of 10.
		{"counter oldest left", Rule{Algorithm: SlidingCounter, Limit: 10, Window: time.Second, Buckets: 10}, []step{{50, 3, 0}, {1099, 2, 0}}, 2, 8},
		// Record-only sends beyond the limit: the counters count them all (12 of 10,
		// remaining 0); a bucket keeps at most its capacity (used 10).
		{"counter record-only beyond", Rule{Algorithm: SlidingCounter, Limit: 10, Window: time.Second, Buckets: 10}, []step{{0, 8, 0}, {0, 4, RecordOnly}}, 12, 0},
		{"fixed record-only beyond", Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Second}, []step{{0, 8, 0}, {0, 4, RecordOnly}}, 12, 0},
		{"token record-only beyond", Rule{Algorithm: TokenBucket, Limit: 10, Window: time.Second}, []step{{0, 8, 0}, {0, 4, RecordOnly}}, 10, 0},
		// A single record-only cost above the limit: recorded, not ErrInvalid (5 of 3; a bucket full at 3).
		{"fixed record-only cost above the limit", Rule{Algorithm: FixedWindow, Limit: 3, Window: time.Second}, []step{{0, 5, RecordOnly}}, 5, 0},
		{"gcra record-only cost above the capacity", Rule{Algorithm: GCRA, Limit: 3, Window: time.Second}, []step{{0, 5, RecordOnly}}, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, edgeRule(tc.rule))
			dec, _, err := play(t, h, tc.steps)
			if err != nil {
				t.Fatal(err)
			}
			mode := tc.steps[len(tc.steps)-1].mode
			if !dec.Admitted || dec.Recorded != (mode != Peek) || dec.Rules[0].Used != tc.used || dec.Rules[0].Remaining != tc.remaining {
				t.Fatalf("%+v rule %+v; want admitted, used %d remaining %d", dec, dec.Rules[0], tc.used, tc.remaining)
			}
		})
	}
}

// TestCounterLargeLimits fills rules of 1,000,000 and 10,000,000 with
// record-only sends of cost MaxCost (1000) up to limit-1000, admits a last
// cost of 1000 exactly at the limit, and denies one more with the exact
// retry-after.
func TestCounterLargeLimits(t *testing.T) {
	const hour = time.Hour
	for _, tc := range []struct {
		name  string
		rule  Rule
		at    int64 // every send
		retry int64 // of a send of cost 1 once full
	}{
		// Sub-windows of 60,000 ms; t0 mod 60,000 = 20,000, so the sends' sub-window
		// starts at -20,000 and leaves at -20,000+60,000-1+3,600,000 = 3,639,999.
		{"sliding-counter 10,000,000/hour", Rule{Algorithm: SlidingCounter, Limit: MaxCounterLimit, Window: hour}, 0, 3_639_999},
		// Sub-windows of 100 ms: [0,100) leaves at 99+1000 = 1099; from +30: 1069.
		{"sliding-counter 1,000,000/s", Rule{Algorithm: SlidingCounter, Limit: 1_000_000, Window: time.Second, Buckets: 10}, 30, 1069},
		// t0 mod 3,600,000 = 800,000: the window ends 2,800,000 ms after t0.
		{"fixed-window 10,000,000/hour", Rule{Algorithm: FixedWindow, Limit: MaxCounterLimit, Window: hour}, 0, 2_800_000},
		// [0, 10,000) from +1234: 8766.
		{"fixed-window 1,000,000/10s", Rule{Algorithm: FixedWindow, Limit: 1_000_000, Window: 10 * time.Second}, 1234, 8766},
		// A send drains in 1000/10^6 = 0.001 ms: 1 ms.
		{"token-bucket 1,000,000/s", Rule{Algorithm: TokenBucket, Limit: 1_000_000, Window: time.Second}, 0, 1},
		// A send drains in 3,600,000/10^7 = 0.36 ms: ceil = 1.
		{"leaky-bucket 10,000,000/hour", Rule{Algorithm: LeakyBucket, Limit: MaxCounterLimit, Window: hour}, 0, 1},
		// T = 3,600,000/10^6 = 3.6 ms: ceil = 4.
		{"gcra 1,000,000/hour", Rule{Algorithm: GCRA, Limit: 1_000_000, Window: hour}, 0, 4},
		// T = 31*86,400,000/10^7 = 267.84 ms: ceil = 268.
		{"gcra 10,000,000/31 days", Rule{Algorithm: GCRA, Limit: MaxCounterLimit, Window: 31 * 24 * hour}, 0, 268},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, edgeRule(tc.rule))
			lim := tc.rule.Limit
			steps := repeat(lim/MaxCost-1, step{tc.at, MaxCost, RecordOnly})
			steps = append(steps, step{tc.at, MaxCost, Peek}) // decided below
			if _, _, err := play(t, h, steps); err != nil {
				t.Fatal(err)
			}
			p := h.apply(t0+tc.at, Item{Mode: Peek})
			if p.Rules[0].Used != lim-MaxCost || p.Rules[0].Remaining != MaxCost {
				t.Fatalf("filled: %+v, want used %d remaining %d", p.Rules[0], lim-MaxCost, MaxCost)
			}
			// One more than fits is denied; so is cost 1000 after cost 1 is in.
			if d := h.apply(t0+tc.at, Item{Cost: MaxCost}); !d.Admitted || d.Rules[0].Used != lim || d.Rules[0].Remaining != 0 {
				t.Fatalf("cost %d at limit-%d: %+v, want admitted at the limit", MaxCost, MaxCost, d.Rules[0])
			}
			if d := h.apply(t0+tc.at, Item{}); d.Admitted || d.RetryAfter != tc.retry || d.Rules[0].Used != lim {
				t.Fatalf("cost 1 at the limit: admitted %v retry %d %+v, want retry %d", d.Admitted, d.RetryAfter, d.Rules[0], tc.retry)
			}
			if tc.rule.Algorithm.isBucket() {
				// 1 ms later the bucket drained rate*1 ms worth; a cost of
				// that much (at most MaxCost) fits, one more does not.
				free := min(int64(lim)/tc.rule.WindowMillis(), MaxCost)
				if free >= 1 {
					if d := h.apply(t0+tc.at+1, Item{Cost: int(free), Mode: Peek}); !d.Admitted {
						t.Fatalf("cost %d 1 ms later: %+v", free, d.Rules[0])
					}
				}
			}
		})
	}
}

// TestShadowCounterRuleNeverDenies: a shadow rule of each algorithm, over
// its limit, reports what it would do (its retry-after, ShadowDeniedBy) and
// denies nothing, even a cost above its limit.
func TestShadowCounterRuleNeverDenies(t *testing.T) {
	for _, tc := range []struct {
		alg   Algorithm
		retry int64 // of the 3rd send at 0, limit 2 per second
		used  int   // after 5 sends at 0
	}{
		{SlidingLog, 1000, 5},     // the oldest leaves at 1000; the log keeps 100 (the domain's largest limit)
		{SlidingCounter, 1099, 5}, // [0,100) leaves at 99+1000
		{FixedWindow, 1000, 5},    // t0 is a whole second
		{TokenBucket, 500, 2},     // a send drains in 500 ms; full at 2
		{LeakyBucket, 500, 2},
		{GCRA, 500, 2},
	} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			r := Rule{Name: "shadow", Scope: ScopeRecipient, Algorithm: tc.alg, Limit: 2, Window: time.Second, Shadow: true}
			if tc.alg == SlidingCounter {
				r.Buckets = 10
			}
			h := newHarness(t, rule("log", ScopeRecipient, 100, time.Minute), r)
			for i := range 5 {
				d := h.send(t0)
				if !d.Admitted || !d.Recorded || d.DeniedBy != -1 || d.Rules[0].Used != i+1 {
					t.Fatalf("send %d: %+v", i, d)
				}
				wantShadow := -1
				if i >= 2 {
					wantShadow = 1
				}
				if d.ShadowDeniedBy != wantShadow {
					t.Fatalf("send %d: shadow denied by %d, want %d", i, d.ShadowDeniedBy, wantShadow)
				}
				if i == 2 && d.Rules[1].RetryAfter != tc.retry {
					t.Fatalf("3rd send: shadow retry %d, want %d", d.Rules[1].RetryAfter, tc.retry)
				}
				if i == 4 && d.Rules[1].Used != tc.used {
					t.Fatalf("5th send: shadow used %d, want %d", d.Rules[1].Used, tc.used)
				}
			}
			// A cost above the shadow's limit: admitted, the shadow would never admit it.
			d := h.apply(t0+1, Item{Cost: 3})
			if !d.Admitted || !d.Recorded || d.ShadowDeniedBy != 1 || d.Rules[1].RetryAfter != -1 {
				t.Fatalf("cost 3 over a shadow of limit 2: %+v", d)
			}
		})
	}
}

// TestMixedDomainEachRuleDeniesAtomically: in a domain of all six
// algorithms, each rule in turn is the one at its limit; its denial, and a
// cost beyond its limit, record nothing in any rule.
func TestMixedDomainEachRuleDeniesAtomically(t *testing.T) {
	for tight := SlidingLog; tight <= FixedWindow; tight++ {
		t.Run(tight.String(), func(t *testing.T) {
			var rules []Rule
			for alg := SlidingLog; alg <= FixedWindow; alg++ {
				r := Rule{Name: alg.String(), Scope: ScopeRecipient, Algorithm: alg, Limit: 100, Window: time.Hour}
				if alg == tight {
					r.Limit = 2
				}
				rules = append(rules, r)
			}
			h := newHarness(t, rules...)
			h.send(t0)
			h.send(t0)
			before := h.apply(t0, Item{Mode: Peek})
			rec := slices.Clone(h.rec)
			for i := range rules {
				if before.Rules[i].Used != 2 {
					t.Fatalf("rule %s used %d after 2 sends, want 2", rules[i].Name, before.Rules[i].Used)
				}
			}
			var dec Decision
			out, err := h.d.Apply(&h.s, h.rec, 7, t0, Item{}, &dec)
			if err != nil || out != nil || dec.Admitted || dec.Recorded || dec.DeniedBy != int(tight) {
				t.Fatalf("3rd send: %x %v %+v; want denied by rule %d, nothing recorded", out, err, dec, tight)
			}
			out, err = h.d.Apply(&h.s, h.rec, 7, t0, Item{Cost: 3}, &dec)
			if !errors.Is(err, ErrInvalid) || out != nil {
				t.Fatalf("cost 3: %x %v; want ErrInvalid", out, err)
			}
			after := h.apply(t0, Item{Mode: Peek})
			if after.Rules != before.Rules || !bytes.Equal(h.rec, rec) {
				t.Fatalf("a denial changed the states:\nbefore %+v\n after %+v", before.Rules, after.Rules)
			}
			// At the denial's retry-after the tight rule admits again, and
			// every rule records the send.
			retry := before.RetryAfter
			if d := h.send(t0 + retry - 1); d.Admitted {
				t.Fatalf("admitted 1 ms before the retry-after %d", retry)
			}
			d := h.send(t0 + retry)
			if !d.Admitted {
				t.Fatalf("denied at the retry-after %d: %+v", retry, d)
			}
			for i := range rules {
				if d.Rules[i].Used < 1 {
					t.Fatalf("after a send at +%d, rule %s used %d", retry, rules[i].Name, d.Rules[i].Used)
				}
			}
		})
	}
}
