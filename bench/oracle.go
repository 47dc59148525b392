package bench

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/freqring/freqring/window"
)

// Send is one admitted send as a client saw it.
type Send struct {
	Domain    string
	Recipient string
	Content   uint64 // content hash; 0 for none
	Cost      int    // 0 means 1
	At        int64  // decision time, unix ms, as the limiter reported it
	Checked   bool   // admitted by a check (false: record-only, which may exceed limits)
}

// Violation is one checked send that took a window beyond its rule's limit.
type Violation struct {
	Send  Send
	Rule  string
	Count int // sends in the window including this one's cost
	Limit int
}

func (v Violation) String() string {
	return fmt.Sprintf("%s/%s at %d: rule %s holds %d > limit %d", v.Send.Domain, v.Send.Recipient, v.Send.At, v.Rule, v.Count, v.Limit)
}

// Audit replays admitted sends against the rules of their domains, by
// definition: for every rule (L, W) and every checked send s at t, the sends
// of s's scope in (t-W, t] up to and including s must cost at most L. It
// returns every violation; an exact limiter has none. Sends at the same
// millisecond are replayed in the order given. rules maps domain names to
// their rules; sends of an unknown domain are an error.
func Audit(rules map[string][]window.Rule, sends []Send) ([]Violation, error) {
	type scopeKey struct {
		domain, recipient string
		content           uint64
	}
	groups := map[scopeKey][]int{} // indices into sends, per scope
	for i, s := range sends {
		if _, ok := rules[s.Domain]; !ok {
			return nil, fmt.Errorf("bench: send %d names unknown domain %q", i, s.Domain)
		}
		groups[scopeKey{s.Domain, s.Recipient, 0}] = append(groups[scopeKey{s.Domain, s.Recipient, 0}], i)
		if s.Content != 0 {
			k := scopeKey{s.Domain, s.Recipient, s.Content}
			groups[k] = append(groups[k], i)
		}
	}
	var out []Violation
	for k, idx := range groups {
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(sends[a].At, sends[b].At) })
		for _, r := range rules[k.domain] {
			if (r.Scope == window.ScopeContent) != (k.content != 0) {
				continue
			}
			w := r.WindowMillis()
			// Two pointers: lo is the oldest send still inside (t-W, t].
			lo, inWindow := 0, 0
			for _, i := range idx {
				s := sends[i]
				for sends[idx[lo]].At <= s.At-w {
					inWindow -= max(sends[idx[lo]].Cost, 1)
					lo++
				}
				inWindow += max(s.Cost, 1)
				if s.Checked && inWindow > r.Limit {
					out = append(out, Violation{Send: s, Rule: r.Name, Count: inWindow, Limit: r.Limit})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Violation) int { return cmp.Compare(a.Send.At, b.Send.At) })
	return out, nil
}
