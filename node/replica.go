package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// Replication says whether an admitted send must be on its partition's
// backup before the owner replies.
type Replication uint8

const (
	// ReplicationSync sends each batch's admitted sends to their backups and
	// replies only once every backup has them in its store and WAL. An owner
	// that cannot reach a backup fails those items as retryable: one crash
	// over-admits nothing. The default.
	ReplicationSync Replication = iota
	// ReplicationOff keeps sends on their owner only: a crash loses the
	// history of the partitions the dead node owned.
	ReplicationOff
	// ReplicationAsync sends each batch's admitted sends to their backups
	// and replies without waiting while at most Config.AsyncBound sends of
	// each of its partitions are unacknowledged; past that, the batch waits
	// for its backups as with sync. A crash over-admits at most AsyncBound
	// sends (plus one batch's) per partition of the dead node.
	ReplicationAsync
)

// String returns "sync" or "off".
func (r Replication) String() string {
	switch r {
	case ReplicationSync:
		return "sync"
	case ReplicationOff:
		return "off"
	case ReplicationAsync:
		return "async"
	}
	return fmt.Sprintf("Replication(%d)", uint8(r))
}

// ParseReplication parses "sync", "async" or "off".
func ParseReplication(s string) (Replication, error) {
	switch s {
	case "sync":
		return ReplicationSync, nil
	case "async":
		return ReplicationAsync, nil
	case "off":
		return ReplicationOff, nil
	}
	return 0, fmt.Errorf("node: replication %q is not one of sync, async, off", s)
}

// replicaSet gathers the sends of one batch by backup. Node.takeReplicaSet
// hands one out and Node.releaseReplicaSet takes it back, emptied, with its
// arrays for the next batch.
type replicaSet struct {
	backups map[string]*replicaBatch
	spare   []*replicaBatch // emptied batches of an earlier use, for add
	hint    int             // sends a backup is made room for at first
}

// maxPooledReplicaSends bounds the sends' array a released replica batch
// keeps: one that grew for a rare huge batch is dropped, not pooled.
const maxPooledReplicaSends = 4096

// takeReplicaSet returns an empty replica set, from the node's pool, for a
// batch of the given items under a ring of members: a new batch gets room
// for a backup's even share of them and a quarter more, so that gathering
// them rarely grows a slice. It is safe for concurrent use.
func (n *Node) takeReplicaSet(items, members int) *replicaSet {
	rs, _ := n.replicaSets.Get().(*replicaSet)
	if rs == nil {
		rs = &replicaSet{backups: map[string]*replicaBatch{}}
	}
	share := items / max(1, members-1)
	rs.hint = share + share/4 + 8
	return rs
}

// releaseReplicaSet empties rs and pools it. Nothing may use rs, or a batch
// of it, afterwards: replicate copies the sends into its calls, and
// failUnreplicated is done with the batches.
func (n *Node) releaseReplicaSet(rs *replicaSet) {
	rs.empty()
	n.replicaSets.Put(rs)
}

// empty drops every backup's batch from rs, keeping the batches, cleared,
// as spares for add.
func (rs *replicaSet) empty() {
	for _, rb := range rs.backups {
		if cap(rb.sends) > maxPooledReplicaSends {
			continue
		}
		clear(rb.sends) // they hold domain names
		*rb = replicaBatch{sends: rb.sends[:0], parts: rb.parts[:0], items: rb.items[:0]}
		rs.spare = append(rs.spare, rb)
	}
	clear(rs.backups)
}

// replicaBatch is what one backup gets from one batch.
type replicaBatch struct {
	member ring.Member
	sends  []walSend
	parts  []int // partition of each send
	items  []int // response indices of the items whose sends are in sends
	err    error
}

// add puts send s, answer j of the response, on the batch of p's backup
// under r, if p has one.
func (rs *replicaSet) add(r *ring.Ring, p, j int, s walSend) {
	b, ok := r.PartitionReplica(p)
	if !ok {
		return
	}
	rb := rs.backups[b.Name]
	if rb == nil {
		if k := len(rs.spare); k > 0 {
			rb = rs.spare[k-1]
			rs.spare = rs.spare[:k-1]
		} else {
			rb = &replicaBatch{sends: make([]walSend, 0, rs.hint), parts: make([]int, 0, rs.hint), items: make([]int, 0, rs.hint)}
		}
		rb.member = b
		rs.backups[b.Name] = rb
	}
	rb.sends = append(rb.sends, s)
	rb.parts = append(rb.parts, p)
	rb.items = append(rb.items, j)
}

