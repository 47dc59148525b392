package node

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/ring"
)

// This file routes a decoded batch: items another member owns go to it in
// one Peer.Forward per owner, in parallel, and the answers are merged back
// in request order.

// group is the items of a batch that one member answers (owner), or that
// decoding refused (bad, their errors).
type group struct {
	owner ring.Member
	idx   []int // item indices in the original request
	resp  *pb.CheckResponse
	err   error
	bad   []*itemError // with no owner: the validation error of each item
}

// route answers a batch some of whose items another member owns (judge):
// it forwards them, one call per owner in parallel, decides the local ones
// meanwhile, and merges the answers in request order.
func (n *Node) route(ctx context.Context, b *batch, r *ring.Ring, t *walTicket) (*pb.CheckResponse, error) {
	groups, local := groupByOwner(b)
	var wg sync.WaitGroup
	for _, g := range groups {
		if g.bad == nil && g != local {
			wg.Go(func() {
				start := b.st.now()
				n.forward(ctx, b.req, r, g)
				b.st.since(StageForward, start)
			})
		}
	}
	if local != nil {
		local.resp, local.err = n.decide(ctx, b, local.idx, r, t)
	}
	wg.Wait()
	return wire.Merge(len(b.req.Recipients), n.parts(groups), r.Epoch()), nil
}

// groupByOwner groups the items of b by their verdict (judge): one group
// per owner they are forwarded to, the group decided here (local, nil if
// none), and the items decoding refused, which form a group of their own so
// that their errors name the caller's indices.
func groupByOwner(b *batch) (groups []*group, local *group) {
	byName := map[string]*group{}
	var invalid *group
	for i := range b.items {
		x := &b.items[i]
		switch x.where {
		case rejected:
			if invalid == nil {
				invalid = &group{}
				groups = append(groups, invalid)
			}
			invalid.idx = append(invalid.idx, i)
			invalid.bad = append(invalid.bad, x.err)
			continue
		case decidedHere:
			if local == nil {
				local = &group{owner: x.owner}
				groups = append(groups, local)
			}
			local.idx = append(local.idx, i)
			continue
		}
		g := byName[x.owner.Name]
		if g == nil {
			g = &group{owner: x.owner}
			byName[x.owner.Name] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	return groups, local
}

// forward sends group g's items of req to their owner (Peer.Forward) under
// ring r and keeps its answer, or why there is none, in g.
func (n *Node) forward(ctx context.Context, req *pb.CheckRequest, r *ring.Ring, g *group) {
	n.forwardedOut.Add(int64(len(g.idx)))
	cli, err := n.peers.Peer(g.owner)
	if err != nil {
		g.err = err
		return
	}
	fctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
	defer cancel()
	sub := wire.Pick(req, g.idx, r.Epoch())
	if dl, ok := fctx.Deadline(); ok && (sub.NotAfterMs == 0 || dl.UnixMilli() < sub.NotAfterMs) {
		sub.NotAfterMs = dl.UnixMilli() // an owner that reads it later decides nothing (admit)
	}
	g.resp, g.err = cli.Forward(fctx, sub)
	if status.Code(g.err) == codes.Canceled && ctx.Err() == nil {
		// The connection closed under the call: the owner left the ring.
		g.err = status.Errorf(codes.Unavailable, "%v", g.err)
	}
	if status.Code(g.err) == codes.Unavailable {
		n.suspect(g.owner)
	}
}

// parts returns the answers of the groups, for wire.Merge: a group's
// response, or its items' errors: those decoding found, or, for a group
// whose owner did not answer (or answered a malformed response), its
// failure, UNAVAILABLE (retryable) unless it has a code of its own, counted
// in the node's decisions as failed.
func (n *Node) parts(groups []*group) []wire.Part {
	parts := make([]wire.Part, len(groups))
	for k, g := range groups {
		parts[k].Idx = g.idx
		switch {
		case g.bad != nil:
			for _, e := range g.bad {
				parts[k].Errors = append(parts[k].Errors, &pb.ItemError{Code: uint32(e.code), Message: e.msg, Field: e.field})
			}
			continue
		case g.resp != nil:
			r, err := wire.Read(g.resp, len(g.idx))
			if err == nil {
				parts[k].Resp = r
				continue
			}
			g.err = status.Errorf(codes.Unavailable, "a malformed response: %v", err)
		}
		msg := fmt.Sprintf("owner %s (%s) did not answer: %v", g.owner.Name, g.owner.Addr, g.err)
		if g.owner.Name == n.cfg.Name {
			msg = fmt.Sprintf("%v", g.err)
		}
		code := status.Code(g.err)
		if code == codes.Unknown {
			code = codes.Unavailable
		}
		n.decisions.fail(code, int64(len(g.idx)))
		e := &pb.ItemError{Code: uint32(code), Message: msg}
		for range g.idx {
			parts[k].Errors = append(parts[k].Errors, e)
		}
	}
	return parts
}
