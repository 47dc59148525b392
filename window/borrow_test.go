package window

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// Borrowing fixed-window rules (Rule.Borrow): hand-computed boundaries with
// seed 004's numbers, the properties the definition promises, and the
// state's shapes. TestBorrowMatchesReference (counter_reference_test.go)
// checks random sequences against the brute-force reference.

const hourMs = int64(time.Hour / time.Millisecond)

// h0 is the first whole hour after t0 (t0 mod 3,600,000 = 800,000).
const h0 = t0 + 2_800_000

// borrowStep is one Apply at h0+at and what it must answer: admitted (not
// checked for RecordOnly), Used and Remaining after it, RetryAfter.
type borrowStep struct {
	at              int64
	cost            int
	mode            Mode
	admitted        bool
	used, remaining int
	retry           int64
	invalid         bool // fails with ErrInvalid
}

func TestBorrowBoundaries(t *testing.T) {
	const H = hourMs
	seed := Rule{Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300}
	small := Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Hour, Borrow: 30}
	for _, tc := range []struct {
		name  string
		rule  Rule
		steps []borrowStep
	}{
		// Seed 004: 1000 an hour, borrowing up to 300. Hour 1 admits 1200
		// (owing 200), so hour 2's allowance within the limit is 800.
		{"seed 004", seed, []borrowStep{
			{at: 0, cost: 1000, admitted: true, used: 1000, remaining: 300},
			{at: 10, cost: 200, admitted: true, used: 1200, remaining: 100},
			{at: 20, cost: 101, used: 1200, remaining: 100, retry: H - 20}, // beyond 1300: the next hour
			{at: 20, cost: 100, mode: Peek, admitted: true, used: 1200, remaining: 100},
			{at: H - 1, cost: 1, mode: Peek, admitted: true, used: 1200, remaining: 100},
			{at: H, cost: 1, mode: Peek, admitted: true, used: 200, remaining: 1100}, // owing 200
			{at: H, cost: 800, admitted: true, used: 1000, remaining: 300},           // hour 2's 800
			{at: H + 1, cost: 300, admitted: true, used: 1300, remaining: 0},         // and 300 more on credit
			{at: H + 2, cost: 1, used: 1300, remaining: 0, retry: H - 2},
			{at: 2 * H, cost: 1, mode: Peek, admitted: true, used: 300, remaining: 1000}, // hour 3 owes 300: 700 within the limit
			{at: 3 * H, cost: 1, mode: Peek, admitted: true, used: 0, remaining: 1300},   // an empty hour repaid it
			{at: 3 * H, cost: 1000, admitted: true, used: 1000, remaining: 300},
		}},
		// The debt outlives empty windows only as long as it lasts: 300
		// carried out of hour 3 is repaid by the end of hour 4.
		{"seed 004: quiet hours repay", seed, []borrowStep{
			{at: 2*H + 5, cost: 1000, admitted: true, used: 1000, remaining: 300},
			{at: 2*H + 6, cost: 300, admitted: true, used: 1300, remaining: 0},
			{at: 3*H + 7, cost: 1, mode: Peek, admitted: true, used: 300, remaining: 1000},
			{at: 4*H - 1, cost: 1, mode: Peek, admitted: true, used: 300, remaining: 1000},
			{at: 4 * H, cost: 1, mode: Peek, admitted: true, used: 0, remaining: 1300},
		}},
		// 10 an hour, borrowing up to 30: a cost above the limit must wait
		// for the debt to be repaid, several hours ahead.
		{"retry several windows ahead", small, []borrowStep{
			{at: 0, cost: 40, admitted: true, used: 40, remaining: 0},
			// hour 2 owes 30, hour 3 20, hour 4 10, hour 5 0: cost 35 needs owed <= 5.
			{at: H + 100, cost: 35, used: 30, remaining: 10, retry: 3*H - 100},
			{at: H + 100, cost: 25, used: 30, remaining: 10, retry: 2*H - 100}, // owed <= 15: hour 4
			{at: H + 100, cost: 10, admitted: true, used: 40, remaining: 0},    // fits now: owes 30 again into hour 3
			{at: 2 * H, cost: 1, mode: Peek, admitted: true, used: 30, remaining: 10},
			{at: 2 * H, cost: 41, invalid: true}, // beyond limit+borrow: never
			{at: 3 * H, cost: 25, used: 20, remaining: 20, retry: H},
			{at: 4 * H, cost: 25, admitted: true, used: 35, remaining: 5}, // owes 10, plus 25
			// hour 6 owes min(30, 35-10) = 25, hour 7 15, hour 8 5: cost 35 fits at 7H.
			{at: 4*H + 1, cost: 35, used: 35, remaining: 5, retry: 3*H - 1},
		}},
		// Record-only sends beyond limit+borrow: the debt they leave is at
		// most the borrow.
		{"record-only beyond: debt capped at borrow", small, []borrowStep{
			{at: 0, cost: 40, admitted: true, used: 40, remaining: 0},
			{at: 1, cost: 1000, mode: RecordOnly, used: 1040, remaining: 0},
			{at: H, cost: 1, mode: Peek, admitted: true, used: 30, remaining: 10},
			{at: 2 * H, cost: 1, mode: Peek, admitted: true, used: 20, remaining: 20},
			{at: 4 * H, cost: 1, mode: Peek, admitted: true, used: 0, remaining: 40},
		}},
		// The largest borrow over 1 ms windows: a debt of millions of
		// windows is carried and repaid in closed form, not window by
		// window. h0 is a whole hour, so a multiple of 1 ms.
		{"a debt of millions of windows", Rule{Algorithm: FixedWindow, Limit: 1, Window: time.Millisecond, Borrow: MaxCounterLimit}, []borrowStep{
			{at: 0, cost: 1000, admitted: true, used: 1000, remaining: MaxCounterLimit - 999},
			{at: 0, cost: 1000, mode: RecordOnly, used: 2000, remaining: MaxCounterLimit - 1999},
			{at: 1, cost: 1, mode: Peek, admitted: true, used: 1999, remaining: MaxCounterLimit - 1998}, // 2000-1 carried
			{at: 1500, cost: 1, mode: Peek, admitted: true, used: 500, remaining: MaxCounterLimit - 499},
			{at: 1999, cost: 1, mode: Peek, admitted: true, used: 1, remaining: MaxCounterLimit},
			{at: 2000, cost: 1, mode: Peek, admitted: true, used: 0, remaining: MaxCounterLimit + 1},
		}},
		{"retry after millions of windows", Rule{Algorithm: FixedWindow, Limit: 1, Window: time.Millisecond, Borrow: 2500}, []borrowStep{
			{at: 0, cost: 1000, admitted: true, used: 1000, remaining: 1501},
			{at: 0, cost: 1000, admitted: true, used: 2000, remaining: 501},
			{at: 0, cost: 501, admitted: true, used: 2501, remaining: 0},
			// The next window owes 2500: cost 1000 fits once owed <= 1501,
			// 999 windows later.
			{at: 0, cost: 1000, used: 2501, remaining: 0, retry: 1000},
			{at: 1000, cost: 1000, admitted: true, used: 2501, remaining: 0},
		}},
		// Borrow 0 is today's fixed window.
		{"borrow 0", Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Hour}, []borrowStep{
			{at: 0, cost: 10, admitted: true, used: 10, remaining: 0},
			{at: 5, cost: 1, used: 10, remaining: 0, retry: H - 5},
			{at: 5, cost: 11, invalid: true},
			{at: H, cost: 1, mode: Peek, admitted: true, used: 0, remaining: 10},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, edgeRule(tc.rule))
			for i, s := range tc.steps {
				var dec Decision
				out, err := h.d.Apply(&h.s, h.rec, 7, h0+s.at, Item{Cost: s.cost, Mode: s.mode}, &dec)
				if s.invalid {
					if !errors.Is(err, ErrInvalid) || out != nil || !strings.Contains(err.Error(), "limit") {
						t.Fatalf("step %d %+v: Apply = %x, %v; want ErrInvalid naming the limit", i, s, out, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if out != nil {
					h.rec = append(h.rec[:0], out...)
				}
				r := dec.Rules[0]
				if s.mode != RecordOnly && dec.Admitted != s.admitted || r.Used != s.used || r.Remaining != s.remaining || dec.RetryAfter != s.retry {
					t.Fatalf("step %d %+v:\nadmitted %v used %d remaining %d retry %d\nwant     %v used %d remaining %d retry %d",
						i, s, dec.Admitted, r.Used, r.Remaining, dec.RetryAfter, s.admitted, s.used, s.remaining, s.retry)
				}
			}
		})
	}
}

