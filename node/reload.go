package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// A reload replaces the rules a node decides by while it serves. Records
// belong to a domain's name (store.Ref), so the new rules judge the history
// the node holds: no record moves or is rebuilt, and the swap is one atomic
// store of the view that every Check loads once. A Check that loaded the old
// view finishes under it.
//
// What records hold bounds what new rules can see. A record keeps, per
// scope, the sends of the domain's longest window of that scope and at most
// its largest limit of them (window.Domain). A rule whose window grows past
// that span, or whose limit grows past that count, counts only what the
// records kept until it has been in force for its window: for that long it
// may admit more than it would have had it always been in force. Reload
// logs each such rule at WARN. Shrinking windows and limits is exact at once.
//
// A reload that drops a domain holding records is refused (ErrRemovedDomains):
// nothing is deleted silently, as at a restart (removed.go). Once the
// domain's records have expired (its longest window after its last send), the
// reload succeeds; a snapshot is then taken at once, so that a restart does
// not find the dropped domain's sends in the WAL and refuse to start.
//
// In a cluster the rules' hash is part of the node's gossip agreement
// (gossip.Agreement): a node that reloads to rules most members do not have
// owns nothing until they have them too, and the ring moves with the
// majority as a restart with new rules does (handoff rule 6), without losing
// counts.

// Reload makes rs the node's rules. It is safe for concurrent use with
// Check, serialised with other reloads, and waits for Open to finish. It returns ErrRemovedDomains,
// changing nothing, if rs lacks a domain the node holds records of. Reloading
// the rules in force changes nothing and returns nil. ctx bounds only the
// gossip announcement of the new rules' hash: the node decides by rs as soon
// as the view is swapped, even if the announcement times out (gossip still
// spreads it).
func (n *Node) Reload(ctx context.Context, rs *rules.Set) error {
	if rs == nil {
		return fmt.Errorf("node: Reload: nil rule set")
	}
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	start := time.Now()
	n.noteReload(nil)
	old := n.view.Load()
	if rs.Hash() == old.rules.Hash() {
		n.reloads.Add(1)
		n.log.Info("rules reloaded: unchanged", "rules", rs.Source(), "hash", fmt.Sprintf("%016x", rs.Hash()))
		return nil
	}
	var held []string
	var dropped []string
	for _, name := range old.names {
		if rs.Domain(name) != nil {
			continue
		}
		dropped = append(dropped, name)
		if recs := n.store.Stats(old.domains[name].ref).Records; recs > 0 {
			held = append(held, fmt.Sprintf("%q (%d records, longest window %v)", name, recs,
				time.Duration(old.domains[name].d.Longest())*time.Millisecond))
		}
	}
	if len(held) > 0 {
		err := fmt.Errorf("%w: %s lacks %s; keep the domains until their records expire, then reload again",
			ErrRemovedDomains, rs.Source(), strings.Join(held, ", "))
		n.ReloadFailed(err) // notes it
		return err
	}
	for _, name := range rs.Names() {
		if od := old.domains[name]; od != nil {
			for _, w := range growth(od.d, rs.Domain(name)) {
				n.log.Warn("rules reloaded: a rule counts only what records kept under the old rules until it has been in force for its window",
					"domain", name, "rule", w.rule, "reason", w.why)
			}
		}
	}
	n.admin.mu.Lock() // the admin overrides are a layer of the view (overrides.go)
	n.rebind(rs)
	n.admin.mu.Unlock()
	n.reloads.Add(1)
	n.log.Info("rules reloaded", "rules", rs.Source(), "hash", fmt.Sprintf("%016x", rs.Hash()),
		"prev_hash", fmt.Sprintf("%016x", old.rules.Hash()), "domains", rs.Names(), "dropped", dropped,
		"took", time.Since(start))
	if len(dropped) > 0 && n.dur != nil && n.ready.Load() {
		if err := n.snapshot(); err != nil {
			n.log.Error("snapshot after dropping domains failed: a restart before the next snapshot refuses to start while the WAL holds their sends (--drop-removed-domains)", "err", err)
		}
	}
	if c := n.clus.Load(); c != nil && c.ms != nil {
		if err := c.ms.SetAgreement(ctx, n.agreement(rs)); err != nil {
			n.log.Warn("announcing the new rules' hash: gossip spreads it later", "err", err)
		}
	}
	return nil
}

