package node

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/freqring/freqring/ring"
	"google.golang.org/grpc/codes"
)

// History moves with ownership. This file is each partition's state on
// this node (partState, in handoff, under one lock) and its opening and
// closing; mover.go acquires and fills, handback.go hands back, majority.go
// judges rule 5, and peerrpc.go answers the peer calls. The rules, in the
// words of that code:
//
//  1. A node decides for partition p only while p is open in its store, and
//     it opens p only once it owns p under its current ring and has
//     acquired p under that ring.
//  2. To acquire p, the owner asks the other members (Acquire), all of
//     them when p is new to it or was closed, only the members that
//     appeared when p stayed open. Each member closes p (in the same hold of
//     the partition's lock) and returns its copy; the owner merges every copy
//     (a set union of sends), logs the merge to its WAL, fills p's backup
//     (Fill) and opens p. A member answers only a caller that owns p under a
//     ring of the same epoch as its own, so the old owner has closed p before
//     the new one opens it, and nobody decides from a record that may be
//     missing sends.
//  3. With replication, every send the owner admits is on p's backup, in its
//     store and WAL, before the reply (replica.go); a backup takes sends only
//     from p's owner under its own ring, and none of a partition it has
//     open or owes (rule 7): the owner's record lacks what it decided.
//     So when the owner dies,
//     the backup, which becomes the owner, already holds every admitted send,
//     and an old owner that has not heard of a new ring cannot admit once the
//     backup has (the backup checks ownership under its own ring).
//  4. A leaving node announces "leaving" (out of every ring, still reachable)
//     and waits until the new owners of its partitions have acquired them.
//  5. A node decides only while its ring holds a majority of the members it
//     has seen serving (members that left gracefully no longer count, nor do
//     members gone for Config.ForgetDeadAfter, counted from when they were
//     last present, which the mover notes every ForgetDeadAfter/4; seen
//     by its gossip, even if this node had not looked yet, and remembered
//     across restarts in the data directory, members.go): a node cut off
//     from the majority closes every partition (and a ring the mover has
//     not judged yet is judged where it is decided under, majorityUnder),
//     so the two sides of a network partition shorter than ForgetDeadAfter
//     never both decide for one; when it heals, the minority's partitions
//     are acquired again (rule 2), which merges what both sides hold.
//     Exactly half is a majority for the half that holds the member whose
//     name sorts first among those counted. The halves may not count the
//     same members for a moment (one counts a member that rejoined before
//     the other does), so a node that lost a tie acquires only with the
//     winner among those asked (tieWinner).
//  6. Only members that agree with the ring on rules, protocol and placement
//     are in it (gossip.Agreement): one whose rules differ owns nothing,
//     forwards its callers' checks, and is asked for its partitions like a
//     leaving member, so a rules change never has two rule sets deciding for
//     one partition (docs/cluster.md, "Changing the rules of a cluster").
//  7. A node that decided for a partition and finds it owned by another
//     under its new ring hands it back (Peer.Handback): the owner closes it
//     and acquires it again from every member. Members see rings at
//     different moments, and an owner whose own ring never changed (others
//     saw it gone for ForgetDeadAfter and took its partitions over, then
//     saw it back) would otherwise never ask for what they decided. Until
//     the owner has acquired it, the node keeps the partition (a drain
//     waits for it too) and tells the owner again after each failure, each
//     new ring and every handbackResend until the owner has acquired it,
//     from a loop of its own (handbackLoop), so that a slow owner never
//     holds up the mover. A handback names the generation of each partition (how
//     many times its sender opened it); an owner that merged the sender's
//     copy at that generation and kept the partition open since skips it,
//     so the usual race of a ring change (the old owner hands back what the
//     new one is acquiring from it) costs no second move. A move that was
//     under way when a handback came may not have asked its sender, who was
//     perhaps not even a member when the move began: it does not open the
//     partition (finishMove), and the mover acquires it again. A
//     node never drops, on a Release, a partition it owes.
//  8. A backup takes an owner's sends of p only if that owner has acquired
//     p from it since the owner was last out of the backup's ring (a
//     departure its gossip saw, however brief; a restart of the backup
//     counts as one). An owner that froze (SIGSTOP, a long pause) while the
//     others saw it gone and decided for its partitions wakes with p still
//     open and its ring unchanged: rule 7's handback reaches it only after
//     the rings agree again, and meanwhile its backup, whose ring makes it
//     the owner again, would take what it decides from a record that lacks
//     the others' sends. The backup refuses them with ABORTED (refuseAsBackup);
//     the owner closes each partition of the refused call and acquires it
//     again from every member (reacquire), which the backup then sees.