// TestBorrowInvalidCostNamesLimitPlusBorrow: a cost beyond Limit+Borrow can
// never be admitted, and the error says so.
func TestBorrowInvalidCostNamesLimitPlusBorrow(t *testing.T) {
	h := newHarness(t, edgeRule(Rule{Algorithm: FixedWindow, Limit: 10, Window: time.Hour, Borrow: 30}))
	var dec Decision
	_, err := h.d.Apply(&h.s, nil, 7, h0, Item{Cost: 41}, &dec)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "cost 41 exceeds limit+borrow 40") {
		t.Fatalf("Apply = %v", err)
	}
}

// TestBorrowWindowsAdmitAtMostNLimitPlusBorrow: over random sequences
// (decided sends only, clock jumps), any n consecutive windows admit at
// most n*Limit+Borrow, and the debt a state stores never exceeds Borrow.
func TestBorrowWindowsAdmitAtMostNLimitPlusBorrow(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 5))
	cases := 200
	if raceEnabled {
		cases = 40
	}
	for i := range cases {
		L := 1 + rng.IntN(20)
		r := edgeRule(Rule{Algorithm: FixedWindow, Limit: L, Borrow: rng.IntN(3*L + 1), Window: time.Duration(1+rng.IntN(1000)) * time.Millisecond})
		h := newHarness(t, r)
		w, D := r.WindowMillis(), int64(r.Borrow)
		admitted := map[int64]int64{} // window index -> cost admitted
		now := t0
		for range 500 {
			switch x := rng.IntN(20); {
			case x == 0:
				now += int64(rng.IntN(int(5 * h.d.Longest())))
			default:
				now += int64(rng.IntN(int(w)))
			}
			cost := 1 + rng.IntN(min(L+r.Borrow, MaxCost))
			if d := h.apply(now, Item{Cost: cost}); d.Admitted {
				admitted[now/w] += int64(cost)
			}
			var st state
			if err := st.decode(h.rec); err != nil {
				t.Fatal(err)
			}
			if v := st.counterVals(&h.d.counters[0]); len(v) == 3 && (v[2] > D || v[2] < 1) {
				t.Fatalf("case %d rule %+v: state %v stores a debt outside [1, %d]", i, r, v, D)
			}
		}
		ks := make([]int64, 0, len(admitted))
		for k := range admitted {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		for a := range ks {
			var sum int64
			for b := a; b < len(ks); b++ {
				sum += admitted[ks[b]]
				if n := ks[b] - ks[a] + 1; sum > n*int64(L)+D {
					t.Fatalf("case %d rule %+v: windows %d..%d admit %d, more than %d*%d+%d", i, r, ks[a], ks[b], sum, n, L, D)
				}
			}
		}
	}
}

