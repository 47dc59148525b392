package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// This file is the single pass over a batch: each item is decoded,
// validated and hashed once (decode), then routed (forward.go) or decided
// here (decide), where it meets its partition's state in exactly one place.

// item is one decoded item of a batch.
type item struct {
	dv   *domainView
	it   window.Item
	key  uint64 // xxhash64 of the recipient
	tag  uint16 // CRC-32C of the recipient
	part int    // ring partition of key
	id   uint64 // request id, 0 for none
	// refund makes the item a refund of the send id recorded (MODE_REFUND).
	refund bool
	err    *itemError
}

// batch is a decoded request: its items in request order. Batches are
// pooled; put returns one.
type batch struct {
	req   *pb.CheckRequest
	items []item
	moved []int // items that failed because their partition closed after routing (store.ErrClosed)
	// decided holds the store's part of one chunk of decide: the items it
	// hands to store.ApplyBatch, with their results; slot[j] is answer j's
	// entry in decided, or -1 for an answer that did not reach the store.
	decided []store.BatchItem
	slot    []int32
}

var batches = sync.Pool{New: func() any { return new(batch) }}

func (b *batch) put() {
	b.req = nil
	clear(b.items)
	b.items = b.items[:0]
	b.moved = b.moved[:0]
	clear(b.decided)
	b.decided = b.decided[:0]
	batches.Put(b)
}

// decode decodes, validates and hashes every item of req under v and r. An
// item that fails validation carries its error; the others are ready to
// route and decide.
func decode(req *pb.CheckRequest, v *view, r *ring.Ring) *batch {
	b := batches.Get().(*batch)
	b.req = req
	cnt := len(req.Recipients)
	if cap(b.items) < cnt {
		b.items = make([]item, cnt)
	}
	b.items = b.items[:cnt]
	for i := range cnt {
		x := &b.items[i]
		x.dv, x.it, x.err = v.item(req, i)
		if x.err == nil {
			x.key, x.tag = KeyOf(req.Recipients[i])
			x.part = r.PartitionHash(x.key)
			x.id = column(req.RequestIds, i, 0)
			if x.refund = column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD) == pb.Mode_MODE_REFUND; x.refund && x.id == 0 {
				x.err = badItem("request_ids[%d]: a refund (modes[%d] MODE_REFUND) names the send it takes back by its request id; it has none", i, i)
			}
		}
	}
	return b
}

// column returns entry i of a per-item column of 0, 1 or n entries.
func column[T any](c []T, i int, def T) T {
	switch len(c) {
	case 0:
		return def
	case 1:
		return c[0]
	}
	return c[i]
}

// checkShape validates a request's columns: it fails whole if they are not
// well formed.
func checkShape(req *pb.CheckRequest) error {
	n := len(req.Recipients)
	if n == 0 || n > MaxBatch {
		return status.Errorf(codes.InvalidArgument, "recipients: %d items, want 1 to %d", n, MaxBatch)
	}
	for _, c := range []struct {
		name string
		len  int
	}{
		{"domains", len(req.Domains)}, {"contents", len(req.Contents)},
		{"content_hashes", len(req.ContentHashes)}, {"costs", len(req.Costs)},
		{"modes", len(req.Modes)}, {"request_ids", len(req.RequestIds)},
	} {
		if c.len > 1 && c.len != n {
			return status.Errorf(codes.InvalidArgument, "%s: %d entries, want 0, 1 or %d (one per recipient)", c.name, c.len, n)
		}
	}
	if len(req.RequestIds) == 1 && n > 1 {
		return status.Errorf(codes.InvalidArgument, "request_ids: 1 entry for %d items, want 0 or %d: a request id names one item", n, n)
	}
	if len(req.Contents) > 0 && len(req.ContentHashes) > 0 {
		return status.Error(codes.InvalidArgument, "contents and content_hashes: set at most one of them")
	}
	return nil
}

// itemError is one failed item: a gRPC code and a message naming the field.
type itemError struct {
	code codes.Code
	msg  string
}

func badItem(format string, args ...any) *itemError {
	return &itemError{codes.InvalidArgument, fmt.Sprintf(format, args...)}
}

