package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
)

// This file is the mover: it brings the node's partitions in line with each
// new ring (reconcile), acquiring what it owns from the other members and
// filling the backups (rules 1 to 3 of partition.go), and hands them over
// before the node leaves (drain, rule 4).

// acquireRetry is the pause before an acquisition that failed is tried again
// under the same ring.
const acquireRetry = 100 * time.Millisecond

// acquireBatch bounds the partitions one Acquire or Fill call carries.
const acquireBatch = 16

// moverLoop reconciles the node's partitions with each new ring, and again
// after a failed acquisition, until ctx is done.
func (n *Node) moverLoop(ctx context.Context, rings <-chan *ring.Ring) {
	var cur *ring.Ring
	var retry <-chan time.Time
	var failingSince time.Time
	// Rule 5 forgets members gone for ForgetDeadAfter: look again now and
	// then, not only on ring changes.
	tick, stop := n.cfg.NewTicker(max(n.cfg.ForgetDeadAfter/4, 10*time.Millisecond))
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			if n.ho.majority.Load() {
				// Keep the members present counted as of now, so that
				// one that vanishes is forgotten ForgetDeadAfter later,
				// not at the first reconcile after a quiet spell.
				if c := n.clus.Load(); c != nil && c.ms != nil && cur != nil {
					now := time.Now()
					n.ho.mu.Lock()
					n.ho.counted.note(c.ms.Members(), n.departedSince(c, now), cur.Members(), now)
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
	members := c.ms.Members()
	appeared, prev, majority := n.takeRing(c, r, members)
	if !majority {
		for p := range n.store.Partitions() {
			n.closeOwing(p) // rule 7, if another owns it once the cluster heals
		}
		return nil
	}
	work, owes := n.planMoves(r, prev, appeared)
	if owes {
		n.ho.wakeHandback()
	}
	if len(work) == 0 {
		return nil
	}
	return n.acquire(ctx, r, work, members)
}

// takeRing makes r the ring the mover reconciles with: it returns the
// members that appeared since the last one (new in the ring, or restarted
// with a new boot id under a name already there), that last ring, and rule
// 5's verdict on r, which it records (judged, majority, tieWinner) and logs
// when it changes.
func (n *Node) takeRing(c *cluster, r *ring.Ring, members []gossip.MemberState) (appeared map[string]bool, prev *ring.Ring, majority bool) {
	h := n.ho
	boots := map[string]uint64{}
	for _, m := range members {
		boots[m.Name] = m.Boot
	}
	appeared = map[string]bool{}
	h.mu.Lock()
	prev = h.prev
	for _, m := range r.Members() {
		if m.Name == c.self.Name {
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
	majority = n.judgeMajority(c, r, members)
	h.mu.Unlock()
	if h.majority.Swap(majority) != majority {
		if majority {
			n.log.Info("majority regained: acquiring partitions again", "ring", r.Len(), "seen", h.seen)
		} else if !h.leaving.Load() && r.Len() > 0 { // an empty ring: this node is closing
			h.majorityLosses.Add(1)
			n.log.Warn("majority lost: deciding nothing until the cluster heals", "ring", r.Len(), "seen", h.seen)
		}
	}
	return appeared, prev, majority
}

// judgeMajority counts the members present now (rule 5: a member counts
// once seen serving, until it announces that it is leaving; one that
// vanished without leaving still counts, until it has been gone for
// ForgetDeadAfter), judges r by them and records the verdict, and the
// winner of a tie this node lost. h.mu is held.
func (n *Node) judgeMajority(c *cluster, r *ring.Ring, members []gossip.MemberState) bool {
	h := n.ho
	now := time.Now()
	h.counted.note(members, n.departedSince(c, now), r.Members(), now)
	h.counted.forget(now, n.cfg.ForgetDeadAfter)
	h.seen = len(h.counted)
	first := h.counted.first()
	majority, tie := hasMajority(r.Len(), h.seen, r.Has(first))
	if !majority && tie && first != c.self.Name {
		h.tieWinner = first
	}
	if _, ok := h.counted[h.tieWinner]; !ok {
		h.tieWinner = "" // forgotten, or left gracefully
	}
	h.judged.Store(&judgement{ok: majority, epoch: r.Epoch(), seen: h.seen, first: first})
	return majority
}

// planMoves notes, for each partition, what its next move must do under r
// (prev: the last ring; appeared: members new since it): a partition this
// node no longer owns closes (and is owed back if it decided for it, rule
// 7); one it owns is pulled from every member if it is closed, else from the
// members that appeared, and its backup filled if the backup changed,
// appeared or the partition was closed. It returns the partitions with work
// to do, and whether any is owed.
func (n *Node) planMoves(r, prev *ring.Ring, appeared map[string]bool) (work []int, owes bool) {
	h := n.ho
	for p := range n.store.Partitions() {
		if r.PartitionOwner(p).Name != n.cfg.Name {
			n.closeOwing(p)
			h.mu.Lock()
			h.parts[p].closedAt = time.Time{}
			owes = owes || h.owes(p)
			h.mu.Unlock()
			continue
		}
		if n.planMove(r, prev, appeared, p) {
			// An open partition stays open while members that appeared are
			// asked for it (they decided nothing for it: rule 5); one whose
			// backup must be filled closes when its fill starts.
			work = append(work, p)
		}
	}
	return work, owes
}

// planMove notes the work of the move of partition p, owned here under r,
// and reports whether there is any.
func (n *Node) planMove(r, prev *ring.Ring, appeared map[string]bool, p int) bool {
	backup, hasBackup := r.PartitionReplica(p)
	var prevBackup ring.Member
	prevHas := false
	if prev != nil {
		prevBackup, prevHas = prev.PartitionReplica(p)
	}
	h := n.ho
	h.mu.Lock()
	defer h.mu.Unlock()
	ps := &h.parts[p]
	open := n.store.IsOpen(p)
	switch {
	case !open:
		ps.pullAll = true
	case len(appeared) > 0:
		if ps.from == nil {
			ps.from = map[string]bool{}
		}
		for m := range appeared {
			ps.from[m] = true
		}
	}
	if hasBackup && (!prevHas || prevBackup.Name != backup.Name || appeared[backup.Name] || !open) {
		ps.fill = true
	}
	if ps.pullAll && ps.closedAt.IsZero() {
		ps.closedAt = time.Now()
	}
	return ps.pullAll || len(ps.from) > 0 || ps.fill
}

// acquire carries out rule 2 for partitions ps under ring r, a chunk of
// acquireBatch partitions at a time (moveWorkers chunks at once), so that
// each partition is closed only for the time of its own chunk.
func (n *Node) acquire(ctx context.Context, r *ring.Ring, ps []int, members []gossip.MemberState) error {
	start := time.Now()
	targets := n.moveTargets(r, members)
	failed := map[int]error{}
	ps = n.awaitTieWinner(ps, targets, failed)
	var m moveTally
	m.failed = failed
	chunks := make(chan []int)
	var workers sync.WaitGroup
	for range moveWorkers {
		workers.Go(func() {
			for chunk := range chunks {
				errs, pulled := n.acquireChunk(ctx, r, chunk, targets, &m.records, &m.nbytes, &m.opened)
				m.add(chunk, errs, pulled)
			}
		})
	}
	for chunk := range slices.Chunk(ps, acquireBatch) {
		chunks <- chunk
	}
	close(chunks)
	workers.Wait()
	if o := m.opened.Load(); o > 0 || m.records.Load() > 0 {
		n.ho.moves.Add(o)
		n.ho.movedRecords.Add(m.records.Load())
		n.ho.movedBytes.Add(m.nbytes.Load())
		slices.Sort(m.done)
		n.log.Info("partitions acquired", "epoch", r.Epoch(), "partitions", len(m.done), "list", m.done, "opened", o,
			"records", m.records.Load(), "bytes", m.nbytes.Load(), "took", time.Since(start), "from", len(m.pulledFrom))
	}
	n.releasePulled(ctx, r, targets, m.pulledFrom)
	return movesFailed(m.failed)
}

// moveTally gathers the outcome of acquire's chunks. Safe for concurrent
// use.
type moveTally struct {
	mu         sync.Mutex // guards failed, pulledFrom and done
	done       []int      // partitions acquired, for the log
	failed     map[int]error
	pulledFrom map[string][]uint32 // partitions pulled, by member: to be released

	records, nbytes, opened atomic.Int64
}

// add takes the outcome of one chunk.
func (m *moveTally) add(chunk []int, errs map[int]error, pulled map[string][]uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, err := range errs {
		m.failed[p] = err
	}
	for _, p := range chunk {
		if errs[p] == nil {
			m.done = append(m.done, p)
		}
	}
	if m.pulledFrom == nil {
		m.pulledFrom = map[string][]uint32{}
	}
	for name, parts := range pulled {
		m.pulledFrom[name] = append(m.pulledFrom[name], parts...)
	}
}

// moveTargets returns the members a move under r asks: every other member
// of the ring, members leaving (out of the ring, still handing over), and
// serving members left out of the ring because they disagree with it
// (their rules changed: they may hold what they decided while they were in
// it).
func (n *Node) moveTargets(r *ring.Ring, members []gossip.MemberState) map[string]ring.Member {
	self := n.cfg.Name
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
	return targets
}

// awaitTieWinner returns the partitions of ps that may be acquired now:
// while the winner of a tie this node lost (rule 5) is not among the
// targets, the partitions that must be asked of every member wait, failed
// (in failed), until it is there to be asked, or forgotten.
func (n *Node) awaitTieWinner(ps []int, targets map[string]ring.Member, failed map[int]error) []int {
	h := n.ho
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.tieWinner
	if _, asked := targets[w]; w == "" || w == n.cfg.Name || asked {
		return ps
	}
	kept := ps[:0:0]
	for _, p := range ps {
		if h.parts[p].pullAll {
			failed[p] = fmt.Errorf("waiting for %s, which won the last tie this node lost (rule 5) and may have decided alone since: it must be asked, or forgotten after ForgetDeadAfter", w)
		} else {
			kept = append(kept, p)
		}
	}
	if len(kept) < len(ps) {
		h.tieWaits.Add(1)
	}
	return kept
}

// releasePulled tells the members acquire pulled from that this node holds
// their partitions now (Release; best effort).
func (n *Node) releasePulled(ctx context.Context, r *ring.Ring, targets map[string]ring.Member, pulledFrom map[string][]uint32) {
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
			cli.Release(rctx, &pb.ReleaseRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), Partitions: parts})
		})
	}
	wg.Wait()
}