// TestBorrowZeroIsFixedWindow: the definition with D = 0 (refKey.borrowAt)
// counts exactly what a fixed window counts (refKey.count), on random sends.
func TestBorrowZeroIsFixedWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 6))
	for i := range 100 {
		r := Rule{Name: "r", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 1 + rng.IntN(10), Window: time.Duration(1+rng.IntN(500)) * time.Millisecond}
		w := r.WindowMillis()
		k := refKey{fw: map[int][]refWin{}}
		at := t0
		for range 200 {
			at += int64(rng.IntN(int(2 * w)))
			c := int64(1 + rng.IntN(15))
			k.sends = append(k.sends, refCost{at, c})
			if ws := k.fw[0]; len(ws) > 0 && ws[len(ws)-1].k == at/w {
				ws[len(ws)-1].a += c
			} else {
				k.fw[0] = append(ws, refWin{at / w, c})
			}
			for _, dt := range []int64{0, 1, w - 1, w, 3 * w} {
				owed, a := k.borrowAt(0, r, (at+dt)/w)
				if n := k.count(r, at+dt); owed != 0 || a != n {
					t.Fatalf("case %d: at +%d owed %d sends %d, fixed window counts %d", i, dt, owed, a, n)
				}
			}
		}
	}
}

// borrowRule returns the compiled rule of a one-rule domain of r.
func borrowRule(t *testing.T, r Rule) (*Domain, *counterRule) {
	t.Helper()
	d, err := NewDomain("d", []Rule{edgeRule(r)})
	if err != nil {
		t.Fatal(err)
	}
	return d, &d.counters[0]
}