// quote shows a recipient in an error, cut to 40 bytes.
func quote(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// item decodes and validates item i of req.
func (v *view) item(req *pb.CheckRequest, i int) (*domainView, window.Item, *itemError) {
	var it window.Item
	rcp := req.Recipients[i]
	if rcp == "" {
		return nil, it, badItem("recipients[%d]: empty recipient", i)
	}
	if len(rcp) > MaxRecipientBytes {
		return nil, it, badItem("recipients[%d]: %d bytes, more than %d", i, len(rcp), MaxRecipientBytes)
	}
	if !utf8.ValidString(rcp) {
		return nil, it, badItem("recipients[%d]: %s is not valid UTF-8", i, quote(rcp))
	}
	name := column(req.Domains, i, "")
	if name == "" {
		name = DefaultDomain
	}
	dv := v.domains[name]
	if dv == nil && !utf8.ValidString(name) {
		return nil, it, badItem("domains[%d]: %s is not valid UTF-8", i, quote(name))
	}
	if dv == nil {
		return nil, it, badItem("domains[%d]: unknown domain %s (this node serves %v)", i, quote(name), v.names)
	}
	dv = dv.forKey(rcp)
	if len(req.Contents) > 0 {
		c := column(req.Contents, i, nil)
		if len(c) > v.maxContent {
			return nil, it, badItem("contents[%d]: %d bytes, more than %d", i, len(c), v.maxContent)
		}
		it.Content = ContentHash(c)
	} else {
		it.Content = column(req.ContentHashes, i, 0)
	}
	cost := column(req.Costs, i, 1)
	if cost == 0 {
		cost = 1 // 0 is the proto3 default, as in the client and the CLI
	}
	if cost > window.MaxCost {
		return nil, it, badItem("costs[%d]: cost %d out of range [1, %d] (0 means 1)", i, cost, window.MaxCost)
	}
	it.Cost = int(cost)
	mode := column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD)
	switch mode {
	case pb.Mode_MODE_CHECK_AND_RECORD:
		it.Mode = window.CheckAndRecord
	case pb.Mode_MODE_PEEK:
		it.Mode = window.Peek
	case pb.Mode_MODE_RECORD_ONLY:
		it.Mode = window.RecordOnly
	case pb.Mode_MODE_REFUND:
		it.Mode = window.CheckAndRecord // unused: decode marks the item a refund
	default:
		return nil, it, badItem("modes[%d]: unknown mode %d", i, int32(mode))
	}
	return dv, it, nil
}

// Check answers Limiter.Check. The items this node owns are decided here,
// the others are forwarded in one call per owner, and the answers come back
// in request order. With a DataDir, the sends it records are in the WAL
// before it returns.
func (n *Node) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return n.check(ctx, req, true)
}

// check is Check. With reroute, items whose partition moved away between
// routing and deciding (another node acquired it under a ring that arrived
// meanwhile) are routed once more under the new ring.
func (n *Node) check(ctx context.Context, req *pb.CheckRequest, reroute bool) (*pb.CheckResponse, error) {
	if reroute && n.cfg.Observer != nil {
		start := time.Now()
		defer func() { n.cfg.Observer.CheckDone(len(req.Recipients), time.Since(start)) }()
	}
	t := n.announce()
	defer t.cancel()
	if err := n.admit(ctx, req); err != nil {
		return nil, err
	}
	r := n.clus.Load().ring()
	b := decode(req, n.view.Load(), r)
	defer b.put()
	var groups []*group
	if r.Len() > 1 || r.Len() == 1 && !r.Has(n.cfg.Name) {
		// A ring of one other member (this node left out of it, or seeing
		// only that member for a moment) owns everything elsewhere: this
		// node decides nothing it does not own under its ring (rule 1).
		groups = n.route(b, r)
	}
	var resp *pb.CheckResponse
	var err error
	if groups != nil {
		resp, err = n.checkRouted(ctx, b, r, groups, t)
	} else {
		resp, err = n.decide(ctx, b, nil, r, false, t)
	}
	if err != nil || !reroute || len(b.moved) == 0 || n.clus.Load().ring().Epoch() == r.Epoch() {
		return resp, err
	}
	t.cancel()
	moved := slices.Clone(b.moved)
	again, err := n.check(ctx, subRequest(req, moved, 0), false)
	if err != nil {
		return resp, nil // the items keep their retryable errors
	}
	return replaceItems(resp, moved, again, n.cfg.Name), nil
}