// movesFailed returns the error of the partitions a move left closed: the
// first three, and how many more; nil for none.
func movesFailed(failed map[int]error) error {
	if len(failed) == 0 {
		return nil
	}
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

// moveWorkers is the number of chunks of partitions acquired at once.
const moveWorkers = 4

// acquireChunk acquires the partitions of one chunk: it closes those whose
// backup it fills, pulls from the members that must be asked, merges, fills
// the backup and opens what it closed. It returns the partitions that
// failed, and the partitions it pulled, by member, for Release.
func (n *Node) acquireChunk(ctx context.Context, r *ring.Ring, chunk []int, targets map[string]ring.Member,
	records, nbytes, opened *atomic.Int64) (map[int]error, map[string][]uint32) {
	plan := n.planChunk(r, chunk, targets)
	var failures chunkFailures
	failures.failed = map[int]error{}
	var wg sync.WaitGroup
	for name, parts := range plan.ask {
		wg.Go(func() {
			got, nb, err := n.pullFrom(ctx, r, targets[name], parts)
			records.Add(got)
			nbytes.Add(nb)
			failures.fail(parts, err, "acquiring from "+name)
		})
	}
	wg.Wait()
	fills := map[string][]int{} // what pulled completely, by backup; computed before any fill writes failed
	for name, parts := range plan.fillTo {
		for _, p := range parts {
			if failures.failed[p] == nil {
				fills[name] = append(fills[name], p)
			}
		}
	}
	for name, parts := range fills {
		wg.Go(func() {
			err := n.fillBackup(ctx, r, targets[name], parts)
			if err == nil {
				for _, p := range parts {
					n.unacked[p].Store(0) // the new backup holds every send
				}
			}
			failures.fail(parts, err, "filling backup "+name)
		})
	}
	wg.Wait()
	failed := failures.failed
	for _, p := range chunk {
		if failed[p] != nil {
			continue
		}
		switch did, err := n.finishMove(p, plan.handbacks[p], r.Epoch()); {
		case err != nil:
			failed[p] = err
		case did:
			opened.Add(1)
		}
	}
	pulled := map[string][]uint32{}
	for name, parts := range plan.ask {
		for _, p := range parts {
			if failed[p] == nil {
				pulled[name] = append(pulled[name], uint32(p))
			}
		}
	}
	return failed, pulled
}

// chunkPlan is what acquireChunk does: the partitions to ask of each
// member and to fill on each backup, and the handback count of each as the
// plan was made.
type chunkPlan struct {
	ask, fillTo map[string][]int
	handbacks   map[int]uint64
}

// planChunk plans the move of the partitions of chunk under r, and closes
// those whose backup it fills.
func (n *Node) planChunk(r *ring.Ring, chunk []int, targets map[string]ring.Member) chunkPlan {
	h := n.ho
	plan := chunkPlan{ask: map[string][]int{}, fillTo: map[string][]int{}, handbacks: map[int]uint64{}}
	for _, p := range chunk {
		h.mu.Lock()
		ps := &h.parts[p]
		plan.handbacks[p] = ps.handbacks
		for name := range targets {
			if ps.pullAll || ps.from[name] {
				plan.ask[name] = append(plan.ask[name], p)
			}
		}
		fill := ps.fill
		h.mu.Unlock()
		if b, ok := r.PartitionReplica(p); ok && fill && n.cfg.Replication != ReplicationOff {
			plan.fillTo[b.Name] = append(plan.fillTo[b.Name], p)
			if n.store.IsOpen(p) {
				h.mu.Lock()
				ps.closedAt = time.Now()
				h.mu.Unlock()
				n.closePartition(p)
			}
		}
	}
	return plan
}

// chunkFailures gathers the partitions of a chunk that failed. Safe for
// concurrent use.
type chunkFailures struct {
	mu     sync.Mutex // guards failed
	failed map[int]error
}

// fail notes parts as failed with err (doing what), unless err is nil.
func (f *chunkFailures) fail(parts []int, err error, doing string) {
	if err == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range parts {
		f.failed[p] = fmt.Errorf("%s: %w", doing, err)
	}
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
			if n.ho.parts[p].pulledGen == nil {
				n.ho.parts[p].pulledGen = map[string]uint64{}
			}
			n.ho.parts[p].pulledGen[m.Name] = resp.Generations[i]
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
		n.warnOwedAlone()
		return
	}
	owned := n.toHandOver(r)
	n.ho.wakeHandback() // tell the owners of what it owes again, now
	n.ho.leaving.Store(true)
	if err := c.ms.SetState(ctx, gossip.StateLeaving); err != nil {
		n.log.Warn("announcing leaving", "err", err)
		return
	}
	start := time.Now()
	left := n.notHandedOver(owned)
	if left > 0 {
		n.every(ctx, 20*time.Millisecond, func() bool {
			left = n.notHandedOver(owned)
			return left > 0
		})
	}
	if left > 0 {
		n.log.Warn("leaving before every partition was handed over", "left", left, "of", len(owned))
		return
	}
	n.log.Info("partitions handed over", "partitions", len(owned), "took", time.Since(start))
}