// replicate sends each backup its sends and waits for them all; with
// async (ReplicationAsync, or sends of domains of rules.DurabilityAsync)
// only for those whose partitions have more than AsyncBound sends
// unacknowledged.
// The sends of concurrent batches for one backup share a Replicate call
// (replicator).
func (n *Node) replicate(ctx context.Context, r *ring.Ring, rs *replicaSet, async bool) {
	type wait struct {
		rb *replicaBatch
		c  *replCall
	}
	var waits []wait
	var notAfter int64 // the caller's deadline: a backup that reads the call later records nothing
	if dl, ok := ctx.Deadline(); ok && !async {
		notAfter = dl.UnixMilli()
	}
	for _, rb := range rs.backups {
		c := n.replicatorFor(rb.member).join(r.Epoch(), rb.sends, rb.parts, notAfter, async)
		if async {
			over := false
			for _, p := range rb.parts {
				over = over || n.unacked[p].Load() > int64(n.cfg.AsyncBound)
			}
			if !over {
				continue
			}
		}
		waits = append(waits, wait{rb, c})
	}
	for _, w := range waits {
		select {
		case <-w.c.done:
			w.rb.err = w.c.err
		case <-ctx.Done():
			w.rb.err = ctx.Err()
		}
	}
}

// maxReplicaCalls bounds the Replicate calls in flight to one backup;
// sends that arrive meanwhile wait and go together in the next call.
const maxReplicaCalls = 2

// replicator coalesces the sends of concurrent batches to one backup into
// Replicate calls, without timers: a call goes out at once while fewer than
// maxReplicaCalls are in flight, else the sends wait for the next. It is
// safe for concurrent use.
type replicator struct {
	n      *Node
	member ring.Member
	mu     sync.Mutex // guards the fields below
	next   *replCall  // gathering sends; nil when none wait
	flying int

	stMu          sync.Mutex  // guards the fields below (replstream.go)
	st            *replStream // the stream to the backup; nil before the first call
	noStreamUntil time.Time   // unary calls until then: the backup has no ReplicateStream
	retired       bool        // the backup moved: no more streams (closeStream)
}

// replCall is one Replicate call and the batches waiting for it.
type replCall struct {
	epoch uint64
	// notAfter is the earliest deadline of the batches' callers, unix ms
	// (0: none): the call's not_after_ms.
	notAfter int64
	enc      walEncoder
	counts   map[int]int64 // sends per partition, for Node.unacked
	// async says that a batch of the call may not wait for it (async
	// replication): a failed call is tried again a while.
	async bool
	done  chan struct{} // closed when err is set
	err   error
}

// replicatorFor returns the replicator of backup m.
func (n *Node) replicatorFor(m ring.Member) *replicator {
	n.replMu.Lock()
	rp := n.replicators[m.Name]
	if rp != nil && rp.member == m {
		n.replMu.Unlock()
		return rp
	}
	old := rp
	rp = &replicator{n: n, member: m}
	n.replicators[m.Name] = rp
	n.replMu.Unlock()
	if old != nil {
		old.closeStream()
	}
	return rp
}

// join adds sends (of partitions parts), whose caller waits until unix ms
// notAfter (0: no deadline), to a call under epoch and returns it. The
// sends count as unacknowledged until the call succeeds.
func (rp *replicator) join(epoch uint64, sends []walSend, parts []int, notAfter int64, async bool) *replCall {
	rp.mu.Lock()
	c := rp.next
	if c == nil || c.epoch != epoch {
		if c != nil { // another epoch waits: send it on its own
			rp.next = nil
			rp.flying++
			go rp.send(c)
		}
		c = &replCall{epoch: epoch, done: make(chan struct{}), counts: map[int]int64{}}
		rp.next = c
	}
	if notAfter != 0 && (c.notAfter == 0 || notAfter < c.notAfter) {
		c.notAfter = notAfter
	}
	c.async = c.async || async
	// One growth for the batch's sends (about 35 bytes each with a content
	// and a request id), not one per doubling.
	c.enc.sends = slices.Grow(c.enc.sends, len(sends)*walSendTypicalBytes)
	for i, s := range sends {
		c.enc.add(s)
		c.counts[parts[i]]++
		rp.n.unacked[parts[i]].Add(1)
	}
	if rp.flying < maxReplicaCalls {
		rp.next = nil
		rp.flying++
		rp.mu.Unlock()
		go rp.send(c)
		return c
	}
	rp.mu.Unlock()
	return c
}

