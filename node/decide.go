package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// decideChunk is how many items decide hands to store.ApplyBatch at once:
// enough to overlap the cache misses of a batch, few enough to keep the
// pooled results (about 500 bytes an item) small.
const decideChunk = 256

// This file is the local part of a check: decide answers the items this
// node decides (judge), in request order, at one clock reading, meeting
// their partitions' state in exactly one place, store.ApplyBatch, a chunk
// at a time. For each answer, one pass of stages: the outcome (the item's
// error, or the store's decision), the send it recorded (record.go), the
// response's columns (respond.go), the counters; then the recorded sends
// are made durable and replicated (persist, record.go).

// decide decides the items idx of b here (all of them when idx is nil), in
// that order, at one clock reading; answer j is item idx[j]. An item judge
// failed fails here. The items meet their partitions' state in
// store.ApplyBatch, in chunks of decideChunk: the outcome is that of
// deciding them one by one in order, so the sends of each partition reach
// the WAL and the backups in sequence-number order.
func (n *Node) decide(ctx context.Context, b *batch, idx []int, r *ring.Ring, t *walTicket) (*pb.CheckResponse, error) {
	n.waitMoving(ctx, b, idx, r)
	p := n.newPass(b, idx, r, t)
	for lo := 0; lo < p.cnt; lo += decideChunk {
		hi := min(p.cnt, lo+decideChunk)
		p.applyChunk(lo, hi)
		for j := lo; j < hi; j++ {
			p.take(j)
		}
	}
	p.flush()
	b.st.lap(StageStore)
	return p.persist(ctx)
}

// pass is decide's state for one call: its answers and what they recorded
// and counted. It is used by one goroutine.
type pass struct {
	n    *Node
	b    *batch
	idx  []int // answer j is item idx[j]; nil: item j
	cnt  int   // answers
	r    *ring.Ring
	t    *walTicket // nil without a WAL
	now  int64      // the clock reading every decision is made at, unix ms
	resp *pb.CheckResponse

	// replicating says that the sends go to their partitions' backups.
	replicating bool
	// flight is the walFlight slot of the call, with a WAL or replication;
	// takenBack, the node's count of calls that took their sends back when
	// it began.
	flight    int
	takenBack int64

	admitted, denied, failed, refunds int64
	tally                             tally

	// durability is the strongest of the domains whose sends the call
	// recorded (rules.DurabilityFsync first): what persist waits for.
	durability rules.Durability
}

// newPass starts decide's pass over answers idx of b: with a WAL, the
// items the failed log cannot take fail now; with a WAL or replication, the
// call enters the walFlight before any store change.
func (n *Node) newPass(b *batch, idx []int, r *ring.Ring, t *walTicket) *pass {
	p := &pass{n: n, b: b, idx: idx, cnt: len(b.items), r: r, t: t, durability: rules.DurabilityAsync}
	if idx != nil {
		p.cnt = len(idx)
	}
	p.resp = wire.NewResponse(p.cnt)
	p.resp.RingEpoch = r.Epoch()
	p.replicating = n.clus.Load().ms != nil && n.cfg.Replication != ReplicationOff && r.Len() > 1
	if t != nil {
		n.refuseWhileWALFailed(b, idx)
	}
	if t != nil || p.replicating {
		p.takenBack = n.takenBack.Load()
		p.flight = n.flight.enter()
	}
	p.now = n.nowMs()
	return p
}

// item returns the index in the batch of answer j.
func (p *pass) item(j int) int {
	if p.idx == nil {
		return j
	}
	return p.idx[j]
}

// take makes answer j from its item and the store's result: an error, or
// the decision, its send recorded, answered and counted.
func (p *pass) take(j int) {
	i := p.item(j)
	x := &p.b.items[i]
	if x.err != nil {
		p.fail(j, x.err)
		return
	}
	sb := &p.b.decided[p.b.slot[j%decideChunk]]
	if sb.Err != nil {
		if errors.Is(sb.Err, store.ErrClosed) {
			p.b.moved = append(p.b.moved, i)
		}
		p.fail(j, p.n.applyError(p.b.req.Recipients[i], x.part, p.r, sb.Err))
		return
	}
	p.record(j, x, sb)
	answer(p.resp, j, x, sb)
	p.count(x, sb)
}

