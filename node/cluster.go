package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
)

// ForwardTimeout bounds a forward to a peer when the incoming call has no
// earlier deadline.
const ForwardTimeout = 5 * time.Second

// cluster is a node's view of its peers: the static ring of itself alone, or
// a gossip membership.
type cluster struct {
	self   ring.Member
	static *ring.Ring         // the ring of a node without Config.Cluster
	ms     *gossip.Membership // nil without Config.Cluster

	mu    sync.Mutex                  // guards conns
	conns map[string]*grpc.ClientConn // by gRPC address
}

// ring returns the current ring.
func (c *cluster) ring() *ring.Ring {
	if c.ms != nil {
		return c.ms.Ring()
	}
	return c.static
}

// peer returns a client for the peer at addr, dialling it on first use.
func (c *cluster) peer(addr string) (pb.PeerClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn := c.conns[addr]; conn != nil {
		return pb.NewPeerClient(conn), nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRequestBytes)))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = conn
	return pb.NewPeerClient(conn), nil
}

// prune closes connections to addresses no longer in r.
func (c *cluster) prune(r *ring.Ring) {
	keep := map[string]bool{}
	for _, m := range r.Members() {
		keep[m.Addr] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, conn := range c.conns {
		if !keep[addr] {
			conn.Close()
			delete(c.conns, addr)
		}
	}
}

func (c *cluster) close() {
	c.mu.Lock()
	for addr, conn := range c.conns {
		conn.Close()
		delete(c.conns, addr)
	}
	c.mu.Unlock()
}

// startCluster joins the gossip membership (Config.Cluster) or builds the
// ring of this node alone. Open calls it once the node has recovered, so that
// no peer routes to a node that cannot answer yet.
func (n *Node) startCluster(ctx context.Context) error {
	c := &cluster{self: ring.Member{Name: n.cfg.Name, Addr: n.cfg.AdvertiseAddr}, conns: map[string]*grpc.ClientConn{}}
	if n.cfg.Cluster == nil {
		r, err := ring.New([]ring.Member{c.self}, n.cfg.Placement)
		if err != nil {
			return err
		}
		c.static = r
		n.clus.Store(c)
		return nil
	}
	gc := *n.cfg.Cluster
	gc.NodeName, gc.GRPCAddr, gc.Placement = n.cfg.Name, n.cfg.AdvertiseAddr, n.cfg.Placement
	// Joining keeps this node out of every ring until it can decide.
	gc.State = gossip.StateJoining
	if gc.Logger == nil {
		gc.Logger = n.log.With("component", "gossip")
	}
	ms, err := gossip.Start(ctx, gc)
	if err != nil {
		return fmt.Errorf("node: joining the cluster: %w", err)
	}
	c.ms = ms
	n.clus.Store(c)
	ch, cancel := ms.Watch()
	n.loops.Go(func() {
		defer cancel()
		for r := range ch {
			c.prune(r)
			n.log.Info("ring changed", "epoch", r.Epoch(), "members", len(r.Members()))
		}
	})
	return nil
}

// announceServing tells peers this node decides now, which puts it in their
// rings. Open calls it once the node is ready, so that no forward arrives
// before. SetState blocks while gossip spreads the news.
func (n *Node) announceServing(ctx context.Context) error {
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return nil
	}
	if err := c.ms.SetState(ctx, gossip.StateServing); err != nil {
		return fmt.Errorf("node: announcing serving: %w", err)
	}
	return nil
}

// leaveCluster announces that this node is leaving, so that peers stop
// routing to it, and waits (at most until ctx is done) for gossip to spread it.
func (n *Node) leaveCluster(ctx context.Context) {
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return
	}
	if err := c.ms.Leave(ctx); err != nil && !errors.Is(err, gossip.ErrLeft) && !errors.Is(err, gossip.ErrClosed) {
		n.log.Warn("leaving the cluster", "err", err)
	}
}

// Ring returns the node's current ring.
func (n *Node) Ring() *ring.Ring {
	c := n.clus.Load()
	if c == nil {
		return nil
	}
	return c.ring()
}

// group is the items of a batch that one member owns, or that failed
// validation here (owner zero, err set).
type group struct {
	owner ring.Member
	idx   []int // item indices in the original request
	resp  *pb.CheckResponse
	err   error
	bad   []*itemError // with no owner: the validation error of each item
}

