package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
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
}

// ring returns the current ring.
func (c *cluster) ring() *ring.Ring {
	if c.ms != nil {
		return c.ms.Ring()
	}
	return c.static
}

// startCluster joins the gossip membership (Config.Cluster) or builds the
// ring of this node alone. Open calls it once the node has recovered, so that
// no peer routes to a node that cannot answer yet.
func (n *Node) startCluster(ctx context.Context) error {
	c := &cluster{self: ring.Member{Name: n.cfg.Name, Addr: n.cfg.AdvertiseAddr}}
	if n.cfg.Cluster == nil {
		r, err := ring.New([]ring.Member{c.self}, n.cfg.Placement)
		if err != nil {
			return err
		}
		c.static = r
		n.clus.Store(c)
		return nil
	}
	gc := n.gossipConfig()
	if err := n.loadMembers(); err != nil {
		return err
	}
	ms, err := gossip.Start(ctx, gc)
	if err != nil {
		return fmt.Errorf("node: joining the cluster: %w", err)
	}
	if err := n.refuseTakenName(ctx, ms); err != nil {
		ms.Close()
		return err
	}
	c.ms = ms
	// Every partition is closed until this node acquires it under a ring
	// that makes it the owner (partition.go).
	for p := range n.store.Partitions() {
		n.closePartition(p)
	}
	n.clus.Store(c)
	ch, cancel := ms.Watch()
	rings := make(chan *ring.Ring, 1)
	syncKick := make(chan struct{}, 1) // overrides.go: pull the peers' admin overrides
	n.loops.Go(func() { n.syncLoop(n.moverCtx, syncKick) })
	n.loops.Go(func() {
		defer cancel()
		n.ringLoop(ch, rings, syncKick)
	})
	n.loops.Go(func() { n.moverLoop(n.moverCtx, rings) })
	n.loops.Go(func() { n.handbackLoop(n.moverCtx) })
	return nil
}

// gossipConfig is Config.Cluster with this node's name, address, placement
// and rules' agreement filled in, joining.
func (n *Node) gossipConfig() gossip.Config {
	gc := *n.cfg.Cluster
	gc.NodeName, gc.GRPCAddr, gc.Placement = n.cfg.Name, n.cfg.AdvertiseAddr, n.cfg.Placement
	// Open holds reloadMu: a reload waits until the membership is stored,
	// and then announces its rules to it.
	gc.Agreement = n.agreement(n.view.Load().rules)
	// Joining keeps this node out of every ring until it can decide.
	gc.State = gossip.StateJoining
	if gc.Logger == nil {
		gc.Logger = n.log.With("component", "gossip")
	}
	if gc.Now == nil { // gossip measures the clock decisions use
		clk := n.cfg.Clock
		gc.Now = func() time.Time { return time.Unix(0, clk.Now()) }
	}
	return gc
}

// ringLoop passes each ring the membership announces on ch on: it prunes
// the peer connections, kicks the override sync and hands the mover the
// newest ring (rings holds one; an older one not yet taken is replaced).
// It closes rings when ch closes.
func (n *Node) ringLoop(ch <-chan *ring.Ring, rings chan *ring.Ring, syncKick chan<- struct{}) {
	defer close(rings)
	for r := range ch {
		n.peers.Prune(r)
		select {
		case syncKick <- struct{}{}:
		default: // a sync is pending: it will read the newest ring
		}
		n.log.Info("ring changed", "epoch", r.Epoch(), "members", len(r.Members()))
		select {
		case rings <- r:
		default:
			select {
			case <-rings:
			default:
			}
			rings <- r
		}
	}
}

// nameProbeTimeout bounds the call that finds out whether a member seen
// under this node's name still answers.
const nameProbeTimeout = 2 * time.Second

// ErrNameTaken is Open's error for a node whose name a live member has: two
// members with one name split the ring.
var ErrNameTaken = errors.New("node: the name is taken")