// MoveWait bounds how long a check waits for its partition to be acquired
// by this node, its new owner, before it fails as retryable.
const MoveWait = 2 * time.Second

// handoff is a node's partition ownership and move state: one partState per
// ring partition, the rule-5 majority, and the mover's bookkeeping. Its
// methods are safe for concurrent use.
type handoff struct {
	// mu guards every field of parts but open, and prev, boots,
	// handbackEpoch, changed, counted, seen, tieWinner and savedMembers.
	mu    sync.Mutex
	parts []partState // by ring partition

	prev          *ring.Ring        // the ring of the last reconcile
	boots         map[string]uint64 // member -> boot id, as of the last reconcile
	handbackEpoch uint64            // the ring under which handbackAt was last cleared
	kick          chan struct{}     // wakes the mover
	hbKick        chan struct{}     // wakes the handback loop
	changed       chan struct{}     // closed (and replaced) when the mover sees a new ring
	leaving       atomic.Bool       // set by drain

	// Majority (rule 5): counted holds the members seen serving that have
	// not announced leaving since, with when each was last present; seen is
	// its size.
	counted  electorate
	seen     int
	majority atomic.Bool // the ring holds more than half of seen
	// judged is the last reconcile's verdict on rule 5 and what it judged
	// on (see majorityUnder); majority is the same verdict.
	judged atomic.Pointer[judgement]
	// majorityLosses counts the times majority turned false (not leaving).
	majorityLosses atomic.Int64
	// tieWinner is the member that won the last tie this node lost (rule 5:
	// half of seen, and the first name out of this node's ring), while it is
	// still counted. It may have decided alone since, with no backup: until
	// it is forgotten or leaves, a partition that must be asked of every
	// member is acquired only with it among those asked (tieWaits counts the
	// acquisitions that waited for it). The two halves of a tie need not
	// count the same members: one may count again a member that left and
	// rejoined before the other has, and hold a majority beside the winner.
	tieWinner string
	tieWaits  atomic.Int64
	// savedMembers is what the data directory last got of counted's names,
	// sorted (members.go); only the mover uses it.
	savedMembers []string

	moves, movedRecords, movedBytes, releases atomic.Int64
	longestPause                              atomic.Int64 // the longest closedAt-to-open, ns, since start
}

// partState is one ring partition's ownership and move state on this
// node. handoff.mu guards every field but open.
type partState struct {
	// open is whether the partition is open in the store (this node
	// decides for it): a hint read without the lock (waitMoving); the
	// store's own flag, set in the same hold of mu, is the fence.
	open   atomic.Bool
	opened chan struct{} // closed when it opens; replaced when it closes

	// What the next move of it must do: pull from every member (pullAll),
	// else from the members in from (they appeared since it opened), and
	// fill its backup (fill) before it opens.
	pullAll bool
	from    map[string]bool
	fill    bool
	// handed is set when an Acquire closed it here (drain watches this).
	handed bool
	// owed is whether this node decided for it under a ring that no longer
	// makes it the owner, and the owner has not acquired it from here
	// since (rule 7); handbackAt is when the owner under the ring of
	// handoff.handbackEpoch was last told (zero: not yet).
	owed       bool
	handbackAt time.Time
	// handbacks counts the handbacks this node took for it as its owner. A
	// move that began before one arrived may not have asked its sender (it
	// may not even have been a member then), so it must not open it (see
	// finishMove).
	handbacks uint64
	// gen counts the times this node opened it, from a random start (so
	// that a restarted node's counts do not repeat); pulledGen is, per
	// member, the gen of the member's copy this node last merged: a
	// handback at that gen brings nothing new.
	gen       uint64
	pulledGen map[string]uint64
	// closedAt is since when it is owned here but closed (zero: open, or
	// not owned), for the longest pause.
	closedAt time.Time
	// acquirer is the member that last acquired it from here, and
	// acquirerDepartures how many times this node's gossip had seen that
	// member leave or fail then (gossip.Membership.Departures): as its
	// backup, this node takes the acquirer's sends only while the count is
	// unchanged (rule 8).
	acquirer           string
	acquirerDepartures uint64
}

