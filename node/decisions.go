package node

import (
	"sync"
	"sync/atomic"

	"github.com/freqring/freqring/window"
)

// decisionCounts holds the per-domain, per-rule decision counters of a
// node, by domain and rule name, so that they survive a rebinding of the
// view (a reload, an override): a view's domainView points at its
// domain's counts, resolved once when the view is built. Safe for
// concurrent use.
type decisionCounts struct {
	mu      sync.Mutex // guards domains
	domains map[string]*domainCounts
}

// domainCounts are one domain's counters. Its rules slice is indexed by
// the rule's position in the domain the view was built from; rules with
// the same name share counters across views.
type domainCounts struct {
	byName map[string]*ruleCounts // every rule name the domain ever had; guarded by decisionCounts.mu
	rules  []*ruleCounts          // of the domain of the latest view, in its order
}

type ruleCounts struct {
	denied, shadowDenied atomic.Int64
}

// of returns d's counters, made on first use, with their rules in d's order.
// The domainCounts a view holds keeps the rule order it was built with:
// of returns a new one sharing the counters when the order changed.
func (c *decisionCounts) of(d *window.Domain) *domainCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.domains == nil {
		c.domains = map[string]*domainCounts{}
	}
	prev := c.domains[d.Name()]
	if prev == nil {
		prev = &domainCounts{byName: map[string]*ruleCounts{}}
	}
	dc := &domainCounts{byName: prev.byName, rules: make([]*ruleCounts, d.NumRules())}
	for i := range d.NumRules() {
		name := d.Rule(i).Name
		rc := dc.byName[name]
		if rc == nil {
			rc = new(ruleCounts)
			dc.byName[name] = rc
		}
		dc.rules[i] = rc
	}
	c.domains[d.Name()] = dc
	return dc
}

// denied counts an item denied by rule i.
func (dc *domainCounts) denied(i int) { dc.rules[i].denied.Add(1) }

// shadowDenied counts an item shadow rule i would have denied.
func (dc *domainCounts) shadowDenied(i int) { dc.rules[i].shadowDenied.Add(1) }

// stats returns the counters of d's rules, in d's order.
func (dc *domainCounts) stats(d *window.Domain) []RuleStats {
	out := make([]RuleStats, d.NumRules())
	for i := range out {
		rc := dc.rules[i]
		out[i] = RuleStats{Name: d.Rule(i).Name, Denied: rc.denied.Load(), ShadowDenied: rc.shadowDenied.Load()}
	}
	return out
}
