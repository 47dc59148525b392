package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/store"
)

// This file is the server side of the peer protocol: peerServer answers
// the Peer service's calls (Forward, Acquire, Release, Replicate,
// ReplicateStream, Fill, Handback), for gRPC (server.go registers it) and
// for in-process peers (localPeer calls its methods); Node has no method of
// the protocol. Every call has passed the guard first (security.go), and
// each checks what its caller may ask under this node's ring.

// peerServer answers the Peer service for node n.
type peerServer struct {
	pb.UnimplementedPeerServer
	n *Node
}

// Forward answers Peer.Forward: it decides the items this node owns under
// its own ring and fails the others as retryable.
func (s peerServer) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	n := s.n
	if rt := timingOf(ctx); rt != nil {
		n.queued(ctx)
		defer rt.handled()
	}
	st := n.startStages(CallForward, ctx)
	if err := n.admit(ctx, req); err != nil { // first: see check
		return nil, err
	}
	t := n.announce()
	defer t.cancel()
	n.forwardedIn.Add(int64(len(req.Recipients)))
	r := n.clus.Load().ring()
	b := decode(req, n.view.Load(), r)
	defer b.put()
	b.st = st
	b.st.lap(StageDecode)
	n.judge(b, r, true)
	b.st.lap(StageJudge)
	return n.decide(ctx, b, nil, r, t)
}

// ReplicateStream answers Peer.ReplicateStream (replstream.go).
func (s peerServer) ReplicateStream(stream grpc.BidiStreamingServer[pb.ReplicateRequest, pb.ReplicateAck]) error {
	return s.n.serveReplicateStream(stream.Context(), stream.Recv, stream.Send)
}

// refuse returns the error for a peer message this node does not take.
func (n *Node) refuse(format string, args ...any) error {
	return status.Errorf(codes.FailedPrecondition, "node %s: %s", n.cfg.Name, fmt.Sprintf(format, args...))
}

// peerRing checks a peer message: the node serves, the caller is in its
// ring and, with sameEpoch, its ring has the caller's epoch. It returns that
// ring. Acquire needs the same epoch (it fences the old owner); Replicate
// and Fill check ownership under this node's ring instead, which a ring
// change that moves nothing (a member flapping) leaves alone.
func (n *Node) peerRing(caller string, epoch uint64, sameEpoch bool) (*ring.Ring, error) {
	_, r, err := n.peerView(caller, epoch, sameEpoch)
	if err != nil {
		return nil, err
	}
	if !r.Has(caller) {
		return nil, n.refuse("the caller %s is not in the ring of epoch %d", caller, r.Epoch())
	}
	return r, nil
}

// peerView is peerRing without the check that the caller is in the ring.
func (n *Node) peerView(caller string, epoch uint64, sameEpoch bool) (*cluster, *ring.Ring, error) {
	if !n.ready.Load() {
		return nil, nil, status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	c := n.clus.Load()
	if c == nil || c.ms == nil {
		return nil, nil, n.refuse("not a cluster member")
	}
	if caller == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "node: the caller's name is empty")
	}
	r := c.ring()
	if sameEpoch && r.Epoch() != epoch {
		return nil, nil, n.refuse("ring epoch %d, the caller %s has %d; retry once rings agree", r.Epoch(), caller, epoch)
	}
	return c, r, nil
}

// Acquire answers Peer.Acquire (rule 2): it closes each partition and
// returns its image, in the newest image version the caller reads: a
// member left out of the ring for its older protocol still acquires from
// this node while the majority has not yet changed binaries.
func (s peerServer) Acquire(ctx context.Context, req *pb.AcquireRequest) (*pb.AcquireResponse, error) {
	n := s.n
	if req.Node == n.cfg.Name {
		return nil, n.refuse("a node never acquires from itself, and %q is this node's name", req.Node)
	}
	r, err := n.peerRing(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
		if o := r.PartitionOwner(int(p)); o.Name != req.Node {
			return nil, n.refuse("partition %d is owned by %s under epoch %d, not by %s", p, o.Name, r.Epoch(), req.Node)
		}
	}
	version := min(max(int(req.ImageVersion), 1), store.ImageVersion)
	if version < store.ImageVersion {
		// An older version cannot carry counter states: find out before any
		// partition is closed, so that a refusal leaves every one open.
		for _, p := range req.Partitions {
			if _, _, err := n.store.AppendImageVersion(nil, int(p), false, version); err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "partition %d: %v; upgrade %s before it takes partitions of a cluster whose rules use counting algorithms", p, err, req.Node)
			}
		}
	}
	resp := &pb.AcquireResponse{Node: n.cfg.Name}
	departures := n.clus.Load().ms.Departures(req.Node) // rule 8
	for _, p := range req.Partitions {
		// The acquirer is named before the image is cut, so that a
		// replicated send that a backup's store takes after the cut is
		// refused by its second judgment (recordReplicated).
		n.ho.mu.Lock()
		n.ho.parts[p].acquirer, n.ho.parts[p].acquirerDepartures = req.Node, departures
		n.ho.mu.Unlock()
		// An older version fails for counter states, which only a release
		// that reads record format 3 can hold (checked above; only a state
		// written since can fail here, and this partition stays open).
		img, _, err := n.store.AppendImageVersion(nil, int(p), true, version)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "partition %d: %v; upgrade %s before it takes partitions of a cluster whose rules use counting algorithms", p, err, req.Node)
		}
		n.closePartition(int(p))                   // wakes nobody; makes waiters wait for a next open
		parts, err := n.splitImages([][]byte{img}) // the acquirer logs them in bounded WAL records
		if err != nil {
			return nil, status.Errorf(codes.Internal, "partition %d: %v", p, err)
		}
		resp.Images = append(resp.Images, parts...)
		n.ho.mu.Lock()
		n.ho.parts[p].handed, n.ho.parts[p].owed = true, false
		resp.Generations = append(resp.Generations, n.ho.parts[p].gen)
		n.ho.mu.Unlock()
	}
	return resp, nil
}