func newHandoff(parts int) *handoff {
	h := &handoff{parts: make([]partState, parts), boots: map[string]uint64{}, kick: make(chan struct{}, 1), hbKick: make(chan struct{}, 1),
		counted: electorate{}, changed: make(chan struct{})}
	h.majority.Store(true)
	base := rand.Uint64() >> 1 // room to count opens
	for p := range h.parts {
		ps := &h.parts[p]
		ps.gen = base
		ps.opened = make(chan struct{})
		ps.open.Store(true) // stores start open
	}
	return h
}

// isOpen reports whether p was open when last opened or closed here.
func (h *handoff) isOpen(p int) bool { return h.parts[p].open.Load() }

// wake asks the mover to reconcile.
func (h *handoff) wake() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// openCh returns the channel closed when partition p next opens.
func (h *handoff) openCh(p int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.parts[p].opened
}

// ringChanged returns the channel closed when the mover next sees a new ring.
func (h *handoff) ringChanged() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// openPartition opens p in the store and wakes its waiters.
func (n *Node) openPartition(p int) {
	n.ho.mu.Lock()
	defer n.ho.mu.Unlock()
	n.openLocked(p)
}

// finishMove ends the move of p that asked under the ring of epoch, with
// handbacks read from h.parts[p].handbacks as it chose whom to ask: it opens p
// (reporting true), or, if p stayed open, clears what was left to do for
// it. It fails, changing nothing, if this node has taken a handback of p
// since (the move may have missed the sender's copy:
// errHandedBackDuringMove) or its ring is no longer that of epoch
// (errRingMoved); the mover then acquires p again. The checks and the open
// are one hold of h.mu, as Handback's count.
func (n *Node) finishMove(p int, handbacks, epoch uint64) (bool, error) {
	h := n.ho
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parts[p].handbacks != handbacks {
		return false, errHandedBackDuringMove
	}
	if e := n.clus.Load().ring().Epoch(); e != epoch {
		return false, fmt.Errorf("%w: from epoch %d to %d", errRingMoved, epoch, e)
	}
	if n.store.IsOpen(p) {
		h.parts[p].pullAll, h.parts[p].from, h.parts[p].fill = false, nil, false
		return false, nil
	}
	n.openLocked(p)
	return true, nil
}

// openLocked opens p; h.mu is held.
func (n *Node) openLocked(p int) {
	n.store.Open(p)
	h := n.ho
	h.parts[p].open.Store(true)
	select {
	case <-h.parts[p].opened:
	default:
		close(h.parts[p].opened)
	}
	if !h.parts[p].closedAt.IsZero() {
		pause := int64(time.Since(h.parts[p].closedAt))
		for old := h.longestPause.Load(); pause > old && !h.longestPause.CompareAndSwap(old, pause); old = h.longestPause.Load() {
		}
		h.parts[p].closedAt = time.Time{}
	}
	h.parts[p].pullAll, h.parts[p].from, h.parts[p].fill = false, nil, false
	h.parts[p].owed = false // it decides here again, with what it held
	h.parts[p].gen++
}

// closePartition closes p in the store; checks on it wait for its next open.
func (n *Node) closePartition(p int) {
	n.ho.mu.Lock()
	defer n.ho.mu.Unlock()
	n.closeLocked(p)
}