// refuseTakenName fails if a member seen under this node's own name while
// joining (gossip.NameConflicts) still answers as that name: a second
// process with the same name, which gossip ignores, so that this one would
// own every partition alone. A member that does not answer, or answers
// under another name, is a former run of this node at another address that
// the others have not seen go yet: gossip lets this one in once they have.
func (n *Node) refuseTakenName(ctx context.Context, ms *gossip.Membership) error {
	for _, c := range ms.NameConflicts() {
		if c.GRPCAddr == "" || c.GRPCAddr == n.cfg.AdvertiseAddr {
			continue
		}
		p, err := n.peers.Peer(ring.Member{Name: n.cfg.Name, Addr: c.GRPCAddr})
		if err != nil {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, nameProbeTimeout)
		st, err := p.Status(pctx, &pb.StatusRequest{})
		cancel()
		if err == nil && st.Node == n.cfg.Name {
			return fmt.Errorf("%w: %q is the name of a live member at %s (gossip %s); this node advertises %s: give each node a unique --name (without one, the host name is used)",
				ErrNameTaken, n.cfg.Name, c.GRPCAddr, c.GossipAddr, n.cfg.AdvertiseAddr)
		}
		n.log.Warn("a member seen under this node's name does not answer as it: taken for a former run of this node", "other_grpc_addr", c.GRPCAddr, "other_gossip_addr", c.GossipAddr, "err", err)
	}
	return nil
}

// suspect asks gossip to look at member m, whose call failed as
// unavailable: if its address refuses connections, its process is gone,
// and it leaves the ring without waiting for failure detection
// (gossip.Membership.Suspect). Safe for concurrent use; it does not block.
func (n *Node) suspect(m ring.Member) {
	if c := n.clus.Load(); c != nil && c.ms != nil && m.Name != n.cfg.Name {
		c.ms.Suspect(m.Name)
	}
}

// clockWait bounds the clock measurement before a node announces serving.
const clockWait = 2 * time.Second

// announceServing tells peers this node decides now, which puts it in their
// rings. Open calls it once the node is ready, so that no forward arrives
// before. First it measures its clock against the members' (at most
// clockWait): a node whose clock is off publishes so and never enters a
// ring. SetState blocks while gossip spreads the news.
func (n *Node) announceServing(ctx context.Context) error {
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, clockWait)
	clock := c.ms.MeasureClock(mctx)
	cancel()
	if clock.Measured < clock.Others {
		n.log.Warn("announcing serving with the clock measured against only some members", "measured", clock.Measured, "members", clock.Others)
	}
	err := c.ms.SetState(ctx, gossip.StateServing)
	switch {
	case err == nil:
	case errors.Is(err, gossip.ErrClosed), errors.Is(err, gossip.ErrLeft), ctx.Err() != nil:
		return fmt.Errorf("node: announcing serving: %w", err)
	default:
		// The broadcast did not reach a peer in time (a busy machine, lost
		// packets): the local state is serving already, and gossip spreads
		// it with its next rounds, as it would a broadcast that had gone
		// out but not yet arrived everywhere.
		n.log.Warn("announcing serving: no peer confirmed it yet; gossip spreads it later", "err", err)
	}
	return nil
}

// Leave hands this node's partitions over to their next owners (it
// announces "leaving" and waits until they have acquired them), then leaves
// the membership, so that peers stop routing to it, and waits for gossip to
// spread it; all at most until ctx is done. Serve
// calls it on shutdown; a node without a cluster does nothing.
func (n *Node) Leave(ctx context.Context) {
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return
	}
	n.drain(ctx)
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
			resp.Known = append(resp.Known, &pb.Member{Name: m.Name, Addr: m.GRPCAddr, State: m.State.String(),
				Excluded: m.Excluded, Version: m.Version})
		}
	} else {
		resp.Known = []*pb.Member{{Name: n.cfg.Name, Addr: n.cfg.AdvertiseAddr, State: gossip.StateServing.String(), Version: Version()}}
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

// errStopping ends ring watchers when the node shuts down.
var errStopping = status.Error(codes.Unavailable, "node is shutting down: watch another node")

// stopWatchers ends every WatchRing call, now and to come. Safe to call
// more than once.
func (n *Node) stopWatchers() { n.stopOnce.Do(func() { close(n.stopping) }) }

// WatchRing sends the current ring, then each change, until ctx is done or
// the node shuts down.
func (n *Node) WatchRing(ctx context.Context, send func(*pb.RingResponse) error) error {
	c := n.clus.Load()
	if c == nil {
		return status.Error(codes.Unavailable, "node is not serving yet")
	}
	if w := n.watchers.Add(1); w > int64(n.cfg.Limits.MaxWatchers) {
		n.watchers.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "node %s has %d ring watchers, the most it serves (--max-watchers): watch another node", n.cfg.Name, n.cfg.Limits.MaxWatchers)
	}
	defer n.watchers.Add(-1)
	if c.ms == nil {
		if err := send(n.ringProto(c.static)); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-n.stopping:
			return errStopping
		}
		return nil
	}
	ch, cancel := c.ms.Watch()
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.stopping:
			return errStopping
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