// TestBorrowStateFunctions pins add, remove, merge and normalize on the
// seed's rule (1000/h, borrow 300) with hand-computed states.
func TestBorrowStateFunctions(t *testing.T) {
	const H = hourMs
	d, c := borrowRule(t, Rule{Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300})
	if want := 2 * H; d.Longest() != want || c.span() != want {
		t.Fatalf("Longest %d span %d, want %d: the window, then ceil(300/1000) windows of debt", d.Longest(), c.span(), want)
	}
	f := func(what string, got, want []int64) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}
	s := []int64{h0, 1200} // hour 1: 1200 admitted
	f("add in hour 1", c.add(nil, s, h0+5, 50), []int64{h0, 1250})
	f("add in hour 2", c.add(nil, s, h0+H+5, 10), []int64{h0 + H, 10, 200})
	f("add in hour 3", c.add(nil, s, h0+2*H, 10), []int64{h0 + 2*H, 10}) // 200 repaid by the empty hour 2
	s2 := []int64{h0 + H, 10, 200}
	f("add in hour 2 again", c.add(nil, s2, h0+H+9, 5), []int64{h0 + H, 15, 200})
	// An older send (Insert): its cost adds to the debt, at most the borrow.
	f("replayed send of hour 1", c.add(nil, s2, h0+7, 60), []int64{h0 + H, 10, 260})
	f("replayed send beyond", c.add(nil, s2, h0+7, 600), []int64{h0 + H, 10, 300})
	f("replayed send into no debt", c.add(nil, []int64{h0 + H, 10}, h0, 6), []int64{h0 + H, 10, 6})

	// Remove takes back from the stored window only.
	got, ok := c.remove(nil, s2, h0+H+1, 4)
	f("refund in hour 2", got, []int64{h0 + H, 6, 200})
	if !ok {
		t.Fatal("refund in hour 2 changed nothing")
	}
	if got, ok := c.remove(nil, s2, h0+1, 4); ok || !slices.Equal(got, s2) {
		t.Fatalf("refund of an hour-1 send = %v, %v; want no change (its debt stays)", got, ok)
	}

	// Merge: the older advanced to the newer's window, then the larger of each.
	f("merge hour 1 and hour 2", c.merge(nil, []int64{h0, 1300}, []int64{h0 + H, 10, 200}), []int64{h0 + H, 10, 300})
	f("merge hour 2 and hour 1", c.merge(nil, []int64{h0 + H, 10, 200}, []int64{h0, 1100}), []int64{h0 + H, 10, 200})
	f("merge same window", c.merge(nil, []int64{h0 + H, 10, 200}, []int64{h0 + H, 30, 100}), []int64{h0 + H, 30, 200})
	f("merge with a repaid one", c.merge(nil, []int64{h0 + 2*H, 1}, []int64{h0, 1300}), []int64{h0 + 2*H, 1})

	// Normalize keeps a state while its window lasts or its debt is unpaid.
	f("normalize in its window", c.normalize(nil, s, h0+H-1), s)
	f("normalize owing", c.normalize(nil, s, h0+2*H-1), s)
	f("normalize repaid", c.normalize(nil, s, h0+2*H), nil)
	f("normalize within the limit", c.normalize(nil, []int64{h0, 1000}, h0+H), nil)
	f("normalize refunded to 0 but owing", c.normalize(nil, []int64{h0 + H, 0, 200}, h0+H), []int64{h0 + H, 0, 200})
	f("normalize refunded to 0", c.normalize(nil, []int64{h0 + H, 0}, h0+H), nil)
	f("normalize a 1300 hour", c.normalize(nil, []int64{h0, 1000, 300}, h0+2*H-1), []int64{h0, 1000, 300})
	f("normalize a 1300 hour, repaid", c.normalize(nil, []int64{h0, 1000, 300}, h0+2*H), nil)
}