// ReloadFailed counts and logs, at ERROR, a reload that did not reach
// Reload: its rules file did not parse or validate (err names file:line and
// the field). The node keeps its rules.
func (n *Node) ReloadFailed(err error) {
	n.noteReload(err)
	n.reloadFailures.Add(1)
	n.log.Error("rules reload failed: keeping the rules in force", "rules", n.view.Load().rules.Source(), "err", err)
}

// lastReload is the outcome of the last rules reload tried (Status).
type lastReload struct {
	atMs int64  // unix ms, node clock
	err  string // "" when applied
}

// noteReload notes a reload tried now, failed with err or not.
func (n *Node) noteReload(err error) {
	r := &lastReload{atMs: n.nowMs()}
	if err != nil {
		r.err = err.Error()
	}
	n.lastReload.Store(r)
}

// agreement is what this node publishes in gossip under rules rs.
func (n *Node) agreement(rs *rules.Set) gossip.Agreement {
	return gossip.Agreement{Rules: rs.Hash(), Protocol: ProtocolVersion, Version: Version()}
}

// ruleGrowth is a rule of a reloaded domain that sees less history than it
// counts over (see the comment at the top of this file).
type ruleGrowth struct{ rule, why string }

// growth lists the rules of to that count beyond what records kept under
// from: a window longer than from's longest of the scope, or a limit above
// its largest.
func growth(from, to *window.Domain) []ruleGrowth {
	span := map[window.Scope]int64{}
	limit := map[window.Scope]int{}
	counting := map[string]window.Rule{}
	for _, r := range from.Rules() {
		if r.Algorithm != window.SlidingLog {
			counting[r.Name] = r
			continue
		}
		span[r.Scope] = max(span[r.Scope], r.WindowMillis())
		limit[r.Scope] = max(limit[r.Scope], r.Limit)
	}
	var out []ruleGrowth
	for _, r := range to.Rules() {
		var why []string
		if r.Algorithm != window.SlidingLog {
			// A counting rule's state is kept under its name, algorithm,
			// window and buckets: a change of any starts it afresh.
			o, ok := counting[r.Name]
			switch {
			case !ok:
				why = append(why, fmt.Sprintf("a new %v rule: its state counts sends from the reload on", r.Algorithm))
			case o.Algorithm != r.Algorithm || o.Per() != r.Per() || o.Buckets != r.Buckets:
				why = append(why, fmt.Sprintf("algorithm, window or buckets changed (%v %s/%d to %v %s/%d): its state counts sends from the reload on",
					o.Algorithm, o.Per(), o.Buckets, r.Algorithm, r.Per(), r.Buckets))
			case r.BucketCapacity() < o.BucketCapacity():
				why = append(why, fmt.Sprintf("capacity lowered from %d to %d: a bucket fuller than that reads as full", o.BucketCapacity(), r.BucketCapacity()))
			case r.Borrow < o.Borrow:
				why = append(why, fmt.Sprintf("borrow lowered from %d to %d: a stored debt above %d is forgiven down to it", o.Borrow, r.Borrow, r.Borrow))
			}
		} else {
			if w := r.WindowMillis(); w > span[r.Scope] {
				why = append(why, fmt.Sprintf("window %v is longer than the %v of %s history records kept", r.Window, time.Duration(span[r.Scope])*time.Millisecond, r.Scope))
			}
			if r.Limit > limit[r.Scope] {
				why = append(why, fmt.Sprintf("limit %d is above the %d %s sends records kept", r.Limit, limit[r.Scope], r.Scope))
			}
		}
		if len(why) > 0 {
			out = append(out, ruleGrowth{r.Name, strings.Join(why, "; ")})
		}
	}
	slices.SortFunc(out, func(a, b ruleGrowth) int { return strings.Compare(a.rule, b.rule) })
	return out
}

// RuleSet returns the rules in force: those of Config, or of the last
// successful Reload. Safe for concurrent use.
func (n *Node) RuleSet() *rules.Set { return n.view.Load().rules }