// send makes call c, then sends the call that gathered meanwhile, if any.
func (rp *replicator) send(c *replCall) {
	for c != nil {
		c.err = rp.call(c)
		if status.Code(c.err) == codes.Aborted { // rule 8
			rp.n.reacquire(slices.Collect(maps.Keys(c.counts)))
		}
		// Async: the callers were answered; keep trying a while (their sends
		// stay unacknowledged meanwhile, which holds later batches to the
		// bound). A new backup is filled whole, which resets the count.
		for try := 0; c.err != nil && c.async && try < 10; try++ {
			select {
			case <-rp.n.moverCtx.Done():
			case <-time.After(100 * time.Millisecond):
				c.err = rp.call(c)
			}
		}
		if c.err == nil {
			for p, k := range c.counts {
				rp.n.ackSends(p, k)
			}
		}
		close(c.done)
		rp.mu.Lock()
		c = rp.next
		rp.next = nil
		if c == nil {
			rp.flying--
		}
		rp.mu.Unlock()
	}
}

func (rp *replicator) call(c *replCall) error {
	n := rp.n
	cli, err := n.peers.Peer(rp.member)
	if err != nil {
		return err
	}
	n.replCalls.Add(1)
	req := &pb.ReplicateRequest{Node: n.cfg.Name, RingEpoch: c.epoch, Sends: c.enc.bytes(),
		NotAfterMs: time.Now().Add(ForwardTimeout).UnixMilli()}
	if c.notAfter != 0 && c.notAfter < req.NotAfterMs {
		req.NotAfterMs = c.notAfter
	}
	ok, err := rp.replicateOnStream(cli, req)
	if !ok {
		n.replUnaryCalls.Add(1)
		ctx, cancel := context.WithTimeout(n.moverCtx, ForwardTimeout)
		defer cancel()
		_, err = cli.Replicate(ctx, req)
	}
	if status.Code(err) == codes.Unavailable {
		n.suspect(rp.member)
	}
	if err == nil {
		n.replicated.Add(int64(c.enc.n))
	}
	return err
}

// failUnreplicated turns the answers of items whose backup did not confirm
// into UNAVAILABLE errors, and takes their sends back (withdraw): the
// caller was not told they were admitted, so nothing may count them.
func (p *pass) failUnreplicated(ctx context.Context, rs *replicaSet) {
	n, resp := p.n, p.resp
	var failed map[int]bool // answers whose backup did not confirm
	for _, rb := range rs.backups {
		if rb.err == nil {
			continue
		}
		if !errors.Is(rb.err, context.Canceled) { // a caller that cancelled reads no answer
			n.log.Warn("backup did not confirm: items fail", "backup", rb.member.Name, "items", len(rb.items), "err", rb.err)
		}
		n.replicationFailures.Add(int64(len(rb.items)))
		if failed == nil {
			failed = map[int]bool{}
		}
		msg := fmt.Sprintf("backup %s (%s) did not confirm the send: %v; retry", rb.member.Name, rb.member.Addr, rb.err)
		for _, j := range rb.items {
			failed[j] = true
			p.retract(j, msg)
		}
	}
	if failed == nil {
		return
	}
	p.withdraw(ctx, failed)
	wire.SortErrors(resp.Errors)
}

