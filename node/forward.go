package node

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// This file routes a decoded batch: items another member owns go to it in
// one Peer.Forward per owner, in parallel, and the answers are merged back
// in request order.

// group is the items of a batch that one member owns, or that failed
// validation here (owner zero, err set).
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
			wg.Go(func() { n.forward(ctx, b.req, r, g) })
		}
	}
	if local != nil {
		local.resp, local.err = n.decide(ctx, b, local.idx, r, t)
	}
	wg.Wait()
	for _, g := range groups {
		if g.bad == nil && g.resp == nil && g.err != nil {
			code := status.Code(g.err)
			if code == codes.Unknown {
				code = codes.Unavailable // as mergeResponses answers
			}
			n.decisions.fail(code, int64(len(g.idx)))
		}
	}
	return mergeResponses(len(b.req.Recipients), groups, r.Epoch(), n.cfg.Name), nil
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
	g.resp, g.err = cli.Forward(fctx, subRequest(req, g.idx, r.Epoch()))
	if status.Code(g.err) == codes.Canceled && ctx.Err() == nil {
		// The connection closed under the call: the owner left the ring.
		g.err = status.Errorf(codes.Unavailable, "%v", g.err)
	}
}

// subRequest returns the items idx of req as a request of their own.
func subRequest(req *pb.CheckRequest, idx []int, epoch uint64) *pb.CheckRequest {
	sub := &pb.CheckRequest{RingEpoch: epoch, Recipients: make([]string, len(idx))}
	for j, i := range idx {
		sub.Recipients[j] = req.Recipients[i]
	}
	sub.Domains = pick(req.Domains, idx)
	sub.Contents = pick(req.Contents, idx)
	sub.ContentHashes = pick(req.ContentHashes, idx)
	sub.Costs = pick(req.Costs, idx)
	sub.Modes = pick(req.Modes, idx)
	sub.RequestIds = pick(req.RequestIds, idx)
	return sub
}

// pick returns entries idx of a per-item column; a column of 0 or 1 entries
// applies to every item and is kept as it is.
func pick[T any](c []T, idx []int) []T {
	if len(c) <= 1 {
		return c
	}
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = c[i]
	}
	return out
}

// mergeResponses assembles the response to a batch of n items from the
// answers of its groups. Items of a group whose call failed get an
// UNAVAILABLE error naming the owner.
func mergeResponses(n int, groups []*group, epoch uint64, self string) *pb.CheckResponse {
	out := newResponse(n)
	out.RingEpoch = epoch
	type src struct {
		g   *group
		j   int // position in the group
		off int // first per-rule entry in the group's response
	}
	where := make([]src, n)
	for _, g := range groups {
		off := 0
		for j, i := range g.idx {
			where[i] = src{g: g, j: j, off: off}
			if g.resp != nil && j < len(g.resp.RuleCounts) {
				off += int(g.resp.RuleCounts[j])
			}
		}
		if g.resp != nil {
			for name, d := range g.resp.Domains {
				out.Domains[name] = d
			}
			for _, e := range g.resp.Errors {
				if int(e.Index) < len(g.idx) {
					out.Errors = append(out.Errors, &pb.ItemError{Index: uint32(g.idx[e.Index]), Code: e.Code, Message: e.Message})
				}
			}
			out.Duplicates = remapIndices(out.Duplicates, g.resp.Duplicates, g.idx)
			out.Refunded = remapIndices(out.Refunded, g.resp.Refunded, g.idx)
		}
	}
	for i := range n {
		s := where[i]
		r := s.g.resp
		if s.g.bad != nil {
			e := s.g.bad[s.j]
			out.DeniedBy[i] = -1
			out.Errors = append(out.Errors, &pb.ItemError{Index: uint32(i), Code: uint32(e.code), Message: e.msg})
			continue
		}
		if r == nil || len(r.Admitted) <= s.j {
			out.DeniedBy[i] = -1
			msg := fmt.Sprintf("owner %s (%s) did not answer: %v", s.g.owner.Name, s.g.owner.Addr, s.g.err)
			if s.g.owner.Name == self {
				msg = fmt.Sprintf("%v", s.g.err)
			}
			out.Errors = append(out.Errors, &pb.ItemError{Index: uint32(i), Code: uint32(status.Code(s.g.err)), Message: msg})
			if status.Code(s.g.err) == codes.Unknown {
				out.Errors[len(out.Errors)-1].Code = uint32(codes.Unavailable)
			}
			continue
		}
		out.Admitted[i], out.Recorded[i], out.DeniedBy[i] = r.Admitted[s.j], r.Recorded[s.j], r.DeniedBy[s.j]
		if len(r.ShadowDeniedBy) > s.j && r.ShadowDeniedBy[s.j] >= 0 {
			setShadowDeniedBy(out, i, r.ShadowDeniedBy[s.j])
		}
		out.RetryAfterMs[i], out.DecidedAtMs[i] = r.RetryAfterMs[s.j], r.DecidedAtMs[s.j]
		k := int(r.RuleCounts[s.j])
		out.RuleCounts[i] = uint32(k)
		out.Used = append(out.Used, r.Used[s.off:s.off+k]...)
		out.Remaining = append(out.Remaining, r.Remaining[s.off:s.off+k]...)
		out.RuleRetryAfterMs = append(out.RuleRetryAfterMs, r.RuleRetryAfterMs[s.off:s.off+k]...)
	}
	sortErrors(out.Errors)
	slices.Sort(out.Duplicates)
	slices.Sort(out.Refunded)
	return out
}

// remapIndices appends to dst the item indices of a group's answer (src,
// indices into the group) as indices into the whole request (idx[j]).
func remapIndices(dst, src []uint32, idx []int) []uint32 {
	for _, j := range src {
		if int(j) < len(idx) {
			dst = append(dst, uint32(idx[j]))
		}
	}
	return dst
}
