package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
)

// This file moves history with ownership. The rules, in the words of the
// code below:
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

// MoveWait bounds how long a check waits for its partition to be acquired
// by this node, its new owner, before it fails as retryable.
const MoveWait = 2 * time.Second

// acquireRetry is the pause before an acquisition that failed is tried again
// under the same ring.
const acquireRetry = 100 * time.Millisecond

// acquireBatch bounds the partitions one Acquire or Fill call carries.
const acquireBatch = 16

// handoff is a node's partition-move state. Its methods are safe for
// concurrent use.
type handoff struct {
	mu      sync.Mutex
	opened  []chan struct{}   // per partition: closed when it opens; replaced when it closes
	prev    *ring.Ring        // the ring of the last reconcile
	boots   map[string]uint64 // member -> boot id, as of the last reconcile
	pullAll []bool            // per partition: pull from every member (else from appeared ones)
	from    []map[string]bool // per partition: members to pull from, when !pullAll
	fill    []bool            // per partition: fill the backup before opening
	handed  []bool            // per partition: an Acquire closed it here (drain watches this)
	// owed is, per partition, whether this node decided for it under a ring
	// that it no longer owns it in and its owner has not acquired it from
	// here since (rule 7); handbackAt, when the owner under the ring of
	// handbackEpoch was last told (zero: not yet).
	owed          []bool
	handbackAt    []time.Time
	handbackEpoch uint64
	// handbacks counts, per partition, the handbacks this node took as its
	// owner. A move that began before one arrived may not have asked its
	// sender (it may not even have been a member then), so it must not
	// open the partition (see finishMove).
	handbacks []uint64
	// gen counts, per partition, the times this node opened it, from a
	// random start (so that a restarted node's counts do not repeat);
	// pulledGen is, per partition and member, the gen of the member's copy
	// this node last merged: a handback at that gen brings nothing new.
	gen       []uint64
	pulledGen []map[string]uint64
	open      []atomic.Bool // per partition: open in the store (a hint for waitMoving)
	kick      chan struct{} // wakes the mover
	hbKick    chan struct{} // wakes the handback loop
	changed   chan struct{} // closed (and replaced) when the mover sees a new ring
	leaving   atomic.Bool   // set by drain

	// Majority (rule 5): counted holds the members seen serving that have
	// not announced leaving since, with when each was last present; seen is
	// its size.
	counted  map[string]time.Time
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
	closedAt                                  []time.Time  // per partition: since when it is owned here but closed (zero: open, or not owned)
	longestPause                              atomic.Int64 // the longest closedAt-to-open, ns, since start
}

func newHandoff(parts int) *handoff {
	h := &handoff{
		opened: make([]chan struct{}, parts), pullAll: make([]bool, parts), from: make([]map[string]bool, parts),
		fill: make([]bool, parts), handed: make([]bool, parts), owed: make([]bool, parts), handbackAt: make([]time.Time, parts), handbacks: make([]uint64, parts),
		gen: make([]uint64, parts), pulledGen: make([]map[string]uint64, parts), open: make([]atomic.Bool, parts), boots: map[string]uint64{}, kick: make(chan struct{}, 1), hbKick: make(chan struct{}, 1),
		counted: map[string]time.Time{}, closedAt: make([]time.Time, parts), changed: make(chan struct{}),
	}
	h.majority.Store(true)
	base := rand.Uint64() >> 1 // room to count opens
	for p := range h.gen {
		h.gen[p] = base
	}
	for p := range h.opened {
		h.opened[p] = make(chan struct{})
		h.open[p].Store(true) // stores start open
	}
	return h
}

// isOpen reports whether p was open when last opened or closed here.
func (h *handoff) isOpen(p int) bool { return h.open[p].Load() }

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
	return h.opened[p]
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
// handbacks read from h.handbacks[p] as it chose whom to ask: it opens p
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
	if h.handbacks[p] != handbacks {
		return false, errHandedBackDuringMove
	}
	if e := n.clus.Load().ring().Epoch(); e != epoch {
		return false, fmt.Errorf("%w: from epoch %d to %d", errRingMoved, epoch, e)
	}
	if n.store.IsOpen(p) {
		h.pullAll[p], h.from[p], h.fill[p] = false, nil, false
		return false, nil
	}
	n.openLocked(p)
	return true, nil
}

// openLocked opens p; h.mu is held.
func (n *Node) openLocked(p int) {
	n.store.Open(p)
	h := n.ho
	h.open[p].Store(true)
	select {
	case <-h.opened[p]:
	default:
		close(h.opened[p])
	}
	if !h.closedAt[p].IsZero() {
		pause := int64(time.Since(h.closedAt[p]))
		for old := h.longestPause.Load(); pause > old && !h.longestPause.CompareAndSwap(old, pause); old = h.longestPause.Load() {
		}
		h.closedAt[p] = time.Time{}
	}
	h.pullAll[p], h.from[p], h.fill[p] = false, nil, false
	h.owed[p] = false // it decides here again, with what it held
	h.gen[p]++
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
	h.owed[p], h.handed[p] = true, false
}