// withdraw takes back the sends this call recorded for the answers in
// failed, which did not stand (their backup did not confirm them, or their
// partition was acquired again, failReopened): from the store (as a refund,
// so that a retry with the same request id is decided afresh, not answered
// as a duplicate) and, with a WAL, by appending their inverses, so that a
// restart agrees. The backup is not told: one that refused recorded
// nothing, and one that holds the send (it confirmed, or its answer was
// lost) replaces it with the retry's when the retry reaches it under the
// same request id (store.RecordItem.Replace), so that it never holds the
// send at the earlier time, which would let it expire early there. A duplicate's first send, sent to the backup again, is not
// taken back: its first answer was confirmed, or it would have been taken
// back then.
func (p *pass) withdraw(ctx context.Context, failed map[int]bool) {
	n := p.n
	var inverse *walEncoder
	undone := 0
	for k := range p.b.sends {
		s := &p.b.sends[k]
		if !s.wal || s.refund || !failed[s.answer] {
			continue
		}
		ref := p.b.items[p.item(s.answer)].dv.ref
		seq, _, err := n.store.Unrecord(s.part, ref, s.key, s.tag, s.at, windowItem(s.walSend), s.id, 0, p.now)
		if err != nil {
			n.log.Error("taking back a send that did not stand failed: this node counts it until it expires", "partition", s.part, "at", s.at, "err", err)
			continue
		}
		undone++
		if n.dur != nil {
			if inverse == nil {
				inverse = new(walEncoder)
			}
			ws := s.walSend
			ws.refund, ws.seq = true, seq
			inverse.add(ws)
		}
	}
	n.withdrawn.Add(int64(undone))
	if inverse == nil {
		return
	}
	// The caller may have left: the inverses go to the WAL all the same.
	if _, err := n.dur.log.Append(context.WithoutCancel(ctx), inverse.bytes()); err != nil {
		if ok, held := n.walLogs.allow(time.Now().UnixNano(), walLogEvery); ok {
			n.log.Error("WAL append of sends taken back failed: after a restart this node counts them until they expire", "sends", inverse.n, "failed_calls_not_logged", held, "err", err)
		}
	}
}

// Replicate answers Peer.Replicate: it records, as this partition's backup,
// the sends the owner admitted, in its store and WAL, before it returns.
// The whole message is checked before anything changes.
func (s peerServer) Replicate(ctx context.Context, req *pb.ReplicateRequest) (*pb.ReplicateResponse, error) {
	n := s.n
	st := n.startStages(CallReplicate, ctx)
	enc, err := n.recordReplicated(req)
	st.lap(StageApply)
	if lerr := n.logReplicated(ctx, enc, &st); err == nil {
		err = lerr
	}
	if err != nil {
		return nil, err
	}
	return &pb.ReplicateResponse{}, nil
}

// recordReplicated is Replicate up to the WAL: it checks req whole, records
// its sends in the store (RecordBatch) and returns those the WAL must get
// (nil when the node keeps none, or has them all). A send the store fails
// to record fails the call with the first such error, returned beside the
// sends that were recorded, which the WAL must get all the same.
func (n *Node) recordReplicated(req *pb.ReplicateRequest) (*walEncoder, error) {
	r, err := n.peerRing(req.Node, req.RingEpoch, false)
	if err != nil {
		return nil, err
	}
	if late, ok := n.readLate(req.NotAfterMs); ok {
		return nil, status.Errorf(codes.DeadlineExceeded, "node %s: the owner's deadline (not_after_ms %d) passed %d ms before this backup read the call: the owner has taken the sends back; nothing recorded", n.cfg.Name, req.NotAfterMs, late)
	}
	if n.dur != nil && n.dur.log.Failed() {
		return nil, status.Error(codes.Unavailable, n.walFailedError().msg)
	}
	sc := replicatedScratches.Get().(*replicatedScratch)
	defer sc.release()
	if err := n.decodeReplicated(req, r, sc); err != nil {
		return nil, err
	}
	if err := n.refuseAsBackup(sc.sends, req.Node); err != nil {
		return nil, err
	}
	n.store.RecordBatch(n.nowMs(), sc.items)
	// Judged again now that the sends are in the store: an Acquire names its
	// acquirer before it cuts its images, so a partition acquired by
	// another member since the first judgment either holds these sends in
	// the image it gave, or is refused here (and the sends taken back).
	if err := n.refuseAsBackup(sc.sends, req.Node); err != nil {
		n.undoReplicated(sc)
		return nil, err
	}
	return n.replicatedPayload(req.Node, sc)
}

