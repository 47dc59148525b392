package window

import "strconv"

// Explain: what a record says of a recipient now, rule by rule, for the
// people who run a limiter ("why was this message denied?").

// Logged is one send a sliding-log rule counts.
type Logged struct {
	At      int64  // unix ms
	Content uint32 // fingerprint of its content's hash (content rules), 0 for a recipient rule
}

// Value is one named number of a counting rule's state.
type Value struct {
	Name  string
	Value float64
}

// RuleView is what one rule counts at the explained time.
type RuleView struct {
	// Sends lists, for a sliding-log rule, the sends in its window, oldest
	// first: of the explained content for a content rule when the item has
	// one, of every content otherwise (each with its fingerprint). A send
	// of cost k appears k times. Nil for a counting rule.
	Sends []Logged
	// State names a counting rule's state (see Domain.Explain); nil for a
	// sliding-log rule.
	State []Value
}

// Explanation is Explain's answer: the item judged as a Peek would judge
// it, and what each rule counts.
type Explanation struct {
	Decision Decision
	Rules    []RuleView // one per rule, in the domain's order
}

// Explain judges it (as Peek, whatever its Mode) against rec, the record
// of one recipient in d (empty for none), at now (unix ms), and lists what
// each rule counts then: a sliding-log rule its sends, a counting rule its
// state, as values named
//
//	token-bucket    tokens (sends a burst could take now), capacity
//	leaky-bucket    level (sends in the funnel), capacity
//	gcra            tat_unix_ms (theoretical arrival time), emission_interval_ms, burst
//	fixed-window    window_start_unix_ms, window_end_unix_ms, count, owed (debt carried in)
//	sliding-counter count, sub_window_ms, and sub_window_<k> (sends in the
//	                sub-window k before the one holding the explained time)
//
// It never changes rec. It uses s as Apply does, and is as safe for
// concurrent use (not with one s).
func (d *Domain) Explain(s *Scratch, rec []byte, tag uint16, now int64, it Item) (Explanation, error) {
	it.Mode = Peek
	var ex Explanation
	if _, err := d.Apply(s, rec, tag, now, it, &ex.Decision); err != nil {
		return ex, err
	}
	st := &s.st
	t := ex.Decision.At
	fp := uint32(0)
	if it.Content != 0 {
		fp = contentFP(it.Content)
	}
	ex.Rules = make([]RuleView, len(d.rules))
	for i := range d.rules {
		r := &d.rules[i]
		v := &ex.Rules[i]
		switch {
		case r.Algorithm != SlidingLog:
			c := &d.counters[d.cidx[i]]
			v.State = c.explain(st.counterVals(c), t)
		case r.Scope == ScopeRecipient:
			v.Sends = appendLogged(v.Sends, st.recip, t-d.win[i], 0)
		default:
			for _, l := range st.clogs {
				if fp == 0 || l.fp == fp {
					v.Sends = appendLogged(v.Sends, st.ctimes[l.off:l.off+l.n], t-d.win[i], l.fp)
				}
			}
			sortLogged(v.Sends)
		}
	}
	return ex, nil
}

// appendLogged appends the entries of the ascending log after bound.
func appendLogged(dst []Logged, log []int64, bound int64, fp uint32) []Logged {
	for _, at := range log[len(log)-countAfter(log, bound):] {
		dst = append(dst, Logged{At: at, Content: fp})
	}
	return dst
}

// sortLogged orders sends by time, then fingerprint (an insertion sort:
// the lists are short, at most a rule's limit per content).
func sortLogged(l []Logged) {
	for i := 1; i < len(l); i++ {
		x, j := l[i], i
		for ; j > 0 && (l[j-1].At > x.At || l[j-1].At == x.At && l[j-1].Content > x.Content); j-- {
			l[j] = l[j-1]
		}
		l[j] = x
	}
}

// explain names the state vals of rule c at t (see Domain.Explain).
func (c *counterRule) explain(vals []int64, t int64) []Value {
	lv := c.level(vals, t) // units of 1/limit send-window for a bucket, else sends
	switch c.alg {
	case TokenBucket:
		return []Value{{"tokens", float64(c.capacity*c.win-lv) / float64(c.win)}, {"capacity", float64(c.capacity)}}
	case LeakyBucket:
		return []Value{{"level", float64(lv) / float64(c.win)}, {"capacity", float64(c.capacity)}}
	case GCRA:
		// The debt drains limit units a ms: it is gone, and the theoretical
		// arrival time reached, lv/limit ms from t.
		return []Value{{"tat_unix_ms", float64(t + ceilDiv(lv, c.limit))}, {"emission_interval_ms", float64(c.win) / float64(c.limit)}, {"burst", float64(c.capacity)}}
	case FixedWindow:
		start, owed, n := c.windowStart(t), int64(0), int64(0)
		if vals != nil {
			start, owed, n = c.fixedAt(vals, t)
		}
		return []Value{{"window_start_unix_ms", float64(start)}, {"window_end_unix_ms", float64(c.windowEnd(start))}, {"count", float64(n)}, {"owed", float64(owed)}}
	}
	// Sliding-counter: the sub-windows the rule counts at t, newest first.
	out := []Value{{"count", float64(lv)}, {"sub_window_ms", float64(c.width)}}
	cur := t / c.width * c.width
	for k := int64(0); c.leaves(cur-k*c.width) > t; k++ {
		var n int64
		if start := cur - k*c.width; vals != nil && start <= vals[0] {
			if j := 1 + (vals[0]-start)/c.width; j < int64(len(vals)) {
				n = vals[j]
			}
		}
		out = append(out, Value{subWindowName(int(k)), float64(n)})
	}
	return out
}

func subWindowName(k int) string { return "sub_window_" + strconv.Itoa(k) }
