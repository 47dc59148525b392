package bench

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

func TestAuditKeysHandMade(t *testing.T) {
	fixed := window.Rule{Name: "f", Scope: window.ScopeRecipient, Limit: 2, Window: time.Second, Algorithm: window.FixedWindow}
	counter := window.Rule{Name: "c", Scope: window.ScopeRecipient, Limit: 2, Window: time.Second, Algorithm: window.SlidingCounter, Buckets: 10}
	gcra := window.Rule{Name: "g", Scope: window.ScopeRecipient, Limit: 2, Window: time.Second, Algorithm: window.GCRA}
	burst := window.Rule{Name: "b", Scope: window.ScopeRecipient, Limit: 1, Window: time.Second, Algorithm: window.TokenBucket, Capacity: 3}
	at := func(key string, ts ...int64) []KeySend {
		var out []KeySend
		for _, t := range ts {
			out = append(out, KeySend{Key: key, At: t})
		}
		return out
	}
	join := func(ss ...[]KeySend) []KeySend {
		var out []KeySend
		for _, s := range ss {
			out = append(out, s...)
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		rule        window.Rule
		sends       []KeySend
		over, exact int64
	}{
		{"fixed: three in one window", fixed, at("a", 0, 500, 999), 1, 1},
		{"fixed: two each side of a boundary", fixed, at("a", 998, 999, 1000, 1001), 0, 2},
		{"fixed: same millisecond", fixed, at("a", 5, 5, 5), 1, 1},
		{"fixed: keys apart", fixed, join(at("a", 0, 1), at("b", 2, 3), at("c", 4)), 0, 0},
		{"fixed: order given", fixed, at("a", 999, 0, 500, 1000), 1, 2},
		{"fixed: negative times align", fixed, at("a", -1, -1000, 0), 0, 0},
		{"fixed: negative window", fixed, at("a", -1, -1000, -500), 1, 1},
		{"counter: oldest bucket gone at its end+W", counter, at("a", 0, 1050, 1099), 0, 0},
		{"counter: oldest bucket still counts", counter, at("a", 0, 1050, 1098), 1, 0},
		{"counter: whole bucket counts", counter, at("a", 50, 60, 1055), 1, 0},
		{"counter: within limit", counter, at("a", 0, 99, 1099, 1150), 0, 0},
		{"counter: exact breach is a breach", counter, at("a", 100, 200, 300), 1, 1},
		{"gcra: full at once", gcra, at("a", 0, 0), 0, 0},
		{"gcra: beyond the capacity", gcra, at("a", 0, 0, 0), 1, 1},
		{"gcra: half drained at 500 ms", gcra, at("a", 0, 0, 500), 0, 1},
		{"gcra: a ms early", gcra, at("a", 0, 0, 499), 1, 1},
		{"gcra: drained at 1000 ms", gcra, at("a", 0, 0, 1000, 1000), 0, 0},
		{"gcra: keys apart", gcra, join(at("a", 0, 0), at("b", 0, 0)), 0, 0},
		{"bucket: burst of the capacity", burst, at("a", 7, 7, 7), 0, 2},
		{"bucket: one refill a window", burst, at("a", 7, 7, 7, 1006), 1, 3},
		{"bucket: refilled", burst, at("a", 7, 7, 7, 1007, 2007, 3007), 0, 2},
		{"bucket: an over-admission still counts", burst, at("a", 0, 0, 0, 0, 1000), 2, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := AuditKeys(tc.rule, tc.sends)
			if err != nil {
				t.Fatal(err)
			}
			if a.OverAdmissions != tc.over || a.ExactOverAdmissions != tc.exact || a.Sends != int64(len(tc.sends)) {
				t.Fatalf("%v, want %d over-admitted, %d exact", a, tc.over, tc.exact)
			}
		})
	}
	if _, err := AuditKeys(window.Rule{Name: "l", Scope: window.ScopeRecipient, Limit: 1, Window: time.Second}, nil); err == nil {
		t.Fatal("a sliding-log rule accepted")
	}
}

