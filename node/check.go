package node

import (
	"context"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// This file is a check, stage by stage:
//
//	admit    the node serves and the batch is well formed (admit)
//	decode   each item decoded, validated and hashed once (decode.go)
//	judge    each item's verdict under the ring: decided here or forwarded
//	         to its owner, at the one place ownership is judged (partition.go)
//	route    remote items forwarded, one call per owner (forward.go)
//	decide   local items decided in the store, answered, counted and
//	         recorded (decide.go), then made durable and replicated (record.go)
//
// A Peer.Forward call takes the same stages but route (peerrpc.go).

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
		n.queued(ctx)
		start := time.Now()
		defer func() { n.cfg.Observer.CheckDone(len(req.Recipients), time.Since(start)) }()
	}
	st := n.startStages(CallCheck, ctx)
	if !reroute {
		st.restart() // the request's unmarshal was the first call's
	}
	// Admitted first: a call that reaches a node still in Open (a peer of an
	// in-process cluster can) must not read its WAL before recovery ends.
	if err := n.admit(ctx, req); err != nil {
		return nil, err
	}
	r := n.clus.Load().ring()
	b := decode(req, n.view.Load(), r)
	defer b.put()
	b.st = st
	b.st.lap(StageDecode)
	var resp *pb.CheckResponse
	var err error
	remote, local := n.judge(b, r, false)
	b.st.lap(StageJudge)
	// The WAL's group commit waits for announced appends: a call whose
	// items all go elsewhere announces none, or it would hold every commit
	// back for as long as its forwards take.
	var t *walTicket
	if local {
		t = n.announce()
		defer t.cancel()
	}
	if remote {
		resp, err = n.route(ctx, b, r, t)
	} else {
		resp, err = n.decide(ctx, b, nil, r, t)
	}
	if err != nil || !reroute || len(b.moved) == 0 || n.clus.Load().ring().Epoch() == r.Epoch() {
		return resp, err
	}
	t.cancel()
	moved := slices.Clone(b.moved)
	again, err := n.check(ctx, wire.Pick(req, moved, 0), false)
	if err != nil {
		return resp, nil // the items keep their retryable errors
	}
	return replaceItems(resp, moved, again), nil
}

// replaceItems returns resp with the answers of items idx replaced by those
// of sub, a response to those items alone.
func replaceItems(resp *pb.CheckResponse, idx []int, sub *pb.CheckResponse) *pb.CheckResponse {
	all := make([]int, len(resp.Admitted))
	for i := range all {
		all[i] = i
	}
	first, err := wire.Read(resp, len(all))
	if err != nil {
		panic("BUG: node: a response of this node's is malformed: " + err.Error())
	}
	second, err := wire.Read(sub, len(idx))
	if err != nil {
		panic("BUG: node: a response of this node's is malformed: " + err.Error())
	}
	// Merge takes each item from the last part that has it.
	return wire.Merge(len(all), []wire.Part{{Idx: all, Resp: first}, {Idx: idx, Resp: second}}, sub.RingEpoch)
}

// admit refuses calls the node cannot take: before Open, after Close, and
// malformed batches.
func (n *Node) admit(ctx context.Context, req *pb.CheckRequest) error {
	if !n.ready.Load() {
		return status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	if err := wire.CheckRequest(req, MaxBatch); err != nil {
		return badRequest(err.(*wire.ShapeError))
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if late, ok := n.readLate(req.NotAfterMs); ok {
		return status.Errorf(codes.DeadlineExceeded, "node %s: the caller's deadline (not_after_ms %d) passed %d ms before the node read the request (it was stopped or starved, or the request queued); nothing decided", n.cfg.Name, req.NotAfterMs, late)
	}
	return nil
}

// readLate reports whether a call whose caller waits until unix ms notAfter
// (0: no deadline) is read more than LateRequestSlack after it, how late in
// ms, and counts it (LateRequests). It reads the wall clock, not
// Config.Clock: the deadline is the caller's.
func (n *Node) readLate(notAfter int64) (lateMs int64, late bool) {
	if notAfter == 0 {
		return 0, false
	}
	lateMs = time.Now().UnixMilli() - notAfter
	if lateMs <= LateRequestSlack.Milliseconds() {
		return 0, false
	}
	n.lateRequests.Add(1)
	return lateMs, true
}

// LateRequestSlack is how long past a request's not_after_ms a node still
// decides it: room for the clocks of caller and node to differ. A request
// read later than that is refused whole (admit), for its caller has given
// up and may have retried elsewhere: a decision would count a send nobody
// is told of.
const LateRequestSlack = time.Second

// badRequest is the INVALID_ARGUMENT status of a malformed batch, with its
// column as a google.rpc.BadRequest field violation in its details.
func badRequest(e *wire.ShapeError) error {
	st := status.New(codes.InvalidArgument, e.Error())
	if d, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: e.Field, Description: e.Msg}}}); err == nil {
		st = d
	}
	return st.Err()
}