// closeLocked closes p; h.mu is held.
func (n *Node) closeLocked(p int) {
	n.store.Close(p)
	h := n.ho
	h.open[p].Store(false)
	select {
	case <-h.opened[p]:
		h.opened[p] = make(chan struct{})
	default:
	}
}

// moverLoop reconciles the node's partitions with each new ring, and again
// after a failed acquisition, until ctx is done.
func (n *Node) moverLoop(ctx context.Context, rings <-chan *ring.Ring) {
	var cur *ring.Ring
	var retry <-chan time.Time
	var failingSince time.Time
	// Rule 5 forgets members gone for ForgetDeadAfter: look again now and
	// then, not only on ring changes.
	tick := time.NewTicker(max(n.cfg.ForgetDeadAfter/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if n.ho.majority.Load() {
				// Keep the members present counted as of now, so that
				// one that vanishes is forgotten ForgetDeadAfter later,
				// not at the first reconcile after a quiet spell.
				if c := n.clus.Load(); c != nil && c.ms != nil && cur != nil {
					now := time.Now()
					n.ho.mu.Lock()
					n.ho.countPresent(c.ms.Members(), n.departedSince(c, now), cur, now)
					n.ho.mu.Unlock()
					n.saveMembers()
				}
				continue
			}
		case r, ok := <-rings:
			if !ok {
				return
			}
			cur = r
		case <-n.ho.kick:
		case <-retry:
		}
		retry = nil
		if cur == nil {
			continue
		}
		err := n.reconcile(ctx, cur)
		n.saveMembers()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Until rings agree, acquisitions are refused: expected for a
			// moment after every change, worth a warning after seconds.
			level := slog.LevelDebug
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > 5*time.Second {
				level = slog.LevelWarn
			}
			n.log.Log(ctx, level, "partition moves incomplete; retrying", "epoch", cur.Epoch(), "failing_for", time.Since(failingSince), "err", err)
			retry = time.After(acquireRetry)
		} else {
			failingSince = time.Time{}
		}
	}
}

// reconcile brings the node's partitions in line with ring r: it closes what
// it does not own, and acquires (rule 2) what it owns and has not acquired
// under r. It returns an error if some partition is left closed.
func (n *Node) reconcile(ctx context.Context, r *ring.Ring) error {
	c := n.clus.Load()
	self := c.self.Name
	h := n.ho
	members := c.ms.Members()
	boots := map[string]uint64{}
	for _, m := range members {
		boots[m.Name] = m.Boot
	}
	// Members that appeared since the last reconcile: new in the ring, or
	// restarted (a new boot id) under a name already there.
	appeared := map[string]bool{}
	h.mu.Lock()
	prev := h.prev
	for _, m := range r.Members() {
		if m.Name == self {
			continue
		}
		if b, ok := h.boots[m.Name]; !ok || b != boots[m.Name] || prev == nil || !prev.Has(m.Name) {
			appeared[m.Name] = true
		}
	}
	if prev == nil || prev.Epoch() != r.Epoch() {
		close(h.changed)
		h.changed = make(chan struct{})
	}
	h.prev, h.boots = r, boots
	// Rule 5: a member counts once seen serving, until it announces that
	// it is leaving; one that vanished without leaving still counts.
	// A member gone for ForgetDeadAfter no longer counts either.
	nowT := time.Now()
	h.countPresent(members, n.departedSince(c, nowT), r, nowT)
	for name, at := range h.counted {
		if nowT.Sub(at) > n.cfg.ForgetDeadAfter {
			delete(h.counted, name)
		}
	}
	h.seen = len(h.counted)
	// A tie (half of seen) goes to the half that holds the member whose name
	// sorts first among those counted: both halves of an even split count
	// the same members, so at most one of them decides.
	majority := r.Len()*2 > h.seen || r.Len()*2 == h.seen && r.Has(minKey(h.counted))
	if w := minKey(h.counted); !majority && r.Len()*2 == h.seen && w != self {
		h.tieWinner = w
	}
	if _, ok := h.counted[h.tieWinner]; !ok {
		h.tieWinner = "" // forgotten, or left gracefully
	}
	h.judged.Store(&judgement{ok: majority, epoch: r.Epoch(), seen: h.seen, first: minKey(h.counted)})
	h.mu.Unlock()
	if h.majority.Swap(majority) != majority {
		if majority {
			n.log.Info("majority regained: acquiring partitions again", "ring", r.Len(), "seen", h.seen)
		} else if !h.leaving.Load() && r.Len() > 0 { // an empty ring: this node is closing
			h.majorityLosses.Add(1)
			n.log.Warn("majority lost: deciding nothing until the cluster heals", "ring", r.Len(), "seen", h.seen)
		}
	}
	if !majority {
		for p := range n.store.Partitions() {
			n.closeOwing(p) // rule 7, if another owns it once the cluster heals
		}
		return nil
	}

	var work []int
	owes := false // rule 7: handbacks for the handback loop to send
	for p := range n.store.Partitions() {
		owner := r.PartitionOwner(p).Name == self
		if !owner {
			n.closeOwing(p)
			h.mu.Lock()
			h.closedAt[p] = time.Time{}
			owes = owes || h.owes(p)
			h.mu.Unlock()
			continue
		}
		backup, hasBackup := r.PartitionReplica(p)
		var prevBackup ring.Member
		prevHas := false
		if prev != nil {
			prevBackup, prevHas = prev.PartitionReplica(p)
		}
		h.mu.Lock()
		switch {
		case !n.store.IsOpen(p):
			h.pullAll[p] = true
		case len(appeared) > 0:
			if h.from[p] == nil {
				h.from[p] = map[string]bool{}
			}
			for m := range appeared {
				h.from[p][m] = true
			}
		}
		if hasBackup && (!prevHas || prevBackup.Name != backup.Name || appeared[backup.Name] || !n.store.IsOpen(p)) {
			h.fill[p] = true
		}
		needs := h.pullAll[p] || len(h.from[p]) > 0 || h.fill[p]
		if h.pullAll[p] && h.closedAt[p].IsZero() {
			h.closedAt[p] = time.Now()
		}
		h.mu.Unlock()
		if needs {
			// An open partition stays open while members that appeared are
			// asked for it (they decided nothing for it: rule 5); one whose
			// backup must be filled closes when its fill starts.
			work = append(work, p)
		}
	}
	if owes {
		h.wakeHandback()
	}
	if len(work) == 0 {
		return nil
	}
	return n.acquire(ctx, r, work, members)
}

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
	return r.Len()*2 > j.seen || r.Len()*2 == j.seen && r.Has(j.first)
}

