package bench

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/freqring/freqring/window"
)

// KeySend is one send a limiter recorded on a key (of cost 1).
type KeySend struct {
	Key string
	At  int64 // decision time, unix ms
}

// KeyAudit is what AuditKeys found for one rule.
type KeyAudit struct {
	Sends int64 // sends audited
	// OverAdmissions are sends that took the rule's own count (by its
	// algorithm's definition) above its limit: a correct limiter has none.
	OverAdmissions int64
	// ExactOverAdmissions are sends that took an exact sliding window,
	// (t-W, t], above the limit. Information only for a fixed window, which
	// admits up to twice the limit across a window boundary, and a bucket,
	// which admits its capacity at once and refills meanwhile; none for a
	// sliding counter, which never counts fewer sends than the exact window.
	ExactOverAdmissions int64
}

func (a KeyAudit) String() string {
	return fmt.Sprintf("%d over-admitted of %d (exact sliding window: %d)", a.OverAdmissions, a.Sends, a.ExactOverAdmissions)
}

// AuditKeys replays the sends recorded on keys against rule r, by the
// definition of r's algorithm (window/counter.go), not by the engine's
// state: for a send at t,
//
//   - fixed-window: the sends of its key in t's aligned window
//     [floor(t/W)*W, floor(t/W)*W+W), up to and including it, must number at
//     most Limit; with Borrow D, plus the debt carried into the window (each
//     window carries on min(D, max(0, debt + sends - Limit))), at most
//     Limit + D;
//   - sliding-counter: with sub-windows of B = W/Buckets ms, a send at s
//     still counts at t while floor(s/B)*B+B-1+W > t; the sends of its key
//     that count at t, up to and including it, must number at most Limit;
//   - token-bucket, leaky-bucket, gcra (one meter): the key's debt D, which
//     rises by 1 at each send and drains at Limit per W, never below 0, must
//     be at most Capacity-1 just before the send (kept exactly, in units of
//     1/Limit send-window, as the engine does);
//   - any algorithm, for ExactOverAdmissions: the sends in (t-W, t].
//
// Sends of one key at the same millisecond are replayed in the order given.
// A sliding-log rule is an error.
func AuditKeys(r window.Rule, sends []KeySend) (KeyAudit, error) {
	def, err := definition(r)
	if err != nil {
		return KeyAudit{}, err
	}
	keys := make([]string, len(sends))
	ats := make([]int64, len(sends))
	for i, s := range sends {
		keys[i], ats[i] = s.Key, s.At
	}
	return auditKeys(keys, ats, r.WindowMillis(), r.Limit, def), nil
}

// auditKeys is AuditKeys over sends i of key keys[i] at ats[i], with the
// rule's window w, limit and definition def.
func auditKeys[K cmp.Ordered](keys []K, ats []int64, w int64, limit int, def ruleDefinition) KeyAudit {
	idx := make([]int32, len(keys))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(x, y int32) int {
		return cmp.Or(cmp.Compare(keys[x], keys[y]), cmp.Compare(ats[x], ats[y]))
	})
	a := KeyAudit{Sends: int64(len(keys))}
	lo, exactLo := 0, 0
	var debt, debtAt int64 // a bucket's debt, in units, at debtAt
	var win, owed, n int64 // a borrowing fixed window: its number, debt carried in, sends
	for j, i := range idx {
		t := ats[i]
		if j == 0 || keys[idx[j-1]] != keys[i] {
			lo, exactLo, debt, debtAt = j, j, 0, t
		}
		for ats[idx[exactLo]] <= t-w {
			exactLo++
		}
		if j-exactLo+1 > limit {
			a.ExactOverAdmissions++
		}
		if def.borrow > 0 {
			// Windows k of w ms: owed_k = min(D, max(0, owed_{k-1} +
			// a_{k-1} - limit)), each empty window repaying limit.
			k := floorDiv(t, w)
			if j == lo || k != win {
				if j == lo {
					owed, n = 0, 0
				} else {
					out := min(def.borrow, max(0, owed+n-int64(limit)))
					gap := k - win - 1 // empty windows between
					owed = max(0, out-min(gap, out)*int64(limit))
				}
				win, n = k, 0
			}
			if owed+n+1 > int64(limit)+def.borrow {
				a.OverAdmissions++
			}
			n++
			continue
		}
		if def.capacity > 0 {
			// Units: a send adds w, and limit drain each ms.
			debt = max(0, debt-(t-debtAt)*int64(limit))
			debtAt = t
			if debt+w > def.capacity*w {
				a.OverAdmissions++
			}
			debt += w
			continue
		}
		for !def.counts(ats[idx[lo]], t) {
			lo++
		}
		if j-lo+1 > limit {
			a.OverAdmissions++
		}
	}
	return a
}

// ruleDefinition is what a rule's algorithm admits: a bucket of capacity
// sends (capacity > 0), or a count of the sends that still count.
type ruleDefinition struct {
	capacity int64
	borrow   int64 // a fixed window's Borrow
	// counts reports whether a send at s counts at t (s <= t); it is
	// monotone in s, so the sends that count at t are a suffix of the
	// sends up to t in time order.
	counts func(s, t int64) bool
}

// definition returns rule r's definition.
func definition(r window.Rule) (ruleDefinition, error) {
	if r.Algorithm == window.SlidingLog {
		return ruleDefinition{}, fmt.Errorf("bench: AuditKeys: rule %s is a sliding-log: the api workload audits counting algorithms", r.Name)
	}
	if c := r.BucketCapacity(); c > 0 {
		return ruleDefinition{capacity: int64(c)}, nil
	}
	w := r.WindowMillis()
	if r.Algorithm == window.FixedWindow {
		if r.Borrow > 0 {
			return ruleDefinition{borrow: int64(r.Borrow)}, nil
		}
		return ruleDefinition{counts: func(s, t int64) bool { return floorDiv(s, w) == floorDiv(t, w) }}, nil
	}
	n := r.Buckets
	if n == 0 {
		n = window.DefaultBuckets
	}
	b := w / int64(n)
	return ruleDefinition{counts: func(s, t int64) bool { return floorDiv(s, b)*b+b-1+w > t }}, nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