// replaceItems returns resp with the answers of items idx replaced by those
// of sub, a response to those items alone.
func replaceItems(resp *pb.CheckResponse, idx []int, sub *pb.CheckResponse, self string) *pb.CheckResponse {
	replaced := map[uint32]bool{}
	for _, i := range idx {
		replaced[uint32(i)] = true
	}
	kept := resp.Errors[:0]
	for _, e := range resp.Errors {
		if !replaced[e.Index] {
			kept = append(kept, e)
		}
	}
	resp.Errors = kept
	all := make([]int, len(resp.Admitted))
	for i := range all {
		all[i] = i
	}
	// mergeResponses takes each item from the last group that has it.
	return mergeResponses(len(all), []*group{{idx: all, resp: resp}, {idx: idx, resp: sub}}, sub.RingEpoch, self)
}

// Forward answers Peer.Forward: it decides the items this node owns under
// its own ring and fails the others as retryable.
func (s peerServer) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	n := s.n
	t := n.announce()
	defer t.cancel()
	if err := n.admit(ctx, req); err != nil {
		return nil, err
	}
	n.forwardedIn.Add(int64(len(req.Recipients)))
	r := n.clus.Load().ring()
	b := decode(req, n.view.Load(), r)
	defer b.put()
	return n.decide(ctx, b, nil, r, true, t)
}