// undoReplicated takes back from the store what RecordBatch did with the
// items of sc: a send recorded is unrecorded (and one it replaced recorded
// again), a refund applied is recorded again.
func (n *Node) undoReplicated(sc *replicatedScratch) {
	now := n.nowMs()
	for k := range sc.items {
		x := &sc.items[k]
		if x.Err != nil || x.Dup {
			continue
		}
		err := n.undo(x.Part, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, x.Refund, now)
		if err == nil && !x.Refund && x.Replaced != 0 { // the send it replaced, back
			_, _, err = n.store.Record(x.Part, x.Ref, x.Key, x.Tag, x.Replaced, x.Item, x.ID, now)
		}
		if err != nil {
			n.log.Error("taking back a replicated send refused after it was recorded failed: this backup counts it until it expires", "partition", x.Part, "at", x.At, "err", err)
		}
	}
}

// decodeReplicated decodes the sends of req into sc, checking each under
// this node's ring r: a send of a partition the caller does not own, or
// this node does not back, or of a domain it lacks, fails the call whole.
func (n *Node) decodeReplicated(req *pb.ReplicateRequest, r *ring.Ring, sc *replicatedScratch) error {
	v := n.view.Load()
	next := 0 // the index of the next send
	err := decodeWAL(req.Sends, func(s walSend) error {
		i := next
		next++
		if s.unconfirmed {
			return fmt.Errorf("%w: an unconfirmed mark, which only a WAL holds", ErrBadPayload)
		}
		if s.cost > window.MaxCost { // the framing carries more; an item may not have it
			return fmt.Errorf("%w: send %d: cost %d out of range [1, %d]", ErrBadPayload, i, s.cost, window.MaxCost)
		}
		p := n.store.PartitionOf(s.key)
		if o := r.PartitionOwner(p); o.Name != req.Node {
			return n.refuse("partition %d is owned by %s under epoch %d, not by %s", p, o.Name, r.Epoch(), req.Node)
		}
		if b, ok := r.PartitionReplica(p); !ok || b.Name != n.cfg.Name {
			return n.refuse("partition %d is not backed by %s under epoch %d", p, n.cfg.Name, r.Epoch())
		}
		dv := v.domains[s.domain]
		if dv == nil {
			return status.Errorf(codes.FailedPrecondition, "node %s: unknown domain %s (this node serves %v)", n.cfg.Name, quote(s.domain), v.names)
		}
		sc.sends = append(sc.sends, s)
		sc.items = append(sc.items, store.RecordItem{Part: p, Ref: dv.ref, Key: s.key, Tag: s.tag, At: s.at, Item: windowItem(s), ID: s.id, Refund: s.refund,
			Replace: !s.refund})
		return nil
	})
	if errors.Is(err, ErrBadPayload) {
		return status.Errorf(codes.InvalidArgument, "node %s: sends: %v", n.cfg.Name, err)
	}
	return err
}

// replicatedPayload returns the WAL payload of the sends of sc that the
// store recorded (nil without a WAL, or with none), and the first error of
// those it failed to record.
func (n *Node) replicatedPayload(from string, sc *replicatedScratch) (*walEncoder, error) {
	var enc *walEncoder // nil without a WAL
	if n.dur != nil {
		enc = new(walEncoder)
	}
	var first error
	for k, s := range sc.sends {
		x := &sc.items[k]
		if x.Err != nil {
			if first == nil {
				first = status.Errorf(codes.Internal, "node %s: recording a replicated send: %v", n.cfg.Name, x.Err)
			}
			continue
		}
		if x.Dup {
			// Sent again with its request id: recorded (or refunded)
			// already. Logged, to read a loss by: the id is known here.
			n.log.Debug("replicated send skipped: its request id is recorded here already", "partition", x.Part, "id", s.id, "at", s.at, "from", from)
			continue
		}
		if enc != nil {
			if x.Replaced != 0 { // the attempt its owner took back, first
				inv := s
				inv.refund, inv.at, inv.seq = true, x.Replaced, x.ReplacedSeq
				enc.add(inv)
			}
			s.seq = x.Seq
			enc.add(s)
		}
	}
	if enc == nil || enc.n == 0 {
		return nil, first
	}
	return enc, first
}

// replicatedScratch is recordReplicated's working memory, pooled: the sends
// of a Replicate call, decoded, and the store's items for them.
type replicatedScratch struct {
	sends []walSend
	items []store.RecordItem
}

var replicatedScratches = sync.Pool{New: func() any { return new(replicatedScratch) }}

// replicatedScratchMax is the most sends a pooled replicatedScratch keeps
// room for: a call larger than most leaves its arrays to the collector.
const replicatedScratchMax = 4096