// countPresent notes the members present at now for rule 5: serving ones
// and ring members count from now on, members that announced leaving no
// longer count, and counted ones still present (restarting) stay counted as
// of now. What gossip saw between two looks counts too (departed): a member
// it saw serving and then lost counts as of then, even if this node never
// saw it present (a starved node's gossip can mark every member failed
// between its join and the node's first look), and one that announced
// leaving and left no longer counts. h.mu is held.
func (h *handoff) countPresent(members []gossip.MemberState, departed map[string]gossip.Departure, r *ring.Ring, now time.Time) {
	for name, d := range departed {
		if d.Leaving {
			delete(h.counted, name)
		} else if last, ok := h.counted[name]; !ok || last.Before(d.At) {
			h.counted[name] = d.At
		}
	}
	for _, m := range members {
		switch m.State {
		case gossip.StateServing:
			h.counted[m.Name] = now
		case gossip.StateLeaving:
			delete(h.counted, m.Name)
		default:
			if _, ok := h.counted[m.Name]; ok {
				h.counted[m.Name] = now // present, restarting
			}
		}
	}
	for _, m := range r.Members() {
		h.counted[m.Name] = now
	}
}

// departedSince returns the members c's gossip saw vanish
// (gossip.Membership.Departed) less than ForgetDeadAfter before now.
func (n *Node) departedSince(c *cluster, now time.Time) map[string]gossip.Departure {
	d := c.ms.Departed()
	maps.DeleteFunc(d, func(_ string, g gossip.Departure) bool { return now.Sub(g.At) > n.cfg.ForgetDeadAfter })
	return d
}

// owes reports whether this node owes partition p to its owner (rule 7):
// it decided for p under a ring that no longer makes it the owner, and the
// owner has not acquired p from here since. h.mu is held.
func (h *handoff) owes(p int) bool { return h.owed[p] && !h.handed[p] }

// wakeHandback asks the handback loop to look for partitions to hand back.
func (h *handoff) wakeHandback() {
	select {
	case h.hbKick <- struct{}{}:
	default:
	}
}

// handbackResend is how long a node that told an owner of a partition it
// owes (rule 7) waits for the owner to acquire it before telling it again
// under the same ring: a handback the owner took can still be lost to it
// (a move that began before it and could not ask this node), and a
// partition never acquired from here is lost when this node leaves.
const handbackResend = time.Second

// handbackLoop sends the handbacks of rule 7 apart from the mover, so that a
// slow or unreachable owner never holds up this node's own moves: on each
// wake-up and new ring, after a failure every acquireRetry, and every
// handbackResend while an owner has not acquired what it was told of, it
// tells each owner under the current ring of the partitions this node owes
// it, until ctx is done.
func (n *Node) handbackLoop(ctx context.Context) {
	h := n.ho
	var retry, resend <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.hbKick:
		case <-h.ringChanged():
		case <-retry:
		case <-resend:
		}
		retry, resend = nil, nil
		c := n.clus.Load()
		r := c.ring()
		owedTo := map[string][]uint32{}
		waiting := false // told, not yet acquired
		now := time.Now()
		h.mu.Lock()
		if h.handbackEpoch != r.Epoch() {
			h.handbackEpoch = r.Epoch()
			clear(h.handbackAt)
		}
		for p := range n.store.Partitions() {
			if !h.owes(p) {
				continue
			}
			if at := h.handbackAt[p]; !at.IsZero() && now.Sub(at) < handbackResend {
				waiting = true
				continue
			}
			if o := r.PartitionOwner(p).Name; o != "" && o != c.self.Name {
				owedTo[o] = append(owedTo[o], uint32(p))
			}
		}
		h.mu.Unlock()
		if waiting || len(owedTo) > 0 {
			resend = time.After(handbackResend)
		}
		if len(owedTo) == 0 {
			continue
		}
		if err := n.handback(ctx, r, owedTo); err != nil && ctx.Err() == nil {
			n.log.Debug("handbacks incomplete; retrying", "epoch", r.Epoch(), "err", err)
			retry = time.After(acquireRetry)
		}
	}
}

