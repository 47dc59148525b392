package node

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
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
)

// String returns "sync" or "off".
func (r Replication) String() string {
	switch r {
	case ReplicationSync:
		return "sync"
	case ReplicationOff:
		return "off"
	}
	return fmt.Sprintf("Replication(%d)", uint8(r))
}

// ParseReplication parses "sync" or "off".
func ParseReplication(s string) (Replication, error) {
	switch s {
	case "sync":
		return ReplicationSync, nil
	case "off":
		return ReplicationOff, nil
	}
	return 0, fmt.Errorf("node: replication %q is not one of sync, off", s)
}

// replicaSet gathers the sends of one batch by backup.
type replicaSet struct {
	backups map[string]*replicaBatch
}

// replicaBatch is what one backup gets from one batch.
type replicaBatch struct {
	member ring.Member
	enc    walEncoder
	items  []int // response indices of the items whose sends are in enc
	err    error
}

// add puts send s, answer j of the response, on the batch of p's backup
// under r, if p has one.
func (rs *replicaSet) add(r *ring.Ring, p, j int, s walSend) {
	b, ok := r.PartitionReplica(p)
	if !ok {
		return
	}
	if rs.backups == nil {
		rs.backups = map[string]*replicaBatch{}
	}
	rb := rs.backups[b.Name]
	if rb == nil {
		rb = &replicaBatch{member: b}
		rs.backups[b.Name] = rb
	}
	rb.enc.add(s)
	rb.items = append(rb.items, j)
}

// replicate sends each backup its sends (Peer.Replicate), in parallel, and
// waits for them all.
func (n *Node) replicate(ctx context.Context, r *ring.Ring, rs *replicaSet) {
	var wg sync.WaitGroup
	for _, rb := range rs.backups {
		wg.Go(func() {
			cli, err := n.peers.Peer(rb.member)
			if err != nil {
				rb.err = err
				return
			}
			rctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
			defer cancel()
			_, rb.err = cli.Replicate(rctx, &pb.ReplicateRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), Sends: rb.enc.bytes()})
			n.replicated.Add(int64(rb.enc.n))
		})
	}
	wg.Wait()
}

// failUnreplicated turns the answers of items whose backup did not confirm
// into UNAVAILABLE errors: they are recorded here, not on their backup, and
// were not admitted as far as the caller knows.
func (n *Node) failUnreplicated(resp *pb.CheckResponse, rs *replicaSet) {
	for _, rb := range rs.backups {
		if rb.err == nil {
			continue
		}
		n.log.Warn("backup did not confirm: items fail", "backup", rb.member.Name, "items", len(rb.items), "err", rb.err)
		n.replicationFailures.Add(int64(len(rb.items)))
		for _, j := range rb.items {
			resp.Admitted[j], resp.Recorded[j] = false, false
			resp.Errors = append(resp.Errors, &pb.ItemError{Index: uint32(j), Code: uint32(codes.Unavailable),
				Message: fmt.Sprintf("backup %s (%s) did not confirm the send: %v; retry", rb.member.Name, rb.member.Addr, rb.err)})
		}
	}
	sortErrors(resp.Errors)
}

// Replicate answers Peer.Replicate: it records, as this partition's backup,
// the sends the owner admitted, in its store and WAL, before it returns.
// The whole message is checked before anything changes.
func (n *Node) Replicate(ctx context.Context, req *pb.ReplicateRequest) (*pb.ReplicateResponse, error) {
	r, err := n.peerRing(req.Node, req.RingEpoch)
	if err != nil {
		return nil, err
	}
	v := n.view.Load()
	var sends []walSend
	err = decodeWAL(req.Sends, func(s walSend) error {
		p := n.store.PartitionOf(s.key)
		if o := r.PartitionOwner(p); o.Name != req.Node {
			return n.refuse("partition %d is owned by %s under epoch %d, not by %s", p, o.Name, r.Epoch(), req.Node)
		}
		if b, ok := r.PartitionReplica(p); !ok || b.Name != n.cfg.Name {
			return n.refuse("partition %d is not backed by %s under epoch %d", p, n.cfg.Name, r.Epoch())
		}
		if v.domains[s.domain] == nil {
			return status.Errorf(codes.FailedPrecondition, "node %s: unknown domain %s (this node serves %v)", n.cfg.Name, quote(s.domain), v.names)
		}
		sends = append(sends, s)
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrBadPayload) {
			return nil, status.Errorf(codes.InvalidArgument, "node %s: sends: %v", n.cfg.Name, err)
		}
		return nil, err
	}
	now := n.nowMs()
	var enc walEncoder
	for _, s := range sends {
		p := n.store.PartitionOf(s.key)
		seq, dup, err := n.store.Record(p, v.domains[s.domain].ref, s.key, s.tag, s.at, windowItem(s), s.id, now)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "node %s: recording a replicated send: %v", n.cfg.Name, err)
		}
		if dup {
			continue // sent again with its request id: recorded already
		}
		s.seq = seq
		enc.add(s)
	}
	if n.dur != nil && enc.n > 0 {
		if _, err := n.dur.log.Append(ctx, enc.bytes()); err != nil {
			return nil, status.Errorf(codes.Unavailable, "node %s: write-ahead log: %v", n.cfg.Name, err)
		}
	}
	return &pb.ReplicateResponse{}, nil
}