// Release answers Peer.Release: it drops its copy of each partition it
// neither owns nor backs under its ring, nor owes its owner (rule 7).
func (s peerServer) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	n := s.n
	if req.Node == n.cfg.Name {
		return nil, n.refuse("a node never releases to itself, and %q is this node's name", req.Node)
	}
	r, err := n.peerRing(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	resp := &pb.ReleaseResponse{}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
		if r.PartitionOwner(int(p)).Name == n.cfg.Name || n.store.IsOpen(int(p)) {
			continue
		}
		if b, ok := r.PartitionReplica(int(p)); ok && b.Name == n.cfg.Name {
			continue
		}
		n.ho.mu.Lock()
		owed := n.ho.owes(int(p))
		n.ho.mu.Unlock()
		if owed {
			// Decided here since the caller pulled it (a Release may
			// arrive late, under an epoch that came back): the owner has
			// not acquired those sends yet (rule 7).
			continue
		}
		if dropped := n.store.Drop(int(p)); dropped > 0 {
			n.ho.releases.Add(1)
			n.log.Debug("partition released", "partition", p, "records", dropped, "to", req.Node)
		}
		resp.Dropped = append(resp.Dropped, p)
	}
	return resp, nil
}

// Handback answers Peer.Handback (rule 7): each partition the caller
// decided for and this node owns under the caller's ring is closed and
// acquired again from every member. The caller may be out of the ring (left
// out for other rules, or leaving), but must be a member.
func (s peerServer) Handback(ctx context.Context, req *pb.HandbackRequest) (*pb.HandbackResponse, error) {
	n := s.n
	c, r, err := n.peerView(req.Node, req.RingEpoch, true)
	if err != nil {
		return nil, err
	}
	known := false
	for _, m := range c.ms.Members() {
		known = known || m.Name == req.Node
	}
	if !known || req.Node == n.cfg.Name {
		return nil, n.refuse("the caller %q is not another member", req.Node)
	}
	for _, p := range req.Partitions {
		if int(p) >= n.store.Partitions() {
			return nil, status.Errorf(codes.InvalidArgument, "partitions: %d out of range [0, %d)", p, n.store.Partitions())
		}
	}
	h := n.ho
	var taken []uint32
	for i, p := range req.Partitions {
		if r.PartitionOwner(int(p)).Name != n.cfg.Name {
			continue // a newer owner pulls from every member anyway
		}
		h.mu.Lock()
		if len(req.Generations) == len(req.Partitions) && n.store.IsOpen(int(p)) && h.parts[p].pulledGen[req.Node] == req.Generations[i] {
			// Merged from the caller at this generation, open since: the
			// caller decided nothing for it after this node's pull.
			h.mu.Unlock()
			continue
		}
		taken = append(taken, p)
		h.parts[p].pullAll = true
		h.parts[p].handbacks++
		if h.parts[p].closedAt.IsZero() {
			h.parts[p].closedAt = time.Now()
		}
		h.mu.Unlock()
		if n.store.IsOpen(int(p)) {
			n.closePartition(int(p))
		}
	}
	if len(taken) > 0 {
		n.log.Info("partitions handed back: acquiring them again", "from", req.Node, "partitions", taken, "epoch", r.Epoch())
		h.wake()
	}
	return &pb.HandbackResponse{}, nil
}

// Fill answers Peer.Fill: it merges images of partitions this node backs.
func (s peerServer) Fill(ctx context.Context, req *pb.FillRequest) (*pb.FillResponse, error) {
	n := s.n
	r, err := n.peerRing(req.Node, req.RingEpoch, false)
	if err != nil {
		return nil, err
	}
	_, _, err = n.mergeImages(ctx, req.Images, func(h store.ImageHeader) error {
		if h.Partitions != n.store.Partitions() {
			return fmt.Errorf("an image of %d partitions, this node has %d", h.Partitions, n.store.Partitions())
		}
		if o := r.PartitionOwner(h.Partition); o.Name != req.Node {
			return fmt.Errorf("partition %d is owned by %s, not by %s", h.Partition, o.Name, req.Node)
		}
		if b, ok := r.PartitionReplica(h.Partition); !ok || b.Name != n.cfg.Name {
			return fmt.Errorf("partition %d is not backed by %s", h.Partition, n.cfg.Name)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrBadImage) {
			return nil, status.Errorf(codes.InvalidArgument, "node %s: %v", n.cfg.Name, err)
		}
		return nil, n.refuse("%v", err)
	}
	return &pb.FillResponse{}, nil
}
