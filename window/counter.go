package window

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Algorithm says how a rule reads its Limit and Window.
//
// SlidingLog, the default, is exact: it keeps the time of every admitted
// send of its window (engine.go). The others keep a counter state of a few
// numbers per rule, whatever the limit, and take limits up to
// MaxCounterLimit. They count per recipient (the record's key) only. Each is
// defined here by what it admits; the reference tests check the engine
// against these definitions by brute force.
//
// Times are unix ms; a send of cost c counts as c sends. t is the decision
// time (Decision.At).
//
//   - SlidingCounter (seed 003's bucketed window): the window is cut into
//     Buckets sub-windows of B = Window/Buckets ms, aligned to the unix
//     epoch; bucket k covers [kB, (k+1)B). The estimate at t is the sum of
//     the sends of every bucket that overlaps (t-Window, t]: a send at s is
//     counted until the end of its bucket plus Window, ((k+1)B-1)+Window
//     exclusive. The estimate is never below the exact sliding count and
//     exceeds it by at most the sends of the one oldest bucket, which lies
//     partly outside the window: the counter only ever denies early, never
//     admits beyond the limit. Admits iff estimate+c <= Limit.
//   - FixedWindow (envoyproxy/ratelimit's windows): windows aligned to the
//     unix epoch, [kW, (k+1)W); admits iff the sends admitted in t's window
//     plus c are at most Limit. Unlike envoyproxy/ratelimit, denied
//     attempts are not counted.
//   - FixedWindow with Borrow = D > 0 (seed 004's debt): a window may admit
//     up to D beyond Limit, repaid by the windows after it. Let W_0, W_1,
//     ... be consecutive fixed windows (the one after the window starting
//     at s starts at windowEnd(s)), a_k the cost recorded in W_k and owed_k
//     the debt carried into W_k: owed_k = min(D, max(0, owed_{k-1} +
//     a_{k-1} - Limit)), 0 before the first send; so an empty window
//     repays Limit. An item of cost c at t in W_k is admitted iff owed_k +
//     a_k + c <= Limit + D. The min(D, ...) only binds for record-only
//     sends and after a reload lowered D (whose excess debt is forgiven):
//     for decided sends owed_k + a_k <= Limit + D already. Hence the debt
//     never exceeds D, any n consecutive windows admit at most n*Limit +
//     D, and D = 0 is exactly the fixed window above. Used is owed_k + a_k
//     (the debt shows in it) and Remaining Limit + D - Used, never below 0;
//     RetryAfter is the start of the first later window W_j with owed_j + c
//     <= Limit + D: the next one when c <= Limit, several ahead when c must
//     wait for debt to be repaid (found in closed form, as is the debt
//     carried over empty windows: no decision steps window by window). A
//     state counts until its window ends and the debt it carries out is
//     repaid: at most Window*(1+ceil(D/Limit)) after its newest send.
//     Buckets need no borrowing (a larger Capacity is the same thing), and
//     the sliding algorithms do not offer it.
//   - TokenBucket, LeakyBucket (seed 001's funnel) and GCRA (redis-cell)
//     are one meter, under the names each tradition gives it: a bucket of
//     Capacity sends (default Limit) that drains, or refills, continuously
//     at Limit sends per Window. Its level is the debt D(t) of the admitted
//     sends: D rises by c at each admitted send and falls at Limit/Window
//     per ms, never below 0. A send admits iff D(t)+c <= Capacity. GCRA's
//     theoretical arrival time is t+D(t)*Window/Limit, its emission interval
//     Window/Limit and its burst (redis-cell's max_burst+1) Capacity;
//     a token bucket's tokens are Capacity-D(t); a funnel's left quota is
//     Capacity-D(t). The state is kept exactly, in units of 1/Limit of a
//     send-window (a send adds Window units and Limit units drain each ms),
//     so retry-after is exact to the ms.
//
// Every algorithm reports Used (the count, or ceil(D)), Remaining (sends of
// cost 1 it would admit now) and RetryAfter (ms until it admits the item,
// if nothing else is recorded), exact under its definition. A rule rejects
// an item whose cost exceeds its Limit (Capacity for a bucket) with
// ErrInvalid, as a sliding-log does, unless it is a shadow.
//
// Record-only sends beyond a bucket's capacity leave it full (D = Capacity):
// like a sliding-log, which keeps only the newest Limit sends, a full
// bucket's state no longer grows. Replayed sends (Insert) older than the
// record's newest send are added to a bucket without draining: the result
// is at or above what time order gives (denies early, never admits more).
// Merge takes the larger state of each rule, exact when one copy's sends
// include the other's (a borrowing fixed-window advances the older copy to
// the newer's window, then takes the larger count and the larger debt).
// Replayed sends older than a borrowing fixed-window's stored window add
// their cost to its debt (at most D): never less than time order gives.
// Remove takes back from a fixed window's newest window only; a borrowing
// one keeps the debt an earlier window's send left. Remove (a refund)
// takes back from a bucket only the
// part of the send that cannot have drained yet, c-(t-s)*Limit/Window at
// the record's newest time t for a send at s: never more than the send
// still counts; and nothing once the bucket was full at or after the send
// (a record-only send was then kept only in part, and the send's share is
// unknown).
type Algorithm uint8