// closeOwing closes p if it is open and then owes it (rule 7): this node
// decided for it, and no owner has acquired it since. The check, the close
// and the debt are one hold of h.mu, as Acquire's record of a hand-over
// and recordReplicated's check: an Acquire that closed p first leaves it
// handed over, never owed (an owner that pulled it would skip the handback
// as already merged, and the backup would refuse its sends for good).
func (n *Node) closeOwing(p int) {
	h := n.ho
	h.mu.Lock()
	defer h.mu.Unlock()
	if !n.store.IsOpen(p) {
		return
	}
	n.closeLocked(p)
	h.parts[p].owed, h.parts[p].handed = true, false
}

// closeLocked closes p; h.mu is held.
func (n *Node) closeLocked(p int) {
	n.store.Close(p)
	h := n.ho
	h.parts[p].open.Store(false)
	select {
	case <-h.parts[p].opened:
		h.parts[p].opened = make(chan struct{})
	default:
	}
}

// owes reports whether this node owes partition p to its owner (rule 7):
// it decided for p under a ring that no longer makes it the owner, and the
// owner has not acquired p from here since. h.mu is held.
func (h *handoff) owes(p int) bool { return h.parts[p].owed && !h.parts[p].handed }

// wakeHandback asks the handback loop to look for partitions to hand back.
func (h *handoff) wakeHandback() {
	select {
	case h.hbKick <- struct{}{}:
	default:
	}
}

// errRingMoved fails a partition whose move the ring overtook before it
// opened: the move asked the members of a ring that is gone.
var errRingMoved = errors.New("the ring changed during its move")

// errHandedBackDuringMove fails a partition whose move a handback overtook
// (see finishMove); the mover acquires it again from every member.
var errHandedBackDuringMove = errors.New("handed back during its move: acquiring it again from every member")

// where is an item's verdict: where it is answered.
type where uint8

const (
	rejected    where = iota // decoding refused it: item.err says why
	decidedHere              // this node answers it (decide), perhaps with an error judge set
	forwardedTo              // its owner answers it (route): item.owner
)

// judge gives each item of b its verdict under ring r, at the one place a
// check judges ownership: forwarded to its owner, or decided here. An item
// decided here fails (item.err) when the node lacks a majority (rule 5)
// or, in a forwarded call (which never forwards again), when another member
// owns it under r. A call routes only if some member other than this one
// is in r; otherwise everything is decided here, where a closed partition
// (the store's fence) fails as moving. It reports whether any item is
// forwarded (remote), and whether any is decided here (local).
func (n *Node) judge(b *batch, r *ring.Ring, forwarded bool) (remote, local bool) {
	self := n.cfg.Name
	// A ring of one other member (this node left out of it, or seeing only
	// that member for a moment) owns everything elsewhere: this node
	// decides nothing it does not own under its ring (rule 1).
	routes := !forwarded && (r.Len() > 1 || r.Len() == 1 && !r.Has(self))
	majority := n.clus.Load().ms == nil || n.ho.majorityUnder(r)
	var noMajority *itemError
	for i := range b.items {
		x := &b.items[i]
		if x.err != nil {
			x.where = rejected
			continue
		}
		x.owner = r.PartitionOwner(x.part)
		switch {
		case routes && x.owner.Name != self:
			x.where, remote = forwardedTo, true
			continue
		case !majority:
			if noMajority == nil {
				noMajority = &itemError{code: codes.Unavailable, msg: fmt.Sprintf("node %s sees %d members, not a majority of the cluster: it decides nothing until the cluster heals; retry", self, r.Len())}
			}
			x.where, x.err = decidedHere, noMajority
		case forwarded && x.owner.Name != self:
			x.where, x.err = decidedHere, &itemError{code: codes.Unavailable, msg: fmt.Sprintf("recipient %s: node %s does not own it under ring epoch %d (owner %s); retry with the new ring",
				quote(b.req.Recipients[i]), self, r.Epoch(), x.owner.Name)}
		default:
			x.where = decidedHere
		}
		local = true // every case but the first decides here
	}
	return remote, local
}