// release empties sc, dropping what its sends and items point to, and
// returns it to the pool.
func (sc *replicatedScratch) release() {
	if cap(sc.sends) > replicatedScratchMax || cap(sc.items) > replicatedScratchMax {
		sc.sends, sc.items = nil, nil
	}
	clear(sc.sends)
	clear(sc.items)
	sc.sends, sc.items = sc.sends[:0], sc.items[:0]
	replicatedScratches.Put(sc)
}

// logReplicated appends what recordReplicated returned to the WAL and waits
// until it is written (the sync loop fsyncs it within Config.SyncInterval:
// the owner's durability is its own disk and this node's copy); nil does
// nothing. If the append fails, the sends are
// taken back from the store, which then agrees with the WAL, and the owner
// fails the items. st observes the append's steps.
func (n *Node) logReplicated(ctx context.Context, enc *walEncoder, st *stageTimer) error {
	if enc == nil {
		return nil
	}
	c, err := n.dur.log.AppendCommit(context.WithoutCancel(ctx), enc.bytes(), false)
	st.commit(c)
	if err != nil {
		n.takeBack(ctx, enc.bytes(), nil)
		n.takenBack.Add(1)
		return status.Errorf(codes.Unavailable, "node %s: write-ahead log: %v", n.cfg.Name, err)
	}
	return nil
}

// reacquire closes those of partitions ps that are open here and has the
// mover acquire them again from every member and fill their backup: a
// backup refused their sends (rule 8) because this node was out of its ring
// since it last acquired them, so this node's record may lack what others
// decided meanwhile. Safe for concurrent use.
func (n *Node) reacquire(ps []int) {
	h := n.ho
	h.mu.Lock()
	closed := 0
	for _, p := range ps {
		if n.store.IsOpen(p) {
			n.closeLocked(p)
			closed++
		}
	}
	h.mu.Unlock()
	if closed > 0 {
		n.reacquired.Add(int64(closed))
		n.log.Warn("a backup refused sends this node decided from a record that may be stale (it was out of the backup's ring since it acquired them): acquiring those partitions again from every member", "partitions", closed)
		h.wake()
	}
}

// ackSends counts k sends of partition p as on their backup.
func (n *Node) ackSends(p int, k int64) {
	for {
		old := n.unacked[p].Load()
		if n.unacked[p].CompareAndSwap(old, max(0, old-k)) {
			return
		}
	}
}

// refuseAsBackup refuses, as a backup, the sends of a partition that owner
// may have decided from a record lacking what others admitted, so that they
// fail until owner has acquired the partition from here:
//   - one this node decides for (open here, under a ring of its own that
//     its gossip has not replaced yet): FAILED_PRECONDITION;
//   - one it decided for under another ring and has not handed to owner
//     yet (rule 7): ABORTED;
//   - one owner has not acquired from here since owner was last out of this
//     node's ring (rule 8: owner may have been frozen while others decided
//     for it): ABORTED.
//
// ABORTED tells the owner to acquire the call's partitions again at once
// (reacquire). It reads the partitions' state under h.mu, where closeOwing
// closes a partition and records the debt in one hold, and Acquire records
// its caller.
func (n *Node) refuseAsBackup(sends []walSend, owner string) error {
	departures := n.clus.Load().ms.Departures(owner)
	h := n.ho
	h.mu.Lock()
	defer h.mu.Unlock()
	last := -1
	for _, s := range sends {
		p := n.store.PartitionOf(s.key)
		if p == last {
			continue
		}
		last = p
		ps := &h.parts[p]
		switch {
		case ps.open.Load():
			return n.refuse("partition %d is open on %s, which decides for it under another ring; %s must acquire it first", p, n.cfg.Name, owner)
		case h.owes(p):
			return status.Errorf(codes.Aborted, "node %s: partition %d holds sends %s decided under another ring, which %s has not acquired yet", n.cfg.Name, p, n.cfg.Name, owner)
		case ps.acquirer != owner || ps.acquirerDepartures != departures:
			n.staleRefusals.Add(1)
			return status.Errorf(codes.Aborted, "node %s: partition %d: %s has not acquired it from here since it was last out of this node's ring (%d departures seen): its record may lack what others decided meanwhile; acquire it again",
				n.cfg.Name, p, owner, departures)
		}
	}
	return nil
}