// route returns the items of req grouped by owner under r, or nil if this
// node owns them all. Items that fail validation are not routed: they form a
// group of their own, so that their errors name the caller's indices.
func (n *Node) route(req *pb.CheckRequest, r *ring.Ring) []*group {
	self := n.clus.Load().self.Name
	var groups []*group
	byName := map[string]*group{}
	remote := false
	var invalid *group
	for i, rcp := range req.Recipients {
		if _, _, ierr := n.item(req, i); ierr != nil {
			if invalid == nil {
				invalid = &group{}
				groups = append(groups, invalid)
			}
			invalid.idx = append(invalid.idx, i)
			invalid.bad = append(invalid.bad, ierr)
			continue
		}
		m := r.PartitionOwner(r.PartitionHash(ring.HashString(rcp)))
		g := byName[m.Name]
		if g == nil {
			g = &group{owner: m}
			byName[m.Name] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		remote = remote || m.Name != self
	}
	if !remote {
		return nil
	}
	return groups
}

// checkRouted decides the local items, forwards the others to their owners
// in parallel (one call per owner) and merges the answers in request order.
func (n *Node) checkRouted(ctx context.Context, req *pb.CheckRequest, r *ring.Ring, groups []*group, t *walTicket) (*pb.CheckResponse, error) {
	c := n.clus.Load()
	var wg sync.WaitGroup
	var local *group
	for _, g := range groups {
		if g.bad != nil {
			continue
		}
		if g.owner.Name == c.self.Name {
			local = g
			continue
		}
		n.forwardedOut.Add(int64(len(g.idx)))
		wg.Go(func() {
			cli, err := c.peer(g.owner.Addr)
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
		})
	}
	if local != nil {
		local.resp, local.err = n.decide(ctx, subRequest(req, local.idx, r.Epoch()), r, false, t)
	}
	wg.Wait()
	return mergeResponses(len(req.Recipients), groups, r.Epoch(), c.self.Name), nil
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
			for _, d := range g.resp.Duplicates {
				if int(d) < len(g.idx) {
					out.Duplicates = append(out.Duplicates, uint32(g.idx[d]))
				}
			}
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
		out.RetryAfterMs[i], out.DecidedAtMs[i] = r.RetryAfterMs[s.j], r.DecidedAtMs[s.j]
		k := int(r.RuleCounts[s.j])
		out.RuleCounts[i] = uint32(k)
		out.Used = append(out.Used, r.Used[s.off:s.off+k]...)
		out.Remaining = append(out.Remaining, r.Remaining[s.off:s.off+k]...)
		out.RuleRetryAfterMs = append(out.RuleRetryAfterMs, r.RuleRetryAfterMs[s.off:s.off+k]...)
	}
	sortErrors(out.Errors)
	slices.Sort(out.Duplicates)
	return out
}

// Forward answers Peer.Forward: it decides the items this node owns under
// its own ring and fails the others as retryable.
func (n *Node) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	t := n.announce()
	defer t.cancel()
	if err := n.admit(ctx, req); err != nil {
		return nil, err
	}
	n.forwardedIn.Add(int64(len(req.Recipients)))
	return n.decide(ctx, req, n.clus.Load().ring(), true, t)
}

// ringProto describes r for the Ring RPC.
func (n *Node) ringProto(r *ring.Ring) *pb.RingResponse {
	cfg := r.Config()
	resp := &pb.RingResponse{
		Epoch: r.Epoch(), Node: n.cfg.Name,
		Placement: &pb.Placement{PartitionCount: uint32(cfg.PartitionCount), ReplicationFactor: uint32(cfg.ReplicationFactor), Load: cfg.Load},
	}
	for _, m := range r.Members() {
		resp.Members = append(resp.Members, &pb.Member{Name: m.Name, Addr: m.Addr})
	}
	if c := n.clus.Load(); c.ms != nil {
		for _, m := range c.ms.Members() {
			resp.Known = append(resp.Known, &pb.Member{Name: m.Name, Addr: m.GRPCAddr, State: m.State.String()})
		}
	} else {
		resp.Known = []*pb.Member{{Name: n.cfg.Name, Addr: n.cfg.AdvertiseAddr, State: gossip.StateServing.String()}}
	}
	return resp
}

// RingInfo answers the Ring RPC.
func (n *Node) RingInfo(context.Context, *pb.RingRequest) (*pb.RingResponse, error) {
	c := n.clus.Load()
	if c == nil {
		return nil, status.Error(codes.Unavailable, "node is not serving yet")
	}
	return n.ringProto(c.ring()), nil
}

// WatchRing sends the current ring, then each change, until ctx is done.
func (n *Node) WatchRing(ctx context.Context, send func(*pb.RingResponse) error) error {
	c := n.clus.Load()
	if c == nil {
		return status.Error(codes.Unavailable, "node is not serving yet")
	}
	if c.ms == nil {
		if err := send(n.ringProto(c.static)); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}
	ch, cancel := c.ms.Watch()
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case r, ok := <-ch:
			if !ok {
				return status.Error(codes.Unavailable, "node is leaving")
			}
			if err := send(n.ringProto(r)); err != nil {
				return err
			}
		}
	}
}