// admit refuses calls the node cannot take: before Open, after Close, and
// malformed batches.
func (n *Node) admit(ctx context.Context, req *pb.CheckRequest) error {
	if !n.ready.Load() {
		return status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	if err := checkShape(req); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// newResponse returns an empty response with room for n items and four
// rules each. The columns of one element type share one array, each with
// its capacity capped, so that an append past it (a fifth rule) moves that
// column alone: 6 allocations instead of 11.
func newResponse(n int) *pb.CheckResponse {
	flags := make([]bool, 2*n)
	i64 := make([]int64, 6*n)
	u32 := make([]uint32, 9*n)
	return &pb.CheckResponse{
		Admitted:         flags[:n:n],
		Recorded:         flags[n:],
		DeniedBy:         make([]int32, n),
		RetryAfterMs:     i64[:n:n],
		DecidedAtMs:      i64[n : 2*n : 2*n],
		RuleRetryAfterMs: i64[2*n : 2*n],
		RuleCounts:       u32[:n:n],
		Used:             u32[n : n : 5*n],
		Remaining:        u32[5*n : 5*n],
		Domains:          make(map[string]*pb.Domain, 1),
	}
}

// setShadowDeniedBy sets item j's shadow_denied_by to rule, making the
// column (one entry per item, -1 for none) on the first item that has one.
func setShadowDeniedBy(resp *pb.CheckResponse, j int, rule int32) {
	if resp.ShadowDeniedBy == nil {
		resp.ShadowDeniedBy = make([]int32, len(resp.Admitted))
		for k := range resp.ShadowDeniedBy {
			resp.ShadowDeniedBy[k] = -1
		}
	}
	resp.ShadowDeniedBy[j] = rule
}

// decideChunk is how many items decide hands to store.ApplyBatch at once:
// enough to overlap the cache misses of a batch, few enough to keep the
// pooled results (about 500 bytes an item) small.
const decideChunk = 256

// decide decides the items idx of b here (all of them when idx is nil), in
// that order, at one clock reading; answer j is item idx[j]. With mustOwn,
// an item this node does not own under r fails with UNAVAILABLE: the caller
// routed by a stale ring. The items meet their partitions' state in
// store.ApplyBatch, in chunks of decideChunk: the outcome is that of
// deciding them one by one in order, so the sends of each partition reach
// the WAL and the backups in sequence-number order, as before.
func (n *Node) decide(ctx context.Context, b *batch, idx []int, r *ring.Ring, mustOwn bool, t *walTicket) (*pb.CheckResponse, error) {
	cnt := len(b.items)
	if idx != nil {
		cnt = len(idx)
	}
	resp := newResponse(cnt)
	resp.RingEpoch = r.Epoch()
	clustered := n.clus.Load().ms != nil
	noMajority := clustered && !n.ho.majorityUnder(r)
	if clustered && !noMajority {
		n.waitMoving(ctx, b, idx, r)
	}
	var rs *replicaSet
	if clustered && n.cfg.Replication != ReplicationOff && r.Len() > 1 {
		rs = n.takeReplicaSet(cnt, r.Len())
		defer n.releaseReplicaSet(rs)
	}
	var enc *walEncoder
	var flight int // walFlight slot, with a WAL
	var takenBack int64
	if t != nil {
		n.refuseWhileWALFailed(b, idx)
		enc, _ = n.encoders.Get().(*walEncoder)
		if enc == nil {
			enc = new(walEncoder)
		}
		enc.reset()
		defer n.encoders.Put(enc)
		takenBack = n.takenBack.Load()
		flight = n.flight.enter()
	}
	now := n.nowMs()
	var dec *window.Decision
	var admitted, denied, failed, refunds int64
	var tl tally
	for j := range cnt {
		i := j
		if idx != nil {
			i = idx[j]
		}
		if j%decideChunk == 0 {
			b.applyChunk(n, idx, j, min(cnt, j+decideChunk), r, mustOwn, noMajority, now)
		}
		x := &b.items[i]
		resp.DeniedBy[j] = -1
		ierr := x.err
		dup := false
		if ierr == nil && noMajority {
			ierr = &itemError{codes.Unavailable, fmt.Sprintf("node %s sees %d members, not a majority of the cluster: it decides nothing until the cluster heals; retry", n.cfg.Name, r.Len())}
		}
		if ierr == nil {
			if owner := r.PartitionOwner(x.part); mustOwn && owner.Name != n.cfg.Name {
				ierr = &itemError{codes.Unavailable, fmt.Sprintf("recipient %s: node %s does not own it under ring epoch %d (owner %s); retry with the new ring",
					quote(b.req.Recipients[i]), n.cfg.Name, r.Epoch(), owner.Name)}
			} else if sb := &b.decided[b.slot[j%decideChunk]]; sb.Err != nil {
				ierr = n.applyError(b.req.Recipients[i], x.part, r, sb.Err)
				if errors.Is(sb.Err, store.ErrClosed) {
					b.moved = append(b.moved, i)
				}
			} else if dec = &sb.Dec; x.refund {
				dup = true // a refund is no decision: not counted as one
				s := walSend{domain: x.dv.d.Name(), key: x.key, tag: x.tag, seq: sb.Seq, at: dec.At, content: x.it.Content, cost: sb.Cost, id: x.id, refund: true}
				if sb.Dup {
					resp.Duplicates = append(resp.Duplicates, uint32(j))
				} else {
					resp.Refunded = append(resp.Refunded, uint32(j))
					refunds++
					if enc != nil {
						enc.add(s)
					}
				}
				if rs != nil {
					// A repeated refund goes to the backup again, as a
					// duplicate send does: its first answer may have failed
					// there. The backup skips a refund it has applied.
					s.seq = 0
					rs.add(r, x.part, j, s)
				}
			} else if sb.Dup {
				dup = true
				tl.duplicates++
				resp.Duplicates = append(resp.Duplicates, uint32(j))
				if rs != nil {
					// The first answer may have failed because the backup did
					// not confirm: make sure it has the send now (a backup
					// skips a request id it has recorded).
					rs.add(r, x.part, j, walSend{domain: x.dv.d.Name(), key: x.key, tag: x.tag, at: dec.At, content: x.it.Content, cost: x.it.Cost, id: x.id})
				}
			} else if dec.Recorded {
				s := walSend{domain: x.dv.d.Name(), key: x.key, tag: x.tag, seq: sb.Seq, at: dec.At, content: x.it.Content, cost: x.it.Cost, id: x.id}
				if enc != nil {
					enc.add(s)
				}
				if rs != nil {
					rs.add(r, x.part, j, s)
				}
			}
		}
		if ierr != nil {
			failed++
			tl.failed[ierr.code%numCodes]++
			resp.DecidedAtMs[j] = now
			resp.Errors = append(resp.Errors, &pb.ItemError{Index: uint32(j), Code: uint32(ierr.code), Message: ierr.msg})
			continue
		}
		resp.Domains[x.dv.d.Name()] = x.dv.proto
		if !dup {
			n.countUsage(now, x, dec)
		}
		switch {
		case x.refund:
		case dec.Admitted:
			admitted++
		default:
			denied++
		}
		if !x.refund {
			tl.decided(x.dv, dec.Admitted, dec.DeniedBy)
		}
		resp.Admitted[j] = dec.Admitted
		resp.Recorded[j] = dec.Recorded
		resp.DeniedBy[j] = int32(dec.DeniedBy)
		if dec.ShadowDeniedBy >= 0 && !x.dv.exempt {
			setShadowDeniedBy(resp, j, int32(dec.ShadowDeniedBy))
			if !x.refund {
				x.dv.rules[dec.ShadowDeniedBy].shadowDenied.Add(1) // rare: no tally
			}
		}
		resp.RetryAfterMs[j] = dec.RetryAfter
		resp.DecidedAtMs[j] = dec.At
		resp.RuleCounts[j] = uint32(dec.NumRules)
		for _, r := range dec.Rules[:dec.NumRules] {
			resp.Used = append(resp.Used, uint32(r.Used))
			resp.Remaining = append(resp.Remaining, uint32(r.Remaining))
			resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, r.RetryAfter)
		}
	}
	n.checks.Add(int64(cnt))
	n.admitted.Add(admitted)
	n.denied.Add(denied)
	n.failed.Add(failed)
	n.refunds.Add(refunds)
	tl.flush(&n.decisions)
	var replicated chan struct{}
	if rs != nil && len(rs.backups) > 0 {
		replicated = make(chan struct{})
		go func() { defer close(replicated); n.replicate(ctx, r, rs) }()
	}
	var walErr error
	if enc != nil {
		// The sends are recorded in memory: they go to the WAL even if the
		// caller has left (a deadline), or a crash would forget what the
		// node counts now.
		walErr = n.appendWAL(context.WithoutCancel(ctx), enc, t)
	}
	if replicated != nil {
		<-replicated
		n.failUnreplicated(ctx, resp, rs)
	}
	if walErr != nil {
		undone := n.takeBack(ctx, enc.bytes(), r)
		n.takenBack.Add(1)
		n.flight.leave(flight)
		if ok, held := n.walLogs.allow(time.Now().UnixNano(), walLogEvery); ok {
			n.log.Error("WAL append failed: the call's sends were taken back and it failed; calls that record fail until the log recovers",
				"sends_taken_back", undone, "failed_calls_not_logged", held, "err", walErr)
		}
		return nil, status.Errorf(codes.Unavailable, "node %s: write-ahead log: %v; nothing of this call was recorded; retry", n.cfg.Name, walErr)
	}
	if t != nil {
		n.flight.leave(flight)
		if len(resp.Duplicates) > 0 {
			n.confirmDuplicates(ctx, resp, takenBack)
		}
	}
	return resp, nil
}

// walLogEvery bounds how often failed WAL appends are logged.
const walLogEvery = 10 * time.Second

// confirmDuplicates holds the answers of items answered from their request
// id (resp.Duplicates) until the calls that recorded them have ended: a
// duplicate is answered as recorded only once the first attempt is durable.
// If any call's WAL append failed since the call began (takenBack moved),
// the first attempt may have been taken back: those items fail as
// retryable, and the retry is decided afresh.
func (n *Node) confirmDuplicates(ctx context.Context, resp *pb.CheckResponse, takenBack int64) {
	err := n.flight.wait(ctx)
	if err == nil && n.takenBack.Load() == takenBack {
		return
	}
	msg := fmt.Sprintf("node %s: an earlier attempt of this request id may not be durable (the write-ahead log failed); retry", n.cfg.Name)
	if err != nil {
		msg = fmt.Sprintf("node %s: waiting for an earlier attempt of this request id to be durable: %v; retry", n.cfg.Name, err)
	}
	for _, j := range resp.Duplicates {
		resp.Admitted[j], resp.Recorded[j] = false, false
		resp.Errors = append(resp.Errors, &pb.ItemError{Index: j, Code: uint32(codes.Unavailable), Message: msg})
	}
	sortErrors(resp.Errors)
}

// applyChunk decides, in the store, answers lo to hi-1 of decide (items
// idx[lo:hi] of b, or b.items[lo:hi] when idx is nil): those that passed
// decoding and, with mustOwn, that this node owns under r. decide reads
// their results through b.slot.
func (b *batch) applyChunk(n *Node, idx []int, lo, hi int, r *ring.Ring, mustOwn, noMajority bool, now int64) {
	b.decided, b.slot = b.decided[:0], b.slot[:0] // each entry is overwritten whole
	for j := lo; j < hi; j++ {
		i := j
		if idx != nil {
			i = idx[j]
		}
		x := &b.items[i]
		if x.err != nil || noMajority || (mustOwn && r.PartitionOwner(x.part).Name != n.cfg.Name) {
			b.slot = append(b.slot, -1)
			continue
		}
		b.slot = append(b.slot, int32(len(b.decided)))
		b.decided = append(b.decided, store.BatchItem{Part: x.part, Ref: x.dv.ref, Key: x.key, Tag: x.tag, Item: x.it, ID: x.id, Refund: x.refund})
	}
	n.store.ApplyBatch(now, b.decided)
}

// waitMoving waits, at most MoveWait and until ctx is done, for the
// partitions of the items to decide that this node owns under r but has not
// acquired yet.
func (n *Node) waitMoving(ctx context.Context, b *batch, idx []int, r *ring.Ring) {
	var waits []<-chan struct{}
	var seen map[int]bool // made on the first closed partition: the common batch meets none
	cnt := len(b.items)
	if idx != nil {
		cnt = len(idx)
	}
	for j := range cnt {
		i := j
		if idx != nil {
			i = idx[j]
		}
		x := &b.items[i]
		if x.err != nil || n.ho.isOpen(x.part) || seen[x.part] {
			continue
		}
		if seen == nil {
			seen = map[int]bool{}
		}
		seen[x.part] = true
		if r.PartitionOwner(x.part).Name == n.cfg.Name {
			waits = append(waits, n.ho.openCh(x.part))
		}
	}
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

// sortErrors orders item errors by index.
func sortErrors(es []*pb.ItemError) {
	sort.Slice(es, func(a, b int) bool { return es[a].Index < es[b].Index })
}

// applyError turns a store error into an item error. Its message names the
// recipient, not the item's index: a forwarded item's index is its place in
// the forwarded batch, not in the caller's.
func (n *Node) applyError(rcp string, p int, r *ring.Ring, err error) *itemError {
	switch {
	case errors.Is(err, store.ErrClosed):
		return &itemError{codes.Unavailable, fmt.Sprintf("recipient %s: partition %d is not open on %s under ring epoch %d (owner %s): it is moving; retry",
			quote(rcp), p, n.cfg.Name, r.Epoch(), r.PartitionOwner(p).Name)}
	case errors.Is(err, window.ErrInvalid):
		return badItem("recipient %s: %s", quote(rcp), trimPrefix(err))
	case errors.Is(err, store.ErrIDReused):
		return &itemError{codes.AlreadyExists, fmt.Sprintf("request_ids: recipient %s: %s; not recorded (a retry repeats its item exactly)",
			quote(rcp), strings.TrimPrefix(err.Error(), store.ErrIDReused.Error()+": "))}
	case errors.Is(err, store.ErrRefundUnknown):
		return &itemError{codes.NotFound, fmt.Sprintf("request_ids: recipient %s: %s: nothing refunded (a refund must come within the idempotency window of its send, and only a recorded send can be refunded)",
			quote(rcp), strings.TrimPrefix(err.Error(), store.ErrRefundUnknown.Error()+": "))}
	case errors.Is(err, store.ErrMemoryLimit):
		return n.refusedAtLimit(rcp)
	case errors.Is(err, window.ErrFull):
		return &itemError{codes.ResourceExhausted, fmt.Sprintf("recipient %s: %s", quote(rcp), trimPrefix(err))}
	}
	n.log.Error("check failed", "recipient", quote(rcp), "err", err)
	return &itemError{codes.Internal, fmt.Sprintf("recipient %s: %v", quote(rcp), err)}
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