// fail makes answer j the item error e, and counts it.
func (p *pass) fail(j int, e *itemError) {
	p.failed++
	p.tally.failed[e.code%numCodes]++
	p.resp.DecidedAtMs[j] = p.now
	p.resp.Errors = append(p.resp.Errors, &pb.ItemError{Index: uint32(j), Code: uint32(e.code), Message: e.msg, Field: e.field})
}

// retract turns answer j, decided already, into a retryable UNAVAILABLE
// failure saying msg: what it recorded did not stand (its backup did not
// confirm it, its partition was acquired again, its first attempt was taken
// back). The caller sorts resp.Errors once it is done.
func (p *pass) retract(j int, msg string) {
	p.resp.Admitted[j], p.resp.Recorded[j] = false, false
	p.resp.Errors = append(p.resp.Errors, &pb.ItemError{Index: uint32(j), Code: uint32(codes.Unavailable), Message: msg})
}

// count counts a decided item: by result, in its domain's and rules'
// counters (tally), and in the usage statistics unless it is a refund or a
// duplicate, which decide nothing.
func (p *pass) count(x *item, sb *store.BatchItem) {
	dec := &sb.Dec
	switch {
	case x.refund:
		if !sb.Dup {
			p.refunds++
		}
		return
	case sb.Dup:
		p.tally.duplicates++
	default:
		p.n.countUsage(p.now, x, dec)
	}
	if dec.Admitted {
		p.admitted++
	} else {
		p.denied++
	}
	p.tally.decided(x.dv, dec.Admitted, dec.DeniedBy)
	if dec.ShadowDeniedBy >= 0 && !x.dv.exempt {
		x.dv.rules[dec.ShadowDeniedBy].shadowDenied.Add(1) // rare: no tally
	}
}

// flush adds the pass's counts to the node's.
func (p *pass) flush() {
	n := p.n
	n.checks.Add(int64(p.cnt))
	n.admitted.Add(p.admitted)
	n.denied.Add(p.denied)
	n.failed.Add(p.failed)
	n.refunds.Add(p.refunds)
	p.tally.flush(&n.decisions)
}

// applyChunk decides, in the store, answers lo to hi-1 of the pass whose
// items carry no error, at the pass's clock reading. take reads their
// results through b.slot.
func (p *pass) applyChunk(lo, hi int) {
	b := p.b
	b.decided, b.slot = b.decided[:0], b.slot[:0] // each entry is overwritten whole
	for j := lo; j < hi; j++ {
		x := &b.items[p.item(j)]
		if x.err != nil {
			b.slot = append(b.slot, -1)
			continue
		}
		b.slot = append(b.slot, int32(len(b.decided)))
		b.decided = append(b.decided, store.BatchItem{Part: x.part, Ref: x.dv.ref, Key: x.key, Tag: x.tag, Item: x.it, ID: x.id, Refund: x.refund})
	}
	p.n.store.ApplyBatch(p.now, b.decided)
}

// waitMoving waits, at most MoveWait and until ctx is done, for the
// partitions of the items to decide that this node owns (their verdict)
// but has not acquired yet.
func (n *Node) waitMoving(ctx context.Context, b *batch, idx []int, r *ring.Ring) {
	var waits []<-chan struct{}
	var seen map[int]bool // made on the first closed partition: the common batch meets none
	each(len(b.items), idx, func(i int) {
		x := &b.items[i]
		if x.err != nil || n.ho.isOpen(x.part) || seen[x.part] {
			return
		}
		if seen == nil {
			seen = map[int]bool{}
		}
		seen[x.part] = true
		if x.owner.Name == n.cfg.Name {
			waits = append(waits, n.ho.openCh(x.part))
		}
	})
	if len(waits) == 0 {
		return
	}
	timer := time.NewTimer(MoveWait)
	defer timer.Stop()
	changed := n.ho.ringChanged() // then the partition may not be ours to wait for
	for _, w := range waits {
		select {
		case <-w:
		case <-changed:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		}
	}
}