const (
	SlidingLog     Algorithm = iota // exact timestamp log (the default)
	SlidingCounter                  // seed 003's sub-window buckets
	TokenBucket                     // bucket of Capacity, refilled at Limit per Window
	LeakyBucket                     // seed 001's funnel: Capacity, leaking Limit per Window
	GCRA                            // redis-cell: Limit per Window, burst Capacity
	FixedWindow                     // envoyproxy/ratelimit: Limit per aligned Window
)

var algorithmNames = [...]string{"sliding-log", "sliding-counter", "token-bucket", "leaky-bucket", "gcra", "fixed-window"}

var algorithmList = strings.Join(algorithmNames[:], ", ")

// String returns the algorithm's name as written in a rules file.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm parses an algorithm's name; "" is SlidingLog.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return SlidingLog, nil
	}
	for i, n := range algorithmNames {
		if s == n {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("window: algorithm %q is not one of %s", s, algorithmList)
}

func (a Algorithm) isBucket() bool { return a == TokenBucket || a == LeakyBucket || a == GCRA }

// BucketCapacity returns the capacity of a bucket rule (token-bucket,
// leaky-bucket, gcra): Capacity, or Limit when unset; 0 for any other rule.
func (r Rule) BucketCapacity() int {
	if !r.Algorithm.isBucket() {
		return 0
	}
	return r.capacity()
}

// counterRule is the compiled form of a rule of a counting algorithm.
type counterRule struct {
	rule  int // index in Domain.rules
	id    uint32
	alg   Algorithm
	limit int64
	win   int64 // ms
	// bucket rules
	capacity int64 // sends the bucket holds
	keep     int64 // the most sends the state keeps: capacity, raised by Widen
	span0    int64 // time to drain keep, ms, at the slowest rate of the family (Widen)
	// sliding-counter rules
	width int64 // ms per sub-window
	nb    int64 // sub-windows per window
	// fixed-window rules
	borrow int64          // Rule.Borrow: the most debt carried into a window, sends
	repay  int64          // the slowest limit of the family (Widen): how fast span, merge and normalize let debt go
	clock  *calendarClock // the periods of a calendar rule; nil: windows of win ms aligned to the epoch
}

func newCounterRule(i int, r Rule) counterRule {
	c := counterRule{rule: i, id: counterID(r), alg: r.Algorithm, limit: int64(r.Limit), win: r.WindowMillis()}
	switch {
	case r.Algorithm.isBucket():
		c.capacity = int64(r.capacity())
		c.keep = c.capacity
		c.span0 = ceilDiv(c.keep*c.win, c.limit)
	case r.Algorithm == SlidingCounter:
		c.width = c.win / int64(r.buckets())
		c.nb = int64(r.buckets())
	case r.Algorithm == FixedWindow:
		c.borrow, c.repay = int64(r.Borrow), c.limit
		if r.Calendar != CalendarNone {
			loc, _ := LoadZone(r.Zone) // Validate loaded it
			c.clock = &calendarClock{cal: r.Calendar, loc: loc}
		}
	}
	return c
}

// counterID identifies a rule's state in a record: FNV-1a of the rule's
// name, algorithm, window and buckets, and its calendar and zone when it
// has one. A reload that keeps them keeps the
// state, whatever the new limit, capacity or borrow (the state's units do
// not depend on them; a fixed-window debt above a lowered borrow is
// forgiven down to it); a rule whose window or algorithm changes starts
// afresh.
func counterID(r Rule) uint32 {
	buckets := 0
	if r.Algorithm == SlidingCounter {
		buckets = r.buckets()
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00%d", r.Name, r.Algorithm, r.WindowMillis(), buckets)
	if r.Calendar != CalendarNone {
		fmt.Fprintf(h, "\x00%v\x00%s", r.Calendar, r.Zone)
	}
	return h.Sum32()
}

// span returns how long after a record's newest send this rule's state can
// still count a send, in ms.
func (c *counterRule) span() int64 {
	switch {
	case c.alg.isBucket():
		return c.span0
	case c.alg == SlidingCounter:
		return c.win + c.width - 1
	}
	// The send's window, then the windows that repay the debt it carries
	// out (at most borrow).
	return c.win + ceilDiv(c.borrow, c.repay)*c.win
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// counterState locates one rule's state inside state.cvals. vals[0] is a
// time (unix ms), written in a record as its age from the record's newest
// send; the rest are counts:
//
//	bucket          [asOf, D] or [asOf, D, full]: the debt D at asOf, in units
//	                of 1/limit send-window; full is the newest time a send
//	                found it full and was kept only in part (record-only)
//	fixed-window    [start, n] or [start, n, owed]: n sends admitted in the
//	                window starting at start, owed (> 0) the debt carried into it
//	sliding-counter [top, n0, n1, ...]: ni sends in the sub-window starting at top-i*width
type counterState struct {
	id  uint32
	alg Algorithm
	off int32 // first value in state.cvals
	n   int32 // values, >= 2
}

// findCounter returns the index of the state with id, or -1.
func (s *state) findCounter(id uint32) int {
	for j, c := range s.counters {
		if c.id == id {
			return j
		}
	}
	return -1
}

// vals returns the values of the state of rule c, or nil when there is none.
func (s *state) counterVals(c *counterRule) []int64 {
	j := s.findCounter(c.id)
	if j < 0 || s.counters[j].alg != c.alg {
		return nil
	}
	cs := s.counters[j]
	return s.cvals[cs.off : cs.off+cs.n]
}

// setCounter replaces the state of rule c by vals (nil: none). vals may
// alias s.cvals: the new values are appended before the old are dropped.
func (s *state) setCounter(c *counterRule, vals []int64) {
	j := s.findCounter(c.id)
	if vals == nil {
		if j >= 0 {
			s.counters = append(s.counters[:j], s.counters[j+1:]...)
		}
		return
	}
	off := len(s.cvals)
	s.cvals = append(s.cvals, vals...)
	cs := counterState{id: c.id, alg: c.alg, off: int32(off), n: int32(len(vals))}
	if j >= 0 {
		s.counters[j] = cs
	} else {
		s.counters = append(s.counters, cs)
	}
}

// check reports a state of rule c that this package cannot have written
// for it: values out of line with the rule's windows, or too many. Records
// travel between nodes and releases; a state that does not fit its rule is
// refused (ErrCorruptRecord) rather than read as something that admits.
func (c *counterRule) check(vals []int64) error {
	bad := false
	switch {
	case c.alg.isBucket():
		bad = len(vals) > 3
	case c.alg == FixedWindow:
		// A debt is written only when positive, and never above
		// MaxCounterLimit (the largest borrow); a rule that no longer
		// borrows reads it as forgiven (owed).
		bad = len(vals) < 2 || len(vals) > 3 || c.windowStart(vals[0]) != vals[0] ||
			len(vals) == 3 && (vals[2] < 1 || vals[2] > MaxCounterLimit)
	default:
		bad = int64(len(vals)) > c.nb+2 || vals[0]%c.width != 0
	}
	if bad {
		return fmt.Errorf("%w: %v state %v of rule %d does not fit its window", ErrCorruptRecord, c.alg, vals[:min(len(vals), 4)], c.rule)
	}
	return nil
}

// debt returns a bucket state's debt at vals[0], at most keep sends: a
// reload that lowered the capacity (or, with the default capacity, the
// limit) leaves a fuller bucket full, so that it drains within the
// domain's Longest.
func (c *counterRule) debt(vals []int64) int64 { return min(vals[1], c.keep*c.win) }

// clampedAt returns when a bucket state was last full beyond its keep (see
// add), or 0.
func clampedAt(vals []int64) int64 {
	if len(vals) > 2 {
		return vals[2]
	}
	return 0
}

// drain returns the debt d, in units, after el ms at limit units per ms.
func drain(d, el, limit int64) int64 {
	if el <= 0 {
		return d
	}
	if el >= ceilDiv(d, limit) {
		return 0
	}
	return d - el*limit
}

// level returns what rule c counts at t (t at or after every time in vals):
// the debt in units for a bucket, else sends.
func (c *counterRule) level(vals []int64, t int64) int64 {
	if vals == nil {
		return 0
	}
	switch {
	case c.alg.isBucket():
		return drain(c.debt(vals), t-vals[0], c.limit)
	case c.alg == FixedWindow:
		_, owed, n := c.fixedAt(vals, t)
		return owed + n
	}
	var n int64
	for i, v := range vals[1:] {
		if c.leaves(vals[0]-int64(i)*c.width) > t {
			n += v
		}
	}
	return n
}

// report sets res.Used and res.Remaining from the state at t, and returns
// the level (see level).
func (c *counterRule) report(vals []int64, t int64, res *RuleResult) int64 {
	lv := c.level(vals, t)
	if c.alg.isBucket() {
		res.Used = int(ceilDiv(lv, c.win))
		res.Remaining = int(max(0, (c.capacity*c.win-lv)/c.win))
	} else {
		res.Used = int(min(lv, 1<<31-1))
		res.Remaining = int(max(0, c.limit+c.borrow-lv))
	}
	return lv
}

// most names the largest cost the rule can ever admit, and mostValue is it.
func (c *counterRule) most() string {
	switch {
	case c.alg.isBucket():
		return "capacity"
	case c.borrow > 0:
		return "limit+borrow"
	}
	return "limit"
}

func (c *counterRule) mostValue() int64 {
	if c.alg.isBucket() {
		return c.capacity
	}
	return c.limit + c.borrow
}

// windowStart returns the start of the fixed window holding t (unix ms),
// and windowEnd the end (exclusive) of the window starting at start. Times
// are at least 0 (the engine refuses earlier ones). windowsBetween returns
// how many windows lie from the window starting at a to the one starting
// at b (window starts, a <= b), and windowAfter the start of the k-th
// window after the one starting at start (k >= 0). Every fixed-window
// computation goes through these four.
//
// A calendar rule's windows are its periods (calendarClock.between and
// after: exact for hours, days and weeks; for months beyond 64 of them,
// erring only towards more debt and later retries).
func (c *counterRule) windowStart(t int64) int64 {
	if c.clock != nil {
		return c.clock.periodOf(t).start
	}
	return t / c.win * c.win
}

func (c *counterRule) windowEnd(start int64) int64 {
	if c.clock != nil {
		return c.clock.periodOf(start).end
	}
	return start + c.win
}

func (c *counterRule) windowsBetween(a, b int64) int64 {
	if c.clock == nil {
		return (b - a) / c.win
	}
	return c.clock.between(a, b, c.win)
}

func (c *counterRule) windowAfter(start, k int64) int64 {
	if c.clock == nil {
		return start + k*c.win
	}
	return c.clock.after(start, k, c.win)
}

// owed returns the debt a fixed-window state carries into its window, at
// most borrow: a reload that lowered the borrow forgives the rest.
func (c *counterRule) owed(vals []int64) int64 {
	if len(vals) > 2 {
		return min(vals[2], c.borrow)
	}
	return 0
}

// owedAt returns the debt a fixed-window state carries into the window
// starting at at (a window start at or after vals[0]), repaid at lim sends
// per window: each window passes on min(borrow, max(0, owed+n-lim)), an
// empty one thus repaying lim. In closed form: the state's window passes
// on its debt, and each empty window after it repays lim.
func (c *counterRule) owedAt(vals []int64, at, lim int64) int64 {
	if at <= vals[0] {
		return c.owed(vals)
	}
	out := min(c.borrow, max(0, c.owed(vals)+vals[1]-lim))
	return repaid(out, c.windowsBetween(vals[0], at)-1, lim)
}

// repaid returns a debt of owed sends after k empty windows that repay lim
// sends each.
func repaid(owed, k, lim int64) int64 {
	if k >= ceilDiv(owed, lim) {
		return 0
	}
	return owed - k*lim
}

// fixedAt returns the start of t's window (t at or after vals[0]), the debt
// carried into it and the sends admitted in it, under a fixed-window state
// (nil: none).
func (c *counterRule) fixedAt(vals []int64, t int64) (start, owed, n int64) {
	start = c.windowStart(t)
	switch {
	case vals == nil:
		return start, 0, 0
	case start == vals[0]:
		return start, c.owed(vals), vals[1]
	}
	return start, c.owedAt(vals, start, c.limit), 0
}

// appendFixed appends a fixed-window state: the debt only when positive,
// so that a rule that does not borrow writes what it wrote before Borrow.
func appendFixed(dst []int64, start, n, owed int64) []int64 {
	if owed > 0 {
		return append(dst, start, n, owed)
	}
	return append(dst, start, n)
}

// leaves returns when the sub-window starting at start stops counting: its
// last ms plus the window.
func (c *counterRule) leaves(start int64) int64 { return start + c.width - 1 + c.win }

// decide fills res with rule c's view of an item of cost at t, before it is
// recorded, and reports whether c admits it. retry is -1 (never) when cost
// exceeds what the rule can ever admit.
func (c *counterRule) decide(vals []int64, t int64, cost int64, res *RuleResult) bool {
	lv := c.report(vals, t, res)
	if c.alg.isBucket() {
		if lv+cost*c.win <= c.capacity*c.win {
			return true
		}
		if cost > c.capacity {
			res.RetryAfter = -1
		} else {
			res.RetryAfter = ceilDiv(lv+cost*c.win-c.capacity*c.win, c.limit)
		}
		return false
	}
	if lv+cost <= c.limit+c.borrow {
		return true
	}
	switch {
	case cost > c.limit+c.borrow:
		res.RetryAfter = -1
	case c.alg == FixedWindow:
		// The first later window, j windows after t's, whose carried debt
		// leaves room for cost: the next one (j = 1) carries next, and each
		// after it repays limit; cost <= limit+borrow, so one comes.
		s, owed, n := c.fixedAt(vals, t)
		next := min(c.borrow, max(0, owed+n-c.limit))
		j := int64(1)
		if over := next + cost - c.limit - c.borrow; over > 0 {
			j += ceilDiv(over, c.limit)
		}
		res.RetryAfter = c.windowAfter(s, j) - t
	default:
		// Sub-windows leave oldest first; the first at which the estimate
		// has room for cost.
		for i := len(vals) - 1; i >= 1; i-- {
			at := c.leaves(vals[0] - int64(i-1)*c.width)
			if at <= t {
				continue
			}
			lv -= vals[i]
			if lv+cost <= c.limit {
				res.RetryAfter = at - t
				break
			}
		}
	}
	return false
}

// add returns vals with cost sends at at added, in dst (which must not
// alias vals). at may be older than the state's times (Insert): a bucket
// then adds without draining, the counters add to at's window or
// sub-window if they still keep it; a borrowing fixed-window adds the cost
// of a send of an earlier window to the debt carried into its window (at
// most borrow), the most that send can add to it. A bucket keeps at most
// c.keep sends.
func (c *counterRule) add(dst, vals []int64, at, cost int64) []int64 {
	switch {
	case c.alg.isBucket():
		asOf, d, clamped := at, int64(0), int64(0)
		if vals != nil {
			asOf = max(vals[0], at)
			d = drain(c.debt(vals), at-vals[0], c.limit)
			if len(vals) > 2 {
				clamped = vals[2]
			}
		}
		d += cost * c.win
		if d > c.keep*c.win {
			// Full: the send is only partly kept. Remember when, for
			// Remove, which can then no longer tell its share.
			d, clamped = c.keep*c.win, asOf
		}
		if clamped > 0 {
			return append(dst, asOf, d, clamped)
		}
		return append(dst, asOf, d)
	case c.alg == FixedWindow:
		start := c.windowStart(at)
		switch {
		case vals == nil:
			return append(dst, start, cost)
		case start > vals[0]:
			return appendFixed(dst, start, cost, c.owedAt(vals, start, c.limit))
		case start == vals[0]:
			return appendFixed(dst, start, min(vals[1]+cost, maxCounterValue), c.owed(vals))
		}
		return appendFixed(dst, vals[0], vals[1], min(c.owed(vals)+cost, c.borrow))
	}
	start := at / c.width * c.width
	switch {
	case vals == nil || start-vals[0] > c.nb*c.width:
		// Nothing stored still counts at the send's time: start afresh
		// rather than write a zero per idle sub-window.
		return append(dst, start, cost)
	case vals[0]-start > c.nb*c.width:
		// An old replayed send whose sub-window no longer counts.
		return append(dst, vals...)
	}
	top := max(vals[0], start)
	dst = append(dst, top)
	for s := top; s > vals[0]; s -= c.width {
		dst = append(dst, 0)
	}
	dst = append(dst, vals[1:]...)
	i := 1 + (top-start)/c.width
	for int64(len(dst)) <= i {
		dst = append(dst, 0)
	}
	dst[i] = min(dst[i]+cost, maxCounterValue)
	return dst
}

// remove returns vals with a send of cost at at taken back, in dst (which
// must not alias vals), as far as the state still counts it; changed is
// false when it counted none of it.
func (c *counterRule) remove(dst, vals []int64, at, cost int64) (out []int64, changed bool) {
	dst = append(dst, vals...)
	switch {
	case c.alg.isBucket():
		if len(dst) > 2 && dst[2] >= at {
			// The bucket was full at or after the send: its share of the
			// debt is unknown, and taking any back could undercount.
			return dst, false
		}
		dst[1] = c.debt(dst)
		el := dst[0] - at
		var part int64 // the units of the send that cannot have drained
		if el < ceilDiv(cost*c.win, c.limit) {
			part = cost*c.win - max(el, 0)*c.limit
		}
		part = min(part, dst[1])
		dst[1] -= part
		return dst, part > 0
	case c.alg == FixedWindow:
		if c.windowStart(at) != dst[0] || dst[1] == 0 {
			return dst, false
		}
		dst[1] -= min(cost, dst[1])
		return dst, true
	}
	start := at / c.width * c.width
	if start > dst[0] {
		return dst, false
	}
	i := 1 + (dst[0]-start)/c.width
	if i >= int64(len(dst)) || dst[i] == 0 {
		return dst, false
	}
	dst[i] -= min(cost, dst[i])
	return dst, true
}

// merge returns the larger of two states of rule c at each point, in dst
// (which must alias neither).
func (c *counterRule) merge(dst, a, b []int64) []int64 {
	switch {
	case a == nil:
		return append(dst, b...)
	case b == nil:
		return append(dst, a...)
	case c.alg.isBucket():
		t := max(a[0], b[0])
		dst = append(dst, t, max(drain(c.debt(a), t-a[0], c.limit), drain(c.debt(b), t-b[0], c.limit)))
		if cl := max(clampedAt(a), clampedAt(b)); cl > 0 {
			dst = append(dst, cl)
		}
		return dst
	case c.alg == FixedWindow:
		// The older state advanced to the newer's window (at the family's
		// slowest repayment), then the larger count and the larger debt:
		// at or above each at every later time.
		if b[0] > a[0] {
			a, b = b, a
		}
		if a[0] > b[0] {
			return appendFixed(dst, a[0], a[1], max(c.owed(a), c.owedAt(b, a[0], c.repay)))
		}
		return appendFixed(dst, a[0], max(a[1], b[1]), max(c.owed(a), c.owed(b)))
	}
	if b[0] > a[0] {
		a, b = b, a
	}
	dst = append(dst, a...)
	shift := (a[0] - b[0]) / c.width
	if shift > c.nb {
		return dst // nothing of b still counts at a's newest sub-window
	}
	for i, v := range b[1:] {
		j := 1 + shift + int64(i)
		for int64(len(dst)) <= j {
			dst = append(dst, 0)
		}
		dst[j] = max(dst[j], v)
	}
	return dst
}

// normalize returns vals as of t, the record's newest time, in dst (which
// must not alias vals): a bucket drained to t, a past window or sub-window
// dropped, leading and trailing empty sub-windows trimmed. nil means the
// state counts nothing at t or later.
func (c *counterRule) normalize(dst, vals []int64, t int64) []int64 {
	switch {
	case c.alg.isBucket():
		d := drain(c.debt(vals), t-vals[0], c.limit)
		if d == 0 {
			return nil
		}
		if cl := clampedAt(vals); cl > 0 {
			return append(dst, t, d, cl)
		}
		return append(dst, t, d)
	case c.alg == FixedWindow:
		// Dropped once it counts nothing at t: its window ended and the
		// debt it carries out is repaid (at the family's slowest limit).
		owed := c.owed(vals)
		if c.windowEnd(vals[0]) <= t && c.owedAt(vals, c.windowStart(t), c.repay) == 0 || vals[1] == 0 && owed == 0 {
			return nil
		}
		return appendFixed(dst, vals[0], vals[1], owed)
	}
	counts := vals[1:]
	lo, hi := 0, len(counts) // the kept sub-windows, newest first
	for lo < hi && counts[lo] == 0 {
		lo++
	}
	for hi > lo && (counts[hi-1] == 0 || c.leaves(vals[0]-int64(hi-1)*c.width) <= t) {
		hi--
	}
	if lo == hi {
		return nil
	}
	dst = append(dst, vals[0]-int64(lo)*c.width)
	return append(dst, counts[lo:hi]...)
}