// handback tells each owner under r of the partitions this node decided for
// and no longer owns (rule 7); a failure is retried with the reconcile.
func (n *Node) handback(ctx context.Context, r *ring.Ring, owedTo map[string][]uint32) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for name, parts := range owedTo {
		n.ho.mu.Lock()
		parts = slices.DeleteFunc(parts, func(p uint32) bool { return !n.ho.owes(int(p)) })
		n.ho.mu.Unlock()
		if len(parts) == 0 {
			continue
		}
		var m ring.Member
		for _, x := range r.Members() {
			if x.Name == name {
				m = x
			}
		}
		wg.Go(func() {
			err := func() error {
				cli, err := n.peers.Peer(m)
				if err != nil {
					return err
				}
				hctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
				defer cancel()
				req := &pb.HandbackRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), Partitions: parts}
				n.ho.mu.Lock()
				for _, p := range parts {
					req.Generations = append(req.Generations, n.ho.gen[p])
				}
				n.ho.mu.Unlock()
				_, err = cli.Handback(hctx, req)
				return err
			}()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("handing %d partitions back to %s: %w", len(parts), name, err))
				return
			}
			now := time.Now()
			again := true // every partition was told before under this ring
			n.ho.mu.Lock()
			for _, p := range parts {
				again = again && !n.ho.handbackAt[p].IsZero()
				n.ho.handbackAt[p] = now
			}
			n.ho.mu.Unlock()
			level := slog.LevelInfo
			if again {
				level = slog.LevelDebug
			}
			n.log.Log(ctx, level, "partitions handed back: decided here under another ring", "to", name, "partitions", parts, "epoch", r.Epoch(), "again", again)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// acquire carries out rule 2 for partitions ps under ring r, a chunk of
