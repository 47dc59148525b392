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
	// admits up to twice the limit across a window boundary; none for a
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
//     most Limit;
//   - sliding-counter: with sub-windows of B = W/Buckets ms, a send at s
//     still counts at t while floor(s/B)*B+B-1+W > t; the sends of its key
//     that count at t, up to and including it, must number at most Limit;
//   - any algorithm, for ExactOverAdmissions: the sends in (t-W, t].
//
// Sends of one key at the same millisecond are replayed in the order given.
// Other algorithms are an error.
func AuditKeys(r window.Rule, sends []KeySend) (KeyAudit, error) {
	counts, err := definition(r)
	if err != nil {
		return KeyAudit{}, err
	}
	keys := make([]string, len(sends))
	ats := make([]int64, len(sends))
	for i, s := range sends {
		keys[i], ats[i] = s.Key, s.At
	}
	return auditKeys(keys, ats, r.WindowMillis(), r.Limit, counts), nil
}

// auditKeys is AuditKeys over sends i of key keys[i] at ats[i], with the
// rule's window w, limit and definition counts.
func auditKeys[K cmp.Ordered](keys []K, ats []int64, w int64, limit int, counts func(s, t int64) bool) KeyAudit {
	idx := make([]int32, len(keys))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(x, y int32) int {
		return cmp.Or(cmp.Compare(keys[x], keys[y]), cmp.Compare(ats[x], ats[y]))
	})
	a := KeyAudit{Sends: int64(len(keys))}
	lo, exactLo := 0, 0
	for j, i := range idx {
		if j > 0 && keys[idx[j-1]] != keys[i] {
			lo, exactLo = j, j
		}
		t := ats[i]
		for !counts(ats[idx[lo]], t) {
			lo++
		}
		for ats[idx[exactLo]] <= t-w {
			exactLo++
		}
		if j-lo+1 > limit {
			a.OverAdmissions++
		}
		if j-exactLo+1 > limit {
			a.ExactOverAdmissions++
		}
	}
	return a
}

// definition returns whether, under rule r, a send at s counts at t >= s.
func definition(r window.Rule) (func(s, t int64) bool, error) {
	if r.Algorithm != window.FixedWindow && r.Algorithm != window.SlidingCounter {
		return nil, fmt.Errorf("bench: AuditKeys: algorithm %v is not fixed-window or sliding-counter", r.Algorithm)
	}
	w := r.WindowMillis()
	var b int64
	if r.Algorithm == window.SlidingCounter {
		n := r.Buckets
		if n == 0 {
			n = window.DefaultBuckets
		}
		b = w / int64(n)
	}
	// counts reports whether a send at s counts at t (s <= t), by the rule's
	// definition; it is monotone in s, so the sends that count at t are a
	// suffix of the sends up to t in time order.
	counts := func(s, t int64) bool {
		if r.Algorithm == window.FixedWindow {
			return floorDiv(s, w) == floorDiv(t, w)
		}
		return floorDiv(s, b)*b+b-1+w > t
	}
	return counts, nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
