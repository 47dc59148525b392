package window

import (
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// refKey is the brute-force model of one key's record under rules of every
// algorithm (recipient scope, no content): the list of recorded sends, and
// per bucket rule redis-cell's theoretical arrival time, kept as an exact
// rational (GCRA's virtual scheduling, a formulation independent of the
// engine's integer debt).
type refKey struct {
	sends  []refCost
	newest int64
	tat    map[int]*big.Rat // bucket rule index -> TAT, unix ms
	fw     map[int][]refWin // borrowing fixed-window rule index -> windows with sends, ascending
	cal    map[int]*refCalendar
}

// windows returns how rule i's fixed windows are numbered: the index of
// the window holding t, and where window K starts.
func (k *refKey) windows(i int, r Rule) (index func(t int64) int64, start func(K int64) int64) {
	if r.Calendar == CalendarNone {
		w := r.WindowMillis()
		return func(t int64) int64 { return t / w }, func(K int64) int64 { return K * w }
	}
	if k.cal == nil {
		k.cal = map[int]*refCalendar{}
	}
	c := k.cal[i]
	if c == nil {
		c = newRefCalendar(r)
		k.cal[i] = c
	}
	return c.index, c.start
}

// refWin is the cost recorded in fixed window k (numbered as refKey.windows
// says).
type refWin struct{ k, a int64 }

// borrowAt returns, for borrowing fixed-window rule i, the debt carried
// into window K (at or after every window recorded) and the cost recorded
// in it, by the definition (Algorithm): the first window with a send
// starts with no debt, and each window passes min(D, max(0, owed+a-L)) to
// the next, so an empty one repays L. Windows before the last that started
// free of debt are dropped.
func (k *refKey) borrowAt(i int, r Rule, K int64) (owed, a int64) {
	L, D := int64(r.Limit), int64(r.Borrow)
	ws := k.fw[i]
	cur, zero := int64(-1), 0
	step := func(to int64) {
		for cur >= 0 && cur < to && owed+a > 0 {
			owed, a = min(D, max(0, owed+a-L)), 0
			cur++
		}
		if cur < to {
			owed, a = 0, 0
		}
		cur = to
	}
	for j, w := range ws {
		step(w.k)
		if owed == 0 {
			zero = j
		}
		a = w.a
	}
	if len(ws) > 0 {
		k.fw[i] = ws[zero:]
	}
	step(K)
	return owed, a
}

type refCost struct{ at, cost int64 }

// count returns the sends of rule r (not a bucket) that count at t, by its
// definition.
func (k *refKey) count(r Rule, t int64) int64 {
	w := r.WindowMillis()
	var n int64
	for _, s := range k.sends {
		switch r.Algorithm {
		case SlidingLog:
			if s.at > t-w && s.at <= t {
				n += s.cost
			}
		case FixedWindow:
			if s.at/w == t/w {
				n += s.cost
			}
		case SlidingCounter:
			b := w / int64(r.buckets())
			if s.at/b*b+b-1+w > t { // the send's sub-window still overlaps (t-w, t]
				n += s.cost
			}
		}
	}
	return n
}

// backlog returns max(TAT, t) - t in ms for bucket rule i: the debt as time.
func (k *refKey) backlog(i int, t int64) *big.Rat {
	tat := k.tat[i]
	if tat == nil || tat.Cmp(big.NewRat(t, 1)) <= 0 {
		return new(big.Rat)
	}
	return new(big.Rat).Sub(tat, big.NewRat(t, 1))
}

func ratFloor(r *big.Rat) int64 { return new(big.Int).Div(r.Num(), r.Denom()).Int64() }
func ratCeil(r *big.Rat) int64 {
	return -new(big.Int).Div(new(big.Int).Neg(r.Num()), r.Denom()).Int64()
}

// decide answers what Apply must, by definition and brute force, and
// records an admitted item.
func (k *refKey) decide(d *Domain, now int64, it Item) (Decision, bool) {
	cost := int64(max(it.Cost, 1))
	t := max(now, k.newest)
	dec := Decision{DeniedBy: -1, ShadowDeniedBy: -1, At: t, NumRules: d.NumRules()}
	never := false
	logCap := int64(d.recipCap)
	// Sends older than twice the longest window count for no rule: drop
	// them, to keep the brute force quick.
	var horizon int64
	for _, r := range d.rules {
		horizon = max(horizon, 2*r.WindowMillis())
	}
	kept := k.sends[:0]
	for _, s := range k.sends {
		if s.at > k.newest-horizon { // t never goes below newest
			kept = append(kept, s)
		}
	}
	k.sends = kept
	for i, r := range d.rules {
		res := &dec.Rules[i]
		lim := int64(r.Limit)
		var ok bool
		retry := int64(-1)
		if r.Algorithm.isBucket() {
			T := big.NewRat(r.WindowMillis(), lim) // emission interval, ms
			capT := new(big.Rat).Mul(T, big.NewRat(int64(r.capacity()), 1))
			bl := k.backlog(i, t)
			res.Used = int(ratCeil(new(big.Rat).Quo(bl, T)))
			res.Remaining = int(max(0, ratFloor(new(big.Rat).Quo(new(big.Rat).Sub(capT, bl), T))))
			after := new(big.Rat).Add(bl, new(big.Rat).Mul(T, big.NewRat(cost, 1)))
			ok = after.Cmp(capT) <= 0
			if !ok && cost <= int64(r.capacity()) {
				retry = ratCeil(new(big.Rat).Sub(after, capT))
			}
		} else if r.Borrow > 0 || r.Calendar != CalendarNone {
			index, start := k.windows(i, r)
			L, D := lim, int64(r.Borrow)
			owed, a := k.borrowAt(i, r, index(t))
			res.Used, res.Remaining = int(owed+a), int(max(0, L+D-owed-a))
			ok = owed+a+cost <= L+D
			if !ok && cost <= L+D {
				for K := index(t) + 1; ; K++ { // window by window: the count changes only where one starts
					if owed, a := k.borrowAt(i, r, K); owed+a+cost <= L+D {
						retry = start(K) - t
						break
					}
				}
			}
		} else {
			n := k.count(r, t)
			if r.Algorithm == SlidingLog {
				n = min(n, logCap)
			}
			res.Used, res.Remaining = int(n), int(max(0, lim-n))
			ok = n+cost <= lim
			if !ok && cost <= lim {
				for at := t + 1; ; at++ { // step a ms at a time until it admits
					if k.count(r, at)+cost <= lim {
						retry = at - t
						break
					}
				}
			}
		}
		if ok || it.Mode == RecordOnly {
			continue
		}
		res.RetryAfter = retry
		switch {
		case r.Shadow:
			if sb := dec.ShadowDeniedBy; sb < 0 || dec.Rules[sb].RetryAfter >= 0 && (retry < 0 || retry > dec.Rules[sb].RetryAfter) {
				dec.ShadowDeniedBy = i
			}
		case retry < 0:
			never = true
		case retry > dec.RetryAfter:
			dec.RetryAfter, dec.DeniedBy = retry, i
		}
	}
	if never {
		return dec, false
	}
	dec.Admitted = dec.DeniedBy < 0
	if !dec.Admitted || it.Mode == Peek {
		return dec, true
	}
	dec.Recorded = true
	k.sends = append(k.sends, refCost{t, cost})
	k.newest = t
	for i, r := range d.rules {
		res := &dec.Rules[i]
		lim := int64(r.Limit)
		if r.Borrow > 0 || r.Calendar != CalendarNone {
			index, _ := k.windows(i, r)
			if k.fw == nil {
				k.fw = map[int][]refWin{}
			}
			if ws := k.fw[i]; len(ws) > 0 && ws[len(ws)-1].k == index(t) {
				ws[len(ws)-1].a += cost
			} else {
				k.fw[i] = append(ws, refWin{index(t), cost})
			}
			owed, a := k.borrowAt(i, r, index(t))
			res.Used, res.Remaining = int(owed+a), int(max(0, lim+int64(r.Borrow)-owed-a))
			continue
		}
		if !r.Algorithm.isBucket() {
			n := k.count(r, t)
			if r.Algorithm == SlidingLog {
				n = min(n, logCap)
			}
			res.Used, res.Remaining = int(n), int(max(0, lim-n))
			continue
		}
		// TAT = max(TAT, t) + cost*T, at most t + keep*T (a full bucket).
		T := big.NewRat(r.WindowMillis(), lim)
		tat := new(big.Rat).Add(big.NewRat(t, 1), k.backlog(i, t))
		tat.Add(tat, new(big.Rat).Mul(T, big.NewRat(cost, 1)))
		keep := d.counters[d.cidx[i]].keep
		if top := new(big.Rat).Add(big.NewRat(t, 1), new(big.Rat).Mul(T, big.NewRat(keep, 1))); tat.Cmp(top) > 0 {
			tat = top
		}
		if k.tat == nil {
			k.tat = map[int]*big.Rat{}
		}
		k.tat[i] = tat
		bl := k.backlog(i, t)
		capT := new(big.Rat).Mul(T, big.NewRat(int64(r.capacity()), 1))
		res.Used = int(ratCeil(new(big.Rat).Quo(bl, T)))
		res.Remaining = int(max(0, ratFloor(new(big.Rat).Quo(new(big.Rat).Sub(capT, bl), T))))
	}
	return dec, true
}

// randomCounterDomain returns 1 to 4 recipient rules of random algorithms
// (sliding-log among them), small enough for the reference to step ms by ms.
func randomCounterDomain(rng *rand.Rand, shadows bool) *Domain {
	n := 1 + rng.IntN(4)
	rules := make([]Rule, n)
	for i := range rules {
		r := Rule{
			Name:      fmt.Sprintf("r%d", i),
			Scope:     ScopeRecipient,
			Algorithm: Algorithm(rng.IntN(int(FixedWindow) + 1)),
			Limit:     1 + rng.IntN(12),
			Window:    time.Duration(1+rng.IntN(3_000)) * time.Millisecond,
			Shadow:    shadows && rng.IntN(3) == 0,
		}
		switch {
		case r.Algorithm.isBucket() && rng.IntN(2) == 0:
			r.Capacity = 1 + rng.IntN(15)
		case r.Algorithm == SlidingCounter:
			r.Buckets = 1 + rng.IntN(12)
			r.Window = time.Duration(int(r.Window/time.Millisecond)/r.Buckets*r.Buckets+r.Buckets) * time.Millisecond
		case r.Algorithm == FixedWindow && rng.IntN(2) == 0:
			r.Borrow = rng.IntN(4*r.Limit + 4) // 0 included: exactly a fixed window
		}
		if rng.IntN(6) == 0 && r.Algorithm != SlidingLog {
			// Large limits: the counters' reason to exist.
			r.Limit = 1 + rng.IntN(MaxCounterLimit)
			if r.Borrow > 0 {
				r.Borrow = 1 + rng.IntN(MaxCounterLimit)
			}
		}
		rules[i] = r
	}
	d, err := NewDomain("random", rules)
	if err != nil {
		panic(err)
	}
	return d
}

// runCounterReference drives the engine and refKey with one random sequence
// over several keys, with clock jumps back and long quiet spells, and
// compares every decision.
func runCounterReference(t *testing.T, rng *rand.Rand, d *Domain, ops, keys, maxStep int) {
	t.Helper()
	runCounterReferenceFrom(t, rng, d, t0, ops, keys, maxStep)
}

// runCounterReferenceFrom is runCounterReference from the clock reading
// start, unix ms.
func runCounterReferenceFrom(t *testing.T, rng *rand.Rand, d *Domain, start int64, ops, keys, maxStep int) {
	t.Helper()
	recs := make([][]byte, keys)
	refs := make([]refKey, keys)
	var s Scratch
	now := start
	for op := range ops {
		switch x := rng.IntN(100); {
		case x < 3:
			now -= int64(rng.IntN(2_000))
		case x < 5:
			now += int64(rng.IntN(int(3 * d.Longest())))
		default:
			now += int64(rng.IntN(maxStep))
		}
		k := rng.IntN(keys)
		it := Item{Cost: 1}
		if rng.IntN(6) == 0 {
			it.Cost = 1 + rng.IntN(6)
		}
		switch x := rng.IntN(20); {
		case x == 0:
			it.Mode = RecordOnly
		case x < 3:
			it.Mode = Peek
		}
		stepReference(t, d, &s, &recs[k], uint16(k), &refs[k], now, it, func() string {
			return fmt.Sprintf("op %d key %d now %s rules %+v sends %v", op, k, time.UnixMilli(now).UTC().Format(time.RFC3339Nano), d.rules, refs[k].sends)
		})
	}
}

// stepReference decides it at now both in d, on the record *rec of the key
// tagged tag, and in ref, and fails the test unless they agree: the same
// Decision, or ErrInvalid where the reference finds the cost beyond a rule.
// It then keeps Apply's new record in *rec. what describes the step for a
// failure.
func stepReference(t *testing.T, d *Domain, s *Scratch, rec *[]byte, tag uint16, ref *refKey, now int64, it Item, what func() string) {
	t.Helper()
	want, valid := ref.decide(d, now, it)
	var got Decision
	out, err := d.Apply(s, *rec, tag, now, it, &got)
	if !valid {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: Apply = %v, want ErrInvalid (cost %d beyond a rule)", what(), err, it.Cost)
		}
		return
	}
	if err != nil || got != want {
		t.Fatalf("%s, item %+v: %v\n got %+v\nwant %+v", what(), it, err, got, want)
	}
	if out != nil {
		*rec = append((*rec)[:0], out...)
	}
}

func TestCountersMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	domains := 300
	if raceEnabled {
		domains = 60
	}
	for i := range domains {
		d := randomCounterDomain(rng, i%3 == 0)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			runCounterReference(t, rng, d, 400, 3, 1+rng.IntN(400))
		})
	}
}

// TestEachAlgorithmMatchesReference runs one rule of each algorithm alone,
// long, at a rate near its limit.
func TestEachAlgorithmMatchesReference(t *testing.T) {
	for alg := SlidingLog; alg <= FixedWindow; alg++ {
		t.Run(alg.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(16, uint64(alg)))
			r := Rule{Name: "r", Scope: ScopeRecipient, Algorithm: alg, Limit: 7, Window: 1200 * time.Millisecond}
			if alg == SlidingCounter {
				r.Buckets = 6
			}
			if alg == FixedWindow {
				r.Borrow = 10
			}
			d, err := NewDomain("one", []Rule{r})
			if err != nil {
				t.Fatal(err)
			}
			ops := 20_000
			if raceEnabled {
				ops = 4_000
			}
			runCounterReference(t, rng, d, ops, 2, 2*1200/7)
		})
	}
}

// TestBorrowMatchesReference runs borrowing fixed-window rules alone and
// with others: costs above the limit (retry-after several windows ahead),
// clock jumps across several empty windows, record-only sends beyond what
// the rule admits.
func TestBorrowMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 4))
	cases := 150
	if raceEnabled {
		cases = 30
	}
	for i := range cases {
		L := 1 + rng.IntN(5)
		r := Rule{Name: "b", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: L, Borrow: rng.IntN(6 * L),
			Window: time.Duration(1+rng.IntN(1500)) * time.Millisecond}
		rules := []Rule{r}
		if i%3 == 0 {
			rules = append(rules, Rule{Name: "log", Scope: ScopeRecipient, Limit: 1 + rng.IntN(12), Window: time.Duration(1+rng.IntN(3000)) * time.Millisecond})
		}
		d, err := NewDomain("borrow", rules)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			runCounterReference(t, rng, d, 600, 2, 1+int(r.WindowMillis())*rng.IntN(3)/max(1, L))
		})
	}
}