// TestBorrowReload: counterID ignores the borrow, so a reload that changes
// only it keeps the state; a lowered borrow forgives the debt above it, and
// a rule that no longer borrows reads a stored debt as none and writes its
// state as a fixed window always did.
func TestBorrowReload(t *testing.T) {
	const H = hourMs
	base := Rule{Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300}
	old, _ := borrowRule(t, base)
	less, none := base, base
	less.Borrow, none.Borrow = 100, 0
	dl, _ := borrowRule(t, less)
	dn, _ := borrowRule(t, none)
	if old.counters[0].id != dn.counters[0].id {
		t.Fatal("counterID depends on the borrow")
	}
	var s Scratch
	var dec Decision
	rec, err := old.Apply(&s, nil, 1, h0, Item{Cost: 1000}, &dec)
	rec = slices.Clone(rec)
	if err == nil {
		rec, err = old.Apply(&s, rec, 1, h0+1, Item{Cost: 300}, &dec)
		rec = slices.Clone(rec)
	}
	if err == nil {
		rec, err = old.Apply(&s, rec, 1, h0+H, Item{Cost: 5}, &dec) // hour 2: [start, 5, 300]
		rec = slices.Clone(rec)
	}
	if err != nil || dec.Rules[0].Used != 305 {
		t.Fatalf("under borrow 300: %v, %+v", err, dec.Rules[0])
	}
	for _, tc := range []struct {
		d               *Domain
		used, remaining int
	}{{dl, 105, 995}, {dn, 5, 995}} {
		if _, err := tc.d.Apply(&s, rec, 1, h0+H+1, Item{Mode: Peek}, &dec); err != nil || dec.Rules[0].Used != tc.used || dec.Rules[0].Remaining != tc.remaining {
			t.Fatalf("borrow %d: %v, %+v; want used %d remaining %d", tc.d.Rule(0).Borrow, err, dec.Rules[0], tc.used, tc.remaining)
		}
	}
	// Without borrow, the next send writes the state as a plain fixed
	// window's: byte for byte what a rule that never borrowed writes.
	out, err := dn.Apply(&s, rec, 1, h0+H+2, Item{}, &dec)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := dn.Apply(&s, nil, 1, h0+H+2, Item{Cost: 6}, &dec)
	var a, b state
	if err := a.decode(out); err != nil {
		t.Fatal(err)
	}
	if err := b.decode(plain); err != nil {
		t.Fatal(err)
	}
	if va, vb := a.counterVals(&dn.counters[0]), b.counterVals(&dn.counters[0]); !slices.Equal(va, vb) || len(va) != 2 {
		t.Fatalf("after dropping borrow: state %v, a plain fixed window's %v", va, vb)
	}
}

// TestBorrowStateShapes: check accepts [start, n] and [start, n, owed] with
// owed in [1, MaxCounterLimit], whatever the rule's borrow now, and refuses
// anything else as corrupt; a 3-value state survives the codec.
func TestBorrowStateShapes(t *testing.T) {
	for _, borrow := range []int{0, 300} {
		d, c := borrowRule(t, Rule{Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: borrow})
		for _, tc := range []struct {
			vals []int64
			ok   bool
		}{
			{[]int64{h0, 5}, true},
			{[]int64{h0, 5, 1}, true},
			{[]int64{h0, 0, 300}, true},
			{[]int64{h0, 5, MaxCounterLimit}, true},
			{[]int64{h0, 5, 0}, false},
			{[]int64{h0, 5, MaxCounterLimit + 1}, false},
			{[]int64{h0, 5, 1, 1}, false},
			{[]int64{h0 + 1, 5, 1}, false},
		} {
			var st state
			st.reset(1)
			st.newest = h0 + 10
			st.setCounter(c, tc.vals)
			rec := st.encode(nil)
			var back state
			err := back.decode(rec)
			if err == nil && !statesEqual(&st, &back) {
				t.Fatalf("borrow %d state %v: round trip differs", borrow, tc.vals)
			}
			if err == nil {
				var s Scratch
				var dec Decision
				_, err = d.Apply(&s, rec, 1, h0+20, Item{Mode: Peek}, &dec)
			}
			if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("borrow %d state %v: %v, want ok %v", borrow, tc.vals, err, tc.ok)
			}
		}
	}
}