// warnOwedAlone warns, for a node that leaves alone in its ring, that what
// it owes (rule 7) is lost unless a backup holds it: to read a loss by.
func (n *Node) warnOwedAlone() {
	n.ho.mu.Lock()
	owes := 0
	for p := range n.ho.parts {
		if n.ho.owes(p) {
			owes++
		}
	}
	n.ho.mu.Unlock()
	if owes > 0 {
		n.log.Warn("leaving alone in its ring while it owes partitions: what it decided for them is lost unless a backup holds it", "owed", owes)
	}
}

// toHandOver returns the partitions a drain waits for: those this node owns
// under r, and those it owes (rule 7: their owner acquires them from here
// first), whose handbacks are due again at once.
func (n *Node) toHandOver(r *ring.Ring) []int {
	var owned []int
	n.ho.mu.Lock()
	defer n.ho.mu.Unlock()
	for p := range n.store.Partitions() {
		if r.PartitionOwner(p).Name == n.cfg.Name {
			owned = append(owned, p)
			n.ho.parts[p].handed = false
		} else if n.ho.owes(p) {
			owned = append(owned, p)
			n.ho.parts[p].handbackAt = time.Time{}
		}
	}
	return owned
}

// notHandedOver returns how many of partitions ps no Acquire has taken
// yet.
func (n *Node) notHandedOver(ps []int) (left int) {
	n.ho.mu.Lock()
	defer n.ho.mu.Unlock()
	for _, p := range ps {
		if !n.ho.parts[p].handed {
			left++
		}
	}
	return left
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