// bruteAudit counts over-admissions straight from the definitions, in
// O(n²): for each send j, the sends i of its key with at_i < at_j, or at_i
// == at_j and i given before j, that count at at_j.
func bruteAudit(r window.Rule, sends []KeySend) (over, exact int64) {
	w := r.WindowMillis()
	b := w / int64(max(r.Buckets, 1))
	for j, s := range sends {
		var n, e int
		for i, p := range sends {
			if p.Key != s.Key || p.At > s.At || (p.At == s.At && i > j) {
				continue
			}
			var c bool
			if r.Algorithm == window.FixedWindow {
				c = floorDiv(p.At, w) == floorDiv(s.At, w)
			} else {
				c = floorDiv(p.At, b)*b+b-1+w > s.At
			}
			if c {
				n++
			}
			if p.At > s.At-w {
				e++
			}
		}
		if n > r.Limit {
			over++
		}
		if e > r.Limit {
			exact++
		}
	}
	return over, exact
}

// bruteBucket counts a bucket rule's over-admissions by GCRA's virtual
// scheduling, independently of the debt the audit keeps: per key, in time
// order (the order given within a millisecond), a send at t conforms iff
// its theoretical arrival time TAT is at most t+(Capacity-1)*W/Limit, and
// then TAT = max(TAT, t)+W/Limit; a send that does not conform still
// counts. Times are scaled by Limit to stay in integers.
func bruteBucket(r window.Rule, sends []KeySend) (over int64) {
	w, l, c := r.WindowMillis(), int64(r.Limit), int64(r.BucketCapacity())
	tat := map[string]int64{} // TAT*Limit per key
	idx := make([]int, len(sends))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(sends[x].At, sends[y].At) })
	for _, i := range idx {
		s := sends[i]
		t := s.At * l
		if tat[s.Key] > t+(c-1)*w {
			over++
		}
		tat[s.Key] = max(tat[s.Key], t) + w
	}
	return over
}

// bruteBorrow counts a borrowing fixed window's over-admissions by stepping
// every window: per key, in time order, each window k carries owed_k =
// min(D, max(0, owed_{k-1} + a_{k-1} - Limit)) into the next, and a send is
// over when owed_k + a_k (itself included) exceeds Limit + D.
func bruteBorrow(r window.Rule, sends []KeySend) (over int64) {
	w, l, d := r.WindowMillis(), int64(r.Limit), int64(r.Borrow)
	type st struct{ win, owed, n int64 }
	m := map[string]*st{}
	idx := make([]int, len(sends))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(x, y int) int { return cmp.Compare(sends[x].At, sends[y].At) })
	for _, i := range idx {
		s := sends[i]
		k := floorDiv(s.At, w)
		x := m[s.Key]
		if x == nil {
			x = &st{win: k}
			m[s.Key] = x
		}
		for x.win < k {
			x.owed, x.n, x.win = min(d, max(0, x.owed+x.n-l)), 0, x.win+1
		}
		x.n++
		if x.owed+x.n > l+d {
			over++
		}
	}
	return over
}