// TestBorrowWidenRepaysAtTheSlowestLimit: an override with a lower limit
// repays debt more slowly; the base domain widened by it keeps states (and
// records) that long, and merges at that pace.
func TestBorrowWidenRepaysAtTheSlowestLimit(t *testing.T) {
	const H = hourMs
	base, _ := borrowRule(t, Rule{Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300})
	over, err := base.WithLimits([]int{100}, false)
	if err != nil {
		t.Fatal(err)
	}
	wide := base.Widen(over)
	if over.Longest() != 4*H || wide.Longest() != 4*H || base.Longest() != 2*H {
		t.Fatalf("Longest: base %d, override %d, widened base %d; want %d, %d, %d", base.Longest(), over.Longest(), wide.Longest(), 2*H, 4*H, 4*H)
	}
	c := &wide.counters[0]
	s := []int64{h0, 400} // owes 300 into hour 2 at limit 100
	if got := c.normalize(nil, s, h0+3*H); !slices.Equal(got, s) {
		t.Fatalf("widened normalize at hour 4 = %v, want %v kept (the override still owes 100)", got, s)
	}
	if got := c.normalize(nil, s, h0+4*H); got != nil {
		t.Fatalf("widened normalize at hour 5 = %v, want nil", got)
	}
	if got := c.merge(nil, s, []int64{h0 + 2*H, 1}); !slices.Equal(got, []int64{h0 + 2*H, 1, 200}) {
		t.Fatalf("widened merge = %v, want the override's debt of 200", got)
	}
}

func ExampleRule_borrow() {
	d, _ := NewDomain("sms", []Rule{{Name: "hourly", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300}})
	var s Scratch
	var dec Decision
	var rec []byte
	at := h0
	for _, step := range []struct {
		at   int64
		cost int
	}{{0, 1000}, {1, 200}, {hourMs, 800}, {hourMs + 1, 301}} {
		out, _ := d.Apply(&s, rec, 1, at+step.at, Item{Cost: step.cost}, &dec)
		if out != nil {
			rec = append(rec[:0], out...)
		}
		fmt.Printf("hour %d cost %d: admitted %v used %d remaining %d\n", step.at/hourMs+1, step.cost, dec.Admitted, dec.Rules[0].Used, dec.Rules[0].Remaining)
	}
	// Output:
	// hour 1 cost 1000: admitted true used 1000 remaining 300
	// hour 1 cost 200: admitted true used 1200 remaining 100
	// hour 2 cost 800: admitted true used 1000 remaining 300
	// hour 2 cost 301: admitted false used 1000 remaining 300
}

// TestBorrowMergeIsAtOrAboveBoth: the merge of two records of one key, each
// holding some of its sends, never leaves more room than either, at any
// later time (and, TestCountersReplayMergeAndBuild, is exact when one
// holds all the other's sends).
func TestBorrowMergeIsAtOrAboveBoth(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 7))
	for i := range 300 {
		L := 1 + rng.IntN(8)
		r := edgeRule(Rule{Algorithm: FixedWindow, Limit: L, Borrow: 1 + rng.IntN(4*L), Window: time.Duration(1+rng.IntN(500)) * time.Millisecond})
		d, _ := borrowRule(t, r)
		var a, b []costSend
		at := t0
		for range 1 + rng.IntN(30) {
			at += rng.Int64N(r.WindowMillis())
			snd := costSend{at, 1 + rng.IntN(2*L)}
			if rng.IntN(2) == 0 {
				a = append(a, snd)
			} else {
				b = append(b, snd)
			}
		}
		ra, rb := insertCosts(t, d, a), insertCosts(t, d, b)
		m := merge(t, d, ra, rb)
		var s Scratch
		var dm, dx Decision
		for _, dt := range []int64{0, 1, r.WindowMillis() / 2, r.WindowMillis(), 2 * r.WindowMillis(), d.Longest() / 2, d.Longest()} {
			now := at + dt
			if _, err := d.Apply(&s, m, 3, now, Item{Mode: Peek}, &dm); err != nil {
				t.Fatal(err)
			}
			for _, rec := range [][]byte{ra, rb} {
				if _, err := d.Apply(&s, rec, 3, now, Item{Mode: Peek}, &dx); err != nil {
					t.Fatal(err)
				}
				if dm.Rules[0].Remaining > dx.Rules[0].Remaining {
					t.Fatalf("case %d rule %+v at +%d: merge of %v and %v leaves %d remaining, one of them %d", i, r, dt, a, b, dm.Rules[0].Remaining, dx.Rules[0].Remaining)
				}
			}
		}
	}
}