// applyError turns a store error into an item error. Its message names the
// recipient, not the item's index: a forwarded item's index is its place in
// the forwarded batch, not in the caller's.
func (n *Node) applyError(rcp string, p int, r *ring.Ring, err error) *itemError {
	switch {
	case errors.Is(err, store.ErrClosed):
		return &itemError{code: codes.Unavailable, msg: fmt.Sprintf("recipient %s: partition %d is not open on %s under ring epoch %d (owner %s): it is moving; retry",
			quote(rcp), p, n.cfg.Name, r.Epoch(), r.PartitionOwner(p).Name)}
	case errors.Is(err, window.ErrInvalid):
		return badItem("", "recipient %s: %s", quote(rcp), trimPrefix(err))
	case errors.Is(err, store.ErrIDReused):
		return &itemError{code: codes.AlreadyExists, field: wire.RequestIDs, msg: fmt.Sprintf("request_ids: recipient %s: %s; not recorded (a retry repeats its item exactly)",
			quote(rcp), strings.TrimPrefix(err.Error(), store.ErrIDReused.Error()+": "))}
	case errors.Is(err, store.ErrRefundUnknown):
		return &itemError{code: codes.NotFound, field: wire.RequestIDs, msg: fmt.Sprintf("request_ids: recipient %s: %s: nothing refunded (a refund must come within the idempotency window of its send, and only a recorded send can be refunded)",
			quote(rcp), strings.TrimPrefix(err.Error(), store.ErrRefundUnknown.Error()+": "))}
	case errors.Is(err, store.ErrMemoryLimit):
		return n.refusedAtLimit(rcp)
	case errors.Is(err, window.ErrFull):
		return &itemError{code: codes.ResourceExhausted, msg: fmt.Sprintf("recipient %s: %s", quote(rcp), trimPrefix(err))}
	}
	n.log.Error("check failed", "recipient", quote(rcp), "err", err)
	return &itemError{code: codes.Internal, msg: fmt.Sprintf("recipient %s: %v", quote(rcp), err)}
}

// trimPrefix drops the "window: invalid item: " style prefix of a window error.
func trimPrefix(err error) string {
	s := err.Error()
	for _, p := range []string{window.ErrInvalid.Error() + ": ", window.ErrFull.Error() + ": "} {
		if len(s) > len(p) && s[:len(p)] == p {
			return s[len(p):]
		}
	}
	return s
}

// walLogEvery bounds how often failed WAL appends are logged.
const walLogEvery = 10 * time.Second

// confirmDuplicates holds the answers of items answered from their request
// id (resp.Duplicates) until the calls that recorded them have ended: a
// duplicate is answered as recorded only once the first attempt is durable
// and on its backup. If the first attempt was taken back meanwhile (its
// backup did not confirm it: withdraw; or any call's WAL append failed
// since this call began: takenBack moved), the item fails as retryable,
// and the retry is decided afresh.
func (p *pass) confirmDuplicates(ctx context.Context) {
	n, resp := p.n, p.resp
	err := n.flight.wait(ctx)
	walFailed := n.takenBack.Load() != p.takenBack
	now := n.nowMs()
	failed := false
	for _, j := range resp.Duplicates {
		x := &p.b.items[p.item(int(j))]
		if !resp.Admitted[j] || x.refund {
			continue // failed already, or a refund's repeat: nothing rests on the first send
		}
		var msg string
		switch {
		case err != nil:
			msg = fmt.Sprintf("node %s: waiting for an earlier attempt of this request id to be durable: %v; retry", n.cfg.Name, err)
		case walFailed:
			msg = fmt.Sprintf("node %s: an earlier attempt of this request id may not be durable (the write-ahead log failed); retry", n.cfg.Name)
		case !n.store.Recorded(x.part, x.dv.ref, x.key, x.id, now):
			msg = fmt.Sprintf("node %s: an earlier attempt of this request id failed and was taken back (its backup did not confirm it); retry", n.cfg.Name)
		default:
			continue
		}
		p.retract(int(j), msg)
		failed = true
	}
	if failed {
		wire.SortErrors(resp.Errors)
	}
}
