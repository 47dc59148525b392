package node

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/freqring/freqring/window"
)

// This file is what a node tells its observers: the Observer hooks (timings
// that a metrics package turns into histograms) and the decision counters
// by domain, rule and result, which outlive the view they are reached
// through, so that a rules reload keeps them.

// Observer receives a node's timings as they happen. Its methods are called
// on the paths they time, from many goroutines at once: they must be safe
// for concurrent use and return quickly (an atomic add, a histogram
// observation). Config.Observer nil means none. Package metrics has one
// backed by Prometheus histograms; the node never imports it.
type Observer interface {
	// CheckDone is called once per Check call and per request of a
	// CheckStream, when its answer is ready: items is the request's item
	// count, d the wall time from its arrival at the node to its answer
	// (forwarding and the WAL included). Calls that fail whole (not
	// serving, a malformed batch) are reported too.
	CheckDone(items int, d time.Duration)
	// Fsync is called after each fsync of a WAL segment file or directory
	// (wal.Options.OnFsync), with its wall time.
	Fsync(d time.Duration)
	// Snapshot is called after each snapshot that was written and
	// verified, with the wall time it took.
	Snapshot(d time.Duration)
	// Recovery is called once, when Open has recovered a node with a
	// DataDir, with the wall time of loading the snapshot and replaying
	// the WAL.
	Recovery(d time.Duration)
	// Stage is called as each stage of a call ends, with its wall time
	// (stages.go names them): several times per call, so it must cost no
	// more than an atomic add or two.
	Stage(call Call, stage Stage, d time.Duration)
}

// RuleStats are the decision counters of one rule of a domain.
type RuleStats struct {
	Name string
	// Denied counts the items this rule denied: for an item that several
	// rules deny, the rule reported in the answer (DeniedBy, the one with
	// the longest retry-after), so that a domain's Denied is the sum of its
	// rules'.
	Denied int64
	// ShadowDenied counts the items a shadow rule would have denied.
	ShadowDenied int64
}

// numCodes is the number of gRPC codes (OK to Unauthenticated).
const numCodes = 17

// decisionCounters are a node's decision counters, by domain and rule name.
// They live outside the view, so that a rules reload that keeps a domain
// (or a rule) keeps its counts; the view holds pointers into them, resolved
// once at bind, so that the hot path indexes by position and never looks up
// a map. Safe for concurrent use.
type decisionCounters struct {
	mu      sync.Mutex                 // guards domains (the counters themselves are atomic)
	domains map[string]*domainCounters // by domain name; entries are never removed

	failed     [numCodes]atomic.Int64 // items answered with an error, by gRPC code
	duplicates atomic.Int64           // items answered from the idempotency table
}

// domainCounters are one domain's counters.
type domainCounters struct {
	admitted, denied atomic.Int64
	mu               sync.Mutex              // guards rules
	rules            map[string]*ruleCounter // by rule name; entries are never removed
}

// ruleCounter is one rule's counters.
type ruleCounter struct {
	denied, shadowDenied atomic.Int64
}

// domain returns the counters of the domain named name, and those of its
// rules in the order given, creating what is missing.
func (c *decisionCounters) domain(name string, rules []string) (*domainCounters, []*ruleCounter) {
	c.mu.Lock()
	if c.domains == nil {
		c.domains = map[string]*domainCounters{}
	}
	dc := c.domains[name]
	if dc == nil {
		dc = &domainCounters{rules: map[string]*ruleCounter{}}
		c.domains[name] = dc
	}
	c.mu.Unlock()
	dc.mu.Lock()
	defer dc.mu.Unlock()
	rcs := make([]*ruleCounter, len(rules))
	for i, r := range rules {
		rc := dc.rules[r]
		if rc == nil {
			rc = &ruleCounter{}
			dc.rules[r] = rc
		}
		rcs[i] = rc
	}
	return dc, rcs
}

// fail counts items answered with code.
func (c *decisionCounters) fail(code codes.Code, items int64) {
	if int(code) >= numCodes {
		code = codes.Unknown
	}
	c.failed[code].Add(items)
}

// failedByCode returns the nonzero failure counts by code name.
func (c *decisionCounters) failedByCode() map[string]int64 {
	m := map[string]int64{}
	for code := range c.failed {
		if v := c.failed[code].Load(); v != 0 {
			m[codes.Code(code).String()] = v
		}
	}
	return m
}

// tally gathers the decisions of one pass over a batch, so that the shared
// atomic counters are added to once per run of items of one domain rather
// than once per item. Its zero value is ready; flush it at the end.
type tally struct {
	dv               *domainView
	admitted, denied int64
	ruleDenied       [window.MaxRules]int64
	failed           [numCodes]int64
	duplicates       int64
}

// decided counts one decided item of dv: admitted, or denied by rule deniedBy.
func (t *tally) decided(dv *domainView, admitted bool, deniedBy int) {
	if t.dv != dv {
		t.flushDomain()
		t.dv = dv
	}
	if admitted {
		t.admitted++
		return
	}
	t.denied++
	if deniedBy >= 0 && deniedBy < len(t.ruleDenied) {
		t.ruleDenied[deniedBy]++
	}
}

// flushDomain adds the counts of the current domain to its counters.
func (t *tally) flushDomain() {
	dv := t.dv
	if dv == nil {
		return
	}
	if t.admitted != 0 {
		dv.counters.admitted.Add(t.admitted)
	}
	if t.denied != 0 {
		dv.counters.denied.Add(t.denied)
		for i, k := range t.ruleDenied[:len(dv.rules)] {
			if k != 0 {
				dv.rules[i].denied.Add(k)
			}
		}
		t.ruleDenied = [window.MaxRules]int64{}
	}
	t.admitted, t.denied = 0, 0
}

// flush adds every count to c.
func (t *tally) flush(c *decisionCounters) {
	t.flushDomain()
	t.dv = nil
	for code, k := range t.failed {
		if k != 0 {
			c.failed[code].Add(k)
		}
	}
	if t.duplicates != 0 {
		c.duplicates.Add(t.duplicates)
	}
	*t = tally{}
}

// Serving reports whether the node decides: true once Open has recovered
// and joined, false while its WAL has failed (it records nothing until the
// WAL recovers), false again from the moment Serve begins to shut down
// (before it hands its partitions over) and after Close. A readiness probe
// reads it. Safe for concurrent use.
func (n *Node) Serving() bool {
	return n.ready.Load() && !n.shuttingDown.Load() && (n.dur == nil || !n.dur.log.Failed())
}

// servingChanged wakes Serve's health loop: Serving may have changed.
func (n *Node) servingChanged() {
	select {
	case n.servingKick <- struct{}{}:
	default:
	}
}