func TestAuditKeysMatchesBruteForce(t *testing.T) {
	algs := []window.Algorithm{window.FixedWindow, window.SlidingCounter, window.TokenBucket, window.LeakyBucket, window.GCRA}
	for round := range 60 {
		rng := rand.New(rand.NewPCG(4, uint64(round)))
		alg := algs[round%len(algs)]
		borrow := round%6 == 5 // a fixed window that borrows
		r := window.Rule{Name: "r", Scope: window.ScopeRecipient, Limit: 1 + rng.IntN(5), Window: time.Duration(100*(1+rng.IntN(20))) * time.Millisecond, Algorithm: alg}
		switch {
		case borrow:
			r.Algorithm, r.Borrow = window.FixedWindow, 1+rng.IntN(6)
		case alg == window.SlidingCounter:
			r.Buckets = []int{1, 2, 4, 5, 10}[rng.IntN(5)]
		case r.BucketCapacity() > 0 && rng.IntN(2) == 0:
			r.Capacity = 1 + rng.IntN(8)
		}
		var sends []KeySend
		at := int64(1_790_000_000_000)
		step := 120
		if r.BucketCapacity() > 0 {
			step = 60 // a full bucket admits one send per W/Limit: denser sends
		}
		for range 400 {
			at += int64(rng.IntN(step)) - 20 // some out of order
			sends = append(sends, KeySend{Key: fmt.Sprint(rng.IntN(3)), At: at})
		}
		got, err := AuditKeys(r, sends)
		if err != nil {
			t.Fatal(err)
		}
		over, exact := bruteAudit(r, sends)
		switch {
		case r.BucketCapacity() > 0:
			over = bruteBucket(r, sends)
		case r.Borrow > 0:
			over = bruteBorrow(r, sends)
		}
		if got.OverAdmissions != over || got.ExactOverAdmissions != exact {
			t.Fatalf("round %d %v %d/%v/%d/%d/%d: %v, brute force %d over, %d exact", round, r.Algorithm, r.Limit, r.Window, r.Buckets, r.Capacity, r.Borrow, got, over, exact)
		}
		if over == 0 {
			t.Fatalf("round %d: the random sends break no rule: the test tests nothing", round)
		}
	}
}

// TestAuditKeysAgreesWithEngine: what the engine admits under each counting
// algorithm passes the audit, and any one denied attempt added as if
// admitted fails it.
func TestAuditKeysAgreesWithEngine(t *testing.T) {
	for i, alg := range []window.Algorithm{window.FixedWindow, window.SlidingCounter, window.TokenBucket, window.LeakyBucket, window.GCRA, window.FixedWindow} {
		r := window.Rule{Name: "r", Scope: window.ScopeRecipient, Limit: 5, Window: 10 * time.Second, Algorithm: alg}
		name := alg.String()
		if i == 5 {
			r.Borrow, name = 3, "fixed-window borrowing"
		}
		t.Run(name, func(t *testing.T) {
			switch alg {
			case window.SlidingCounter:
				r.Buckets = 10
			case window.TokenBucket:
				r.Capacity = 8
			case window.GCRA:
				r.Capacity = 2
			}
			d, err := window.NewDomain("d", []window.Rule{r})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(9, uint64(i)))
			var s window.Scratch
			recs := map[string][]byte{}
			var admitted, denied []KeySend
			now := int64(1_790_000_000_000)
			for range 20_000 {
				now += int64(rng.IntN(1500))
				key := string(rune('a' + rng.IntN(3)))
				var dec window.Decision
				out, err := d.Apply(&s, recs[key], 0, now, window.Item{}, &dec)
				if err != nil {
					t.Fatal(err)
				}
				if out != nil {
					recs[key] = append([]byte(nil), out...)
				}
				if dec.Admitted {
					admitted = append(admitted, KeySend{key, dec.At})
				} else {
					denied = append(denied, KeySend{key, dec.At})
				}
			}
			a, err := AuditKeys(r, admitted)
			if err != nil {
				t.Fatal(err)
			}
			if a.OverAdmissions != 0 {
				t.Fatalf("engine-admitted sends fail the audit: %v", a)
			}
			if alg == window.SlidingCounter && a.ExactOverAdmissions != 0 {
				t.Fatalf("a sliding counter admitted beyond the exact window: %v", a)
			}
			t.Logf("%d admitted, %d denied: %v", len(admitted), len(denied), a)
			if len(denied) < 100 {
				t.Fatalf("only %d denials: the sequence does not test the limits", len(denied))
			}
			for _, extra := range denied[:100] {
				a, _ := AuditKeys(r, append(append([]KeySend(nil), admitted...), extra))
				if a.OverAdmissions == 0 {
					t.Fatalf("a denied send %+v passes the audit when added", extra)
				}
			}
		})
	}
}
