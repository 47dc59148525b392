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
	h.counted.note(members, n.departedSince(c, nowT), r.Members(), nowT)
	h.counted.forget(nowT, n.cfg.ForgetDeadAfter)
	h.seen = len(h.counted)
	first := h.counted.first()
	majority, tie := hasMajority(r.Len(), h.seen, r.Has(first))
	if !majority && tie && first != self {
		h.tieWinner = first
	}
	if _, ok := h.counted[h.tieWinner]; !ok {
		h.tieWinner = "" // forgotten, or left gracefully
	}
	h.judged.Store(&judgement{ok: majority, epoch: r.Epoch(), seen: h.seen, first: first})
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
			h.parts[p].closedAt = time.Time{}
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
			h.parts[p].pullAll = true
		case len(appeared) > 0:
			if h.parts[p].from == nil {
				h.parts[p].from = map[string]bool{}
			}
			for m := range appeared {
				h.parts[p].from[m] = true
			}
		}
		if hasBackup && (!prevHas || prevBackup.Name != backup.Name || appeared[backup.Name] || !n.store.IsOpen(p)) {
			h.parts[p].fill = true
		}
		needs := h.parts[p].pullAll || len(h.parts[p].from) > 0 || h.parts[p].fill
		if h.parts[p].pullAll && h.parts[p].closedAt.IsZero() {
			h.parts[p].closedAt = time.Now()
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
				if n.ho.parts[p].pullAll {
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
		handbacks[p] = h.parts[p].handbacks
		for name := range targets {
			if h.parts[p].pullAll || h.parts[p].from[name] {
				ask[name] = append(ask[name], p)
			}
		}
		fill := h.parts[p].fill
		h.mu.Unlock()
		if b, ok := r.PartitionReplica(p); ok && fill && n.cfg.Replication != ReplicationOff {
			fillTo[b.Name] = append(fillTo[b.Name], p)
			if n.store.IsOpen(p) {
				h.mu.Lock()
				h.parts[p].closedAt = time.Now()
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
		// Nobody to hand over to. What it owes (rule 7) is lost unless a
		// backup holds it: say so, to read a loss by.
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
		return
	}
	var owned []int
	n.ho.mu.Lock()
	for p := range n.store.Partitions() {
		if r.PartitionOwner(p).Name == n.cfg.Name {
			owned = append(owned, p)
			n.ho.parts[p].handed = false
		} else if n.ho.owes(p) {
			owned = append(owned, p) // rule 7: its owner acquires it from here first
			n.ho.parts[p].handbackAt = time.Time{}
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
			if !n.ho.parts[p].handed {
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
