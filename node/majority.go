package node

import (
	"maps"
	"time"

	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
)

// This file is rule 5 (partition.go): a node decides only while its ring
// holds a majority of the members it counts. The verdict is hasMajority, a
// pure function; the electorate is what it counts.

// judgement is what a reconcile judged rule 5 on, and its verdict.
type judgement struct {
	ok    bool   // a majority: the node may decide
	epoch uint64 // the ring's
	seen  int    // members counted
	first string // the counted member whose name sorts first
}

// majorityUnder reports whether this node may decide under ring r (rule 5).
// Gossip hands a new ring to deciding goroutines before the mover judges
// it, and on a starved machine the mover can lag: a node whose ring shrank
// to itself would decide for the partitions it has open, with no backup to
// fence it, while the rest of the cluster has taken them over. So under a
// ring the last reconcile did not judge, it judges again against the
// members that reconcile counted: a ring that lost members may have lost
// the majority. Members that joined since count on both sides, so a
// growing ring keeps it. Safe for concurrent use.
func (h *handoff) majorityUnder(r *ring.Ring) bool {
	j := h.judged.Load()
	switch {
	case j == nil: // no reconcile yet: every partition is closed
		return h.majority.Load()
	case !j.ok:
		return false
	case j.epoch == r.Epoch():
		return true
	}
	ok, _ := hasMajority(r.Len(), j.seen, r.Has(j.first))
	return ok
}

// electorate is the members rule 5 counts, with when each was last
// present: those seen serving, or in the ring, that have not announced
// leaving since and have not been gone for ForgetDeadAfter. A node may
// decide only while its ring holds a majority of them.
type electorate map[string]time.Time

// note counts the members present at now: serving ones and ring members
// count from now on, members that announced leaving no longer count, and
// counted ones still present (restarting) stay counted as of now. What
// gossip saw between two looks counts too (departed): a member it saw
// serving and then lost counts as of then, even if this node never saw it
// present (a starved node's gossip can mark every member failed between its
// join and the node's first look), and one that announced leaving and left
// no longer counts.
func (e electorate) note(members []gossip.MemberState, departed map[string]gossip.Departure, ring []ring.Member, now time.Time) {
	for name, d := range departed {
		if d.Leaving {
			delete(e, name)
		} else if last, ok := e[name]; !ok || last.Before(d.At) {
			e[name] = d.At
		}
	}
	for _, m := range members {
		switch m.State {
		case gossip.StateServing:
			e[m.Name] = now
		case gossip.StateLeaving:
			delete(e, m.Name)
		default:
			if _, ok := e[m.Name]; ok {
				e[m.Name] = now // present, restarting
			}
		}
	}
	for _, m := range ring {
		e[m.Name] = now
	}
}

// forget stops counting the members last present more than after before
// now: a member gone for ForgetDeadAfter.
func (e electorate) forget(now time.Time, after time.Duration) {
	for name, at := range e {
		if now.Sub(at) > after {
			delete(e, name)
		}
	}
}

// first returns the counted name that sorts first, "" if none: the winner
// of a tie.
func (e electorate) first() string {
	first := ""
	for k := range e {
		if first == "" || k < first {
			first = k
		}
	}
	return first
}

// hasMajority is rule 5's verdict on a ring of ringLen members, seen of
// them counted: it may decide if it holds more than half of them (majority)
// or exactly half (tie) and the counted member whose name sorts first
// (holdsFirst): both halves of an even split count the same members, so at
// most one of them decides.
func hasMajority(ringLen, seen int, holdsFirst bool) (majority, tie bool) {
	tie = ringLen*2 == seen
	return ringLen*2 > seen || tie && holdsFirst, tie
}

// departedSince returns the members c's gossip saw vanish
// (gossip.Membership.Departed) less than ForgetDeadAfter before now.
func (n *Node) departedSince(c *cluster, now time.Time) map[string]gossip.Departure {
	d := c.ms.Departed()
	maps.DeleteFunc(d, func(_ string, g gossip.Departure) bool { return now.Sub(g.At) > n.cfg.ForgetDeadAfter })
	return d
}