// acquireBatch partitions at a time (moveWorkers chunks at once), so that
// each partition is closed only for the time of its own chunk.
func (n *Node) acquire(ctx context.Context, r *ring.Ring, ps []int, members []gossip.MemberState) error {
	start := time.Now()
	self := n.clus.Load().self.Name
	// Who to ask: every other member of the ring, members leaving (out of
	// the ring, still handing over), and serving members left out of the
	// ring because they disagree with it (their rules changed: they may hold
	// what they decided while they were in it).
	targets := map[string]ring.Member{}
	for _, m := range r.Members() {
		if m.Name != self {
			targets[m.Name] = m
		}
	}
	for _, m := range members {
		if (m.State == gossip.StateLeaving || m.Excluded != "") && m.Name != self {
			targets[m.Name] = ring.Member{Name: m.Name, Addr: m.GRPCAddr}
		}
	}
	var (
		mu         sync.Mutex // guards failed, pulledFrom and done
		done       []int      // partitions acquired, for the log
		failed     = map[int]error{}
		pulledFrom = map[string][]uint32{}
		records    atomic.Int64
		nbytes     atomic.Int64
		opened     atomic.Int64
	)
	n.ho.mu.Lock()
	if w := n.ho.tieWinner; w != "" && w != self {
		if _, asked := targets[w]; !asked {
			// Rule 5's tie: the partitions to be asked of every member
			// wait until the winner is here to be asked, or forgotten.
			kept := ps[:0:0]
			for _, p := range ps {
				if n.ho.pullAll[p] {
					failed[p] = fmt.Errorf("waiting for %s, which won the last tie this node lost (rule 5) and may have decided alone since: it must be asked, or forgotten after ForgetDeadAfter", w)
				} else {
					kept = append(kept, p)
				}
			}
			if len(kept) < len(ps) {
				n.ho.tieWaits.Add(1)
			}
			ps = kept
		}
	}
	n.ho.mu.Unlock()
	chunks := make(chan []int)
	var workers sync.WaitGroup
	for range moveWorkers {
		workers.Go(func() {
			for chunk := range chunks {
				errs, pulled := n.acquireChunk(ctx, r, chunk, targets, &records, &nbytes, &opened)
				mu.Lock()
				for p, err := range errs {
					failed[p] = err
				}
				for _, p := range chunk {
					if errs[p] == nil {
						done = append(done, p)
					}
				}
				for name, parts := range pulled {
					pulledFrom[name] = append(pulledFrom[name], parts...)
				}
				mu.Unlock()
			}
		})
	}
	for chunk := range slices.Chunk(ps, acquireBatch) {
		chunks <- chunk
	}
	close(chunks)
	workers.Wait()
	if o := opened.Load(); o > 0 || records.Load() > 0 {
		n.ho.moves.Add(o)
		n.ho.movedRecords.Add(records.Load())
		n.ho.movedBytes.Add(nbytes.Load())
		slices.Sort(done)
		n.log.Info("partitions acquired", "epoch", r.Epoch(), "partitions", len(done), "list", done, "opened", o,
			"records", records.Load(), "bytes", nbytes.Load(), "took", time.Since(start), "from", len(pulledFrom))
	}
	// Tell the members we pulled from that we hold it now (best effort).
	var wg sync.WaitGroup
	for name, parts := range pulledFrom {
		m := targets[name]
		wg.Go(func() {
			cli, err := n.peers.Peer(m)
			if err != nil {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
			defer cancel()
			cli.Release(rctx, &pb.ReleaseRequest{Node: self, RingEpoch: r.Epoch(), Partitions: parts})
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		var errs []error
		for p, err := range failed {
			errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
			if len(errs) == 3 {
				errs = append(errs, fmt.Errorf("and %d more", len(failed)-3))
				break
			}
		}
		return errors.Join(errs...)
	}
	return nil
}

// errRingMoved fails a partition whose move the ring overtook before it
// opened: the move asked the members of a ring that is gone.
var errRingMoved = errors.New("the ring changed during its move")

// errHandedBackDuringMove fails a partition whose move a handback overtook
// (see finishMove); the mover acquires it again from every member.
var errHandedBackDuringMove = errors.New("handed back during its move: acquiring it again from every member")

// moveWorkers is the number of chunks of partitions acquired at once.
const moveWorkers = 4

// acquireChunk acquires the partitions of one chunk: it closes those whose
// backup it fills, pulls from the members that must be asked, merges, fills
// the backup and opens what it closed. It returns the partitions that
// failed, and the partitions it pulled, by member, for Release.
func (n *Node) acquireChunk(ctx context.Context, r *ring.Ring, chunk []int, targets map[string]ring.Member,
	records, nbytes, opened *atomic.Int64) (map[int]error, map[string][]uint32) {
	h := n.ho
	failed := map[int]error{}
	ask := map[string][]int{}
	fillTo := map[string][]int{}
	handbacks := map[int]uint64{} // h.handbacks as the chunk decided whom to ask
	for _, p := range chunk {
		h.mu.Lock()
		handbacks[p] = h.handbacks[p]
		for name := range targets {
			if h.pullAll[p] || h.from[p][name] {
				ask[name] = append(ask[name], p)
			}
		}
		fill := h.fill[p]
		h.mu.Unlock()
		if b, ok := r.PartitionReplica(p); ok && fill && n.cfg.Replication != ReplicationOff {
			fillTo[b.Name] = append(fillTo[b.Name], p)
			if n.store.IsOpen(p) {
				h.mu.Lock()
				h.closedAt[p] = time.Now()
				h.mu.Unlock()
				n.closePartition(p)
			}
		}
	}
	var mu sync.Mutex // guards failed
	var wg sync.WaitGroup
	for name, parts := range ask {
		wg.Go(func() {
			got, nb, err := n.pullFrom(ctx, r, targets[name], parts)
			records.Add(got)
			nbytes.Add(nb)
			if err != nil {
				mu.Lock()
				for _, p := range parts {
					failed[p] = fmt.Errorf("acquiring from %s: %w", name, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fills := map[string][]int{} // what pulled completely, by backup; computed before any fill writes failed
	for name, parts := range fillTo {
		for _, p := range parts {
			if failed[p] == nil {
				fills[name] = append(fills[name], p)
			}
		}
	}
	for name, ok := range fills {
		wg.Go(func() {
			err := n.fillBackup(ctx, r, targets[name], ok)
			if err == nil {
				for _, p := range ok {
					n.unacked[p].Store(0) // the new backup holds every send
				}
			}
			if err != nil {
				mu.Lock()
				for _, p := range ok {
					failed[p] = fmt.Errorf("filling backup %s: %w", name, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, p := range chunk {
		if failed[p] != nil {
			continue
		}
		switch did, err := n.finishMove(p, handbacks[p], r.Epoch()); {
		case err != nil:
			failed[p] = err
		case did:
			opened.Add(1)
		}
	}
	pulled := map[string][]uint32{}
	for name, parts := range ask {
		for _, p := range parts {
			if failed[p] == nil {
				pulled[name] = append(pulled[name], uint32(p))
			}
		}
	}
	return failed, pulled
}

// pullFrom asks m for partitions ps (Acquire) and merges the images, logging
// them to the WAL. It returns the records merged and the image bytes.
func (n *Node) pullFrom(ctx context.Context, r *ring.Ring, m ring.Member, ps []int) (int64, int64, error) {
	cli, err := n.peers.Peer(m)
	if err != nil {
		return 0, 0, err
	}
	req := &pb.AcquireRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), ImageVersion: store.ImageVersion}
	for _, p := range ps {
		req.Partitions = append(req.Partitions, uint32(p))
	}
	actx, cancel := context.WithTimeout(ctx, ForwardTimeout)
	defer cancel()
	resp, err := cli.Acquire(actx, req)
	if err != nil {
		return 0, 0, err
	}
	want := map[int]bool{}
	for _, p := range ps {
		want[p] = true
	}
	records, nb, err := n.mergeImages(ctx, resp.Images, func(h store.ImageHeader) error {
		if !want[h.Partition] || h.Partitions != n.store.Partitions() {
			return fmt.Errorf("%s sent an image of partition %d of %d, not one asked for", m.Name, h.Partition, h.Partitions)
		}
		return nil
	})
	if err == nil && len(resp.Generations) == len(ps) {
		n.ho.mu.Lock()
		for i, p := range ps {
			if n.ho.pulledGen[p] == nil {
				n.ho.pulledGen[p] = map[string]uint64{}
			}
			n.ho.pulledGen[p][m.Name] = resp.Generations[i]
		}
		n.ho.mu.Unlock()
	}
	return records, nb, err
}

// fillBackup sends the images of partitions ps to m, their backup (Fill),
// in parts and as many calls as the request bound needs.
func (n *Node) fillBackup(ctx context.Context, r *ring.Ring, m ring.Member, ps []int) error {
	cli, err := n.peers.Peer(m)
	if err != nil {
		return err
	}
	var imgs [][]byte
	for _, p := range ps {
		img, _ := n.store.AppendImage(nil, p)
		imgs = append(imgs, img)
	}
	parts, err := n.splitImages(imgs)
	if err != nil {
		return err
	}
	for _, run := range groupImages(parts, n.cfg.Limits.MaxRequestBytes-peerMessageSlack) {
		fctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
		_, err = cli.Fill(fctx, &pb.FillRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), Images: run})
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// peerMessageSlack is what a peer message holds beside its images: names,
// epoch and framing.
const peerMessageSlack = 1 << 10

// imagePart returns the most bytes of one partition image in a peer message
// or a WAL record: 4 MiB, or a quarter of a request if that is less. Larger
// images travel in parts (store.SplitImage).
func (n *Node) imagePart() int { return min(4<<20, n.cfg.Limits.MaxRequestBytes/4) }

// splitImages returns imgs cut into parts of at most imagePart bytes.
func (n *Node) splitImages(imgs [][]byte) ([][]byte, error) {
	var parts [][]byte
	for _, img := range imgs {
		ps, err := store.SplitImage(img, n.imagePart())
		if err != nil {
			return nil, err
		}
		parts = append(parts, ps...)
	}
	return parts, nil
}

// groupImages returns imgs, in order, in runs of at most budget bytes each
// (with ~8 bytes of framing per image); an image larger than budget is a run
// of its own.
func groupImages(imgs [][]byte, budget int) [][][]byte {
	var runs [][][]byte
	var cur [][]byte
	size := 0
	for _, img := range imgs {
		if len(cur) > 0 && size+len(img)+8 > budget {
			runs = append(runs, cur)
			cur, size = nil, 0
		}
		cur = append(cur, img)
		size += len(img) + 8
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	return runs
}

// mergeImages checks every image (check decides whether its partition is
// acceptable), then merges them into the store and logs them to the WAL
// before returning. Nothing changes if any image is refused.
func (n *Node) mergeImages(ctx context.Context, imgs [][]byte, check func(store.ImageHeader) error) (records, nb int64, err error) {
	for i, img := range imgs {
		h, err := store.CheckImage(img)
		if err != nil {
			return 0, 0, fmt.Errorf("image %d: %w", i, err)
		}
		if err := check(h); err != nil {
			return 0, 0, fmt.Errorf("image %d: %w", i, err)
		}
	}
	v := n.view.Load()
	now := n.nowMs()
	var unknown map[string]int64
	for _, img := range imgs {
		_, ms, err := n.store.MergeImage(img, now, v.bindName)
		if err != nil {
			return records, nb, err
		}
		records += ms.Records
		nb += int64(len(img))
		for d, k := range ms.Unknown {
			if unknown == nil {
				unknown = map[string]int64{}
			}
			unknown[d] += k
		}
	}
	if len(unknown) > 0 {
		// A peer with other rules (left out of the ring) held them: a
		// rules change that removes a domain drops its history here.
		n.log.Warn("partition images held records of domains these rules lack: dropped", "records_by_domain", unknown, "domains_served", v.names)
	}
	if n.dur != nil && len(imgs) > 0 {
		// A WAL record is bounded: log the images in runs that fit one.
		for _, run := range groupImages(imgs, wal.MaxPayload-peerMessageSlack) {
			if _, err := n.dur.log.Append(ctx, encodeImages(nil, run)); err != nil {
				return records, nb, fmt.Errorf("write-ahead log: %w", err)
			}
		}
	}
	return records, nb, nil
}

// Image returns partition p's image (see package store) and its record
// count, for tools and tests; it changes nothing.
func (n *Node) Image(p int) ([]byte, int64) { return n.store.AppendImage(nil, p) }

// refuse returns the error for a peer message this node does not take.
func (n *Node) refuse(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, "node %s: %s", n.cfg.Name, fmt.Sprintf(format, args...))
}

// peerRing checks a peer message: the node serves, the caller is in its
// ring and, with sameEpoch, its ring has the caller's epoch. It returns that
// ring. Acquire needs the same epoch (it fences the old owner); Replicate
// and Fill check ownership under this node's ring instead, which a ring
// change that moves nothing (a member flapping) leaves alone.
func (n *Node) peerRing(caller string, epoch uint64, sameEpoch bool) (*ring.Ring, error) {
	_, r, err := n.peerView(caller, epoch, sameEpoch)
	if err != nil {
		return nil, err
	}
	if !r.Has(caller) {
		return nil, n.refuse("the caller %s is not in the ring of epoch %d", caller, r.Epoch())
	}
	return r, nil
}

// peerView is peerRing without the check that the caller is in the ring.
func (n *Node) peerView(caller string, epoch uint64, sameEpoch bool) (*cluster, *ring.Ring, error) {
	if !n.ready.Load() {
		return nil, nil, status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return nil, nil, n.refuse("not a cluster member")
	}
	if caller == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "node: the caller's name is empty")
	}
	r := c.ring()
	if sameEpoch && r.Epoch() != epoch {
		return nil, nil, n.refuse("ring epoch %d, the caller %s has %d; retry once rings agree", r.Epoch(), caller, epoch)
	}
	return c, r, nil
}

// Acquire answers Peer.Acquire (rule 2): it closes each partition and
// returns its image, in the newest image version the caller reads: a
// member left out of the ring for its older protocol still acquires from
// this node while the majority has not yet changed binaries.
func (n *Node) Acquire(ctx context.Context, req *pb.AcquireRequest) (*pb.AcquireResponse, error) {
	if req.Node == n.cfg.Name {
		return nil, n.refuse("a node never acquires from itself, and %q is this node's name", req.Node)
	}
	r, err := n.peerRing(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
		if o := r.PartitionOwner(int(p)); o.Name != req.Node {
			return nil, n.refuse("partition %d is owned by %s under epoch %d, not by %s", p, o.Name, r.Epoch(), req.Node)
		}
	}
	version := min(max(int(req.ImageVersion), 1), store.ImageVersion)
	if version < store.ImageVersion {
		// An older version cannot carry counter states: find out before any
		// partition is closed, so that a refusal leaves every one open.
		for _, p := range req.Partitions {
			if _, _, err := n.store.AppendImageVersion(nil, int(p), false, version); err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "partition %d: %v; upgrade %s before it takes partitions of a cluster whose rules use counting algorithms", p, err, req.Node)
			}
		}
	}
	resp := &pb.AcquireResponse{Node: n.cfg.Name}
	for _, p := range req.Partitions {
		// An older version fails for counter states, which only a release
		// that reads record format 3 can hold (checked above; only a state
		// written since can fail here, and this partition stays open).
		img, _, err := n.store.AppendImageVersion(nil, int(p), true, version)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "partition %d: %v; upgrade %s before it takes partitions of a cluster whose rules use counting algorithms", p, err, req.Node)
		}
		n.closePartition(int(p))                   // wakes nobody; makes waiters wait for a next open
		parts, err := n.splitImages([][]byte{img}) // the acquirer logs them in bounded WAL records
		if err != nil {
			return nil, status.Errorf(codes.Internal, "partition %d: %v", p, err)
		}
		resp.Images = append(resp.Images, parts...)
		n.ho.mu.Lock()
		n.ho.handed[p], n.ho.owed[p] = true, false
		resp.Generations = append(resp.Generations, n.ho.gen[p])
		n.ho.mu.Unlock()
	}
	return resp, nil
}

// Release answers Peer.Release: it drops its copy of each partition it
// neither owns nor backs under its ring, nor owes its owner (rule 7).
func (n *Node) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	if req.Node == n.cfg.Name {
		return nil, n.refuse("a node never releases to itself, and %q is this node's name", req.Node)
	}
	r, err := n.peerRing(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	resp := &pb.ReleaseResponse{}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
		if r.PartitionOwner(int(p)).Name == n.cfg.Name || n.store.IsOpen(int(p)) {
			continue
		}
		if b, ok := r.PartitionReplica(int(p)); ok && b.Name == n.cfg.Name {
			continue
		}
		n.ho.mu.Lock()
		owed := n.ho.owes(int(p))
		n.ho.mu.Unlock()
		if owed {
			// Decided here since the caller pulled it (a Release may
			// arrive late, under an epoch that came back): the owner has
			// not acquired those sends yet (rule 7).
			continue
		}
		if dropped := n.store.Drop(int(p)); dropped > 0 {
			n.ho.releases.Add(1)
			n.log.Debug("partition released", "partition", p, "records", dropped, "to", req.Node)
		}
		resp.Dropped = append(resp.Dropped, p)
	}
	return resp, nil
}

// Handback answers Peer.Handback (rule 7): each partition the caller
// decided for and this node owns under the caller's ring is closed and
// acquired again from every member. The caller may be out of the ring (left
// out for other rules, or leaving), but must be a member.
func (n *Node) Handback(ctx context.Context, req *pb.HandbackRequest) (*pb.HandbackResponse, error) {
	c, r, err := n.peerView(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	known := false
	for _, m := range c.ms.Members() {
		known = known || m.Name == req.Node
	}
	if !known || req.Node == n.cfg.Name {
		return nil, n.refuse("the caller %q is not another member", req.Node)
	}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
	}
	h := n.ho
	var taken []uint32
	for i, p := range req.Partitions {
		if r.PartitionOwner(int(p)).Name != n.cfg.Name {
			continue // a newer owner pulls from every member anyway
		}
		h.mu.Lock()
		if len(req.Generations) == len(req.Partitions) && n.store.IsOpen(int(p)) && h.pulledGen[p][req.Node] == req.Generations[i] {
			// Merged from the caller at this generation, open since: the
			// caller decided nothing for it after this node's pull.
			h.mu.Unlock()
			continue
		}
		taken = append(taken, p)
		h.pullAll[p] = true
		h.handbacks[p]++
		if h.closedAt[p].IsZero() {
			h.closedAt[p] = time.Now()
		}
		h.mu.Unlock()
		if n.store.IsOpen(int(p)) {
			n.closePartition(int(p))
		}
	}
	if len(taken) > 0 {
		n.log.Info("partitions handed back: acquiring them again", "from", req.Node, "partitions", taken, "epoch", r.Epoch())
		h.wake()
	}
	return &pb.HandbackResponse{}, nil
}

// Fill answers Peer.Fill: it merges images of partitions this node backs.
func (n *Node) Fill(ctx context.Context, req *pb.FillRequest) (*pb.FillResponse, error) {
	r, err := n.peerRing(req.Node, req.RingEpoch, false)
	if err != nil {
		return nil, err
	}
	_, _, err = n.mergeImages(ctx, req.Images, func(h store.ImageHeader) error {
		if h.Partitions != n.store.Partitions() {
			return fmt.Errorf("an image of %d partitions, this node has %d", h.Partitions, n.store.Partitions())
		}
		if o := r.PartitionOwner(h.Partition); o.Name != req.Node {
			return fmt.Errorf("partition %d is owned by %s, not by %s", h.Partition, o.Name, req.Node)
		}
		if b, ok := r.PartitionReplica(h.Partition); !ok || b.Name != n.cfg.Name {
			return fmt.Errorf("partition %d is not backed by %s", h.Partition, n.cfg.Name)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrBadImage) {
			return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", n.cfg.Name, err)
		}
		return nil, n.refuse("%v", err)
	}
	return &pb.FillResponse{}, nil
}

// drain hands this node's partitions over before it leaves (rule 4): it
// announces leaving, then waits until every partition it owned has been
// acquired by its new owner, or ctx is done.
func (n *Node) drain(ctx context.Context) {
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return
	}
	r := c.ring()
	if r.Len() == 0 || (r.Len() == 1 && r.Has(n.cfg.Name)) {
		// Nobody to hand over to. What it owes (rule 7) is lost unless a
		// backup holds it: say so, to read a loss by.
		n.ho.mu.Lock()
		owes := 0
		for p := range n.ho.owed {
			if n.ho.owes(p) {
				owes++
			}
		}
		n.ho.mu.Unlock()
		if owes > 0 {
			n.log.Warn("leaving alone in its ring while it owes partitions: what it decided for them is lost unless a backup holds it", "owed", owes)
		}
		return
	}
	var owned []int
	n.ho.mu.Lock()
	for p := range n.store.Partitions() {
		if r.PartitionOwner(p).Name == n.cfg.Name {
			owned = append(owned, p)
			n.ho.handed[p] = false
		} else if n.ho.owes(p) {
			owned = append(owned, p) // rule 7: its owner acquires it from here first
			n.ho.handbackAt[p] = time.Time{}
		}
	}
	n.ho.mu.Unlock()
	n.ho.wakeHandback() // tell the owners of what it owes again, now
	n.ho.leaving.Store(true)
	if err := c.ms.SetState(ctx, gossip.StateLeaving); err != nil {
		n.log.Warn("announcing leaving", "err", err)
		return
	}
	start := time.Now()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		left := 0
		n.ho.mu.Lock()
		for _, p := range owned {
			if !n.ho.handed[p] {
				left++
			}
		}
		n.ho.mu.Unlock()
		if left == 0 {
			n.log.Info("partitions handed over", "partitions", len(owned), "took", time.Since(start))
			return
		}
		select {
		case <-ctx.Done():
			n.log.Warn("leaving before every partition was handed over", "left", left, "of", len(owned))
			return
		case <-t.C:
		}
	}
}

// encodeImages returns a WAL payload holding partition images merged here.
func encodeImages(dst []byte, imgs [][]byte) []byte {
	dst = append(dst, walImages)
	dst = appendUvarint(dst, uint64(len(imgs)))
	for _, img := range imgs {
		dst = appendUvarint(dst, uint64(len(img)))
		dst = append(dst, img...)
	}
	return dst
}

// minKey returns the smallest key of m, "" if m is empty.
func minKey[V any](m map[string]V) string {
	first := ""
	for k := range m {
		if first == "" || k < first {
			first = k
		}
	}
	return first
}
