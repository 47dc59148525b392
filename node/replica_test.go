package node

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/window"
)

// TestReplicaSetReuse checks that a replica set emptied for reuse groups the
// sends of its next batch by their backups under the new ring, with nothing
// left of the previous batch: no send, partition, item, member or error.
func TestReplicaSetReuse(t *testing.T) {
	members := func(names ...string) *ring.Ring {
		t.Helper()
		var ms []ring.Member
		for _, nm := range names {
			ms = append(ms, ring.Member{Name: nm, Addr: nm + ":1"})
		}
		r, err := ring.New(ms, ring.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	fill := func(rs *replicaSet, r *ring.Ring, round int) map[string][]walSend {
		want := map[string][]walSend{}
		for j := range 300 {
			p := (j * 7) % 271
			s := walSend{domain: "default", key: uint64(round<<20 | j), seq: uint64(j), at: int64(round*1000 + j)}
			rs.add(r, p, j, s)
			if b, ok := r.PartitionReplica(p); ok {
				want[b.Name] = append(want[b.Name], s)
			}
		}
		return want
	}
	check := func(rs *replicaSet, r *ring.Ring, want map[string][]walSend) {
		t.Helper()
		if len(rs.backups) != len(want) {
			t.Fatalf("%d backups, want %d", len(rs.backups), len(want))
		}
		for name, sends := range want {
			rb := rs.backups[name]
			if rb == nil || rb.member.Name != name || rb.err != nil || len(rb.sends) != len(sends) || len(rb.parts) != len(sends) || len(rb.items) != len(sends) {
				t.Fatalf("backup %s: batch %+v, want %d sends", name, rb, len(sends))
			}
			for i, s := range sends {
				if rb.sends[i] != s {
					t.Fatalf("backup %s send %d: %+v, want %+v", name, i, rb.sends[i], s)
				}
				if b, _ := r.PartitionReplica(rb.parts[i]); b.Name != name {
					t.Fatalf("backup %s send %d: partition %d has backup %s", name, i, rb.parts[i], b.Name)
				}
			}
		}
	}

	r1 := members("a", "b", "c")
	var n Node
	rs := n.takeReplicaSet(300, r1.Len())
	check(rs, r1, fill(rs, r1, 1))
	var old []*replicaBatch
	for _, rb := range rs.backups {
		rb.err = fmt.Errorf("backup %s failed", rb.member.Name)
		old = append(old, rb)
	}
	rs.empty()
	if len(rs.backups) != 0 || len(rs.spare) != len(old) {
		t.Fatalf("emptied: %d backups, %d spares, want 0 and %d", len(rs.backups), len(rs.spare), len(old))
	}
	for _, rb := range old {
		if rb.member != (ring.Member{}) || rb.err != nil || len(rb.sends) != 0 || len(rb.parts) != 0 || len(rb.items) != 0 {
			t.Fatalf("emptied batch keeps %+v", rb)
		}
		for i, s := range rb.sends[:cap(rb.sends)] {
			if s != (walSend{}) {
				t.Fatalf("emptied batch keeps send %d: %+v", i, s)
			}
		}
	}

	// The next batch, under a ring with other members, reuses the spares.
	r2 := members("c", "d", "e", "f")
	check(rs, r2, fill(rs, r2, 2))
	if len(rs.spare) != 0 {
		t.Fatalf("%d spares left unused with %d backups", len(rs.spare), len(rs.backups))
	}
	n.releaseReplicaSet(rs)
}

// TestReplicateBadCostIsInvalidArgument: a Replicate call (or a call on a
// ReplicateStream) with a send whose cost is beyond window.MaxCost, which
// the WAL's framing carries but no item may have, is refused whole with
// INVALID_ARGUMENT naming the send and its cost, not INTERNAL from the
// store, and records nothing.
func TestReplicateBadCostIsInvalidArgument(t *testing.T) {
	ln := NewLocalNetwork()
	a, _ := twoLocal(t, ln, t.TempDir()) // a, durable, backs b's partitions
	r := a.Ring()
	rcp, _ := recipientOwnedBy(r, "node-b", "node-a")
	key, tag := KeyOf(rcp)
	now := a.nowMs()
	var enc walEncoder
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: now - 1, cost: 1, id: 11})
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: now, cost: window.MaxCost + 1, id: 12})
	ref := a.view.Load().domains[DefaultDomain].ref
	before := a.store.Stats(ref).Records
	want := fmt.Sprintf("send 1: cost %d out of range [1, %d]", window.MaxCost+1, window.MaxCost)
	req := &pb.ReplicateRequest{Node: "node-b", RingEpoch: r.Epoch(), Sends: enc.bytes(), CallId: 3}
	_, err := a.rpc().Replicate(context.Background(), req)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), want) {
		t.Fatalf("Replicate: %v, want INVALID_ARGUMENT containing %q", err, want)
	}
	var acks []*pb.ReplicateAck
	sent := false
	err = a.serveReplicateStream(context.Background(), func() (*pb.ReplicateRequest, error) {
		if sent {
			return nil, io.EOF
		}
		sent = true
		return req, nil
	}, func(ack *pb.ReplicateAck) error { acks = append(acks, ack); return nil })
	if err != nil || len(acks) != 1 || codes.Code(acks[0].Code) != codes.InvalidArgument || !strings.Contains(acks[0].Message, want) {
		t.Fatalf("ReplicateStream: %v, acks %v; want one INVALID_ARGUMENT ack containing %q", err, acks, want)
	}
	if after := a.store.Stats(ref).Records; after != before {
		t.Fatalf("a holds %d records after the refused calls, %d before", after, before)
	}
}
