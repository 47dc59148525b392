package node

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// replicateGate wraps Peers: the first Replicate call holds at the gate
// (entered is closed when it arrives) until release is closed, and then
// fails as a backup that refuses it would (or, with pass, goes on); the
// second passes, and passed is closed once it has returned.
type replicateGate struct {
	Peers
	pass                     bool
	calls                    atomic.Int64
	entered, release, passed chan struct{}
}

type replicateGatePeer struct {
	Peer
	g *replicateGate
}

func (g *replicateGate) Peer(m ring.Member) (Peer, error) {
	p, err := g.Peers.Peer(m)
	if err != nil {
		return p, err
	}
	return replicateGatePeer{p, g}, nil
}

func (p replicateGatePeer) Replicate(ctx context.Context, req *pb.ReplicateRequest, _ ...grpc.CallOption) (*pb.ReplicateResponse, error) {
	switch p.g.calls.Add(1) {
	case 1:
		close(p.g.entered)
		<-p.g.release
		if !p.g.pass {
			return nil, status.Error(codes.FailedPrecondition, "test: the backup refuses")
		}
	case 2:
		defer close(p.g.passed)
	}
	return p.Peer.Replicate(ctx, req)
}

// TestDuplicateOfWithdrawnSendFails: a retry of a request id that arrives
// while the first attempt's backup has not answered is a duplicate; the
// first attempt then fails and is taken back (withdraw). The duplicate must
// not be answered as admitted, for nobody counts the send any more (a
// forgotten send): it waits for the first attempt's call and fails as
// retryable, and the next retry is decided afresh and counted once.
func TestDuplicateOfWithdrawnSendFails(t *testing.T) {
	ln := NewLocalNetwork()
	gate := &replicateGate{Peers: ln.Peers(), entered: make(chan struct{}), release: make(chan struct{}), passed: make(chan struct{})}
	a := startLocalCfg(t, ln, Config{Name: "node-a", Peers: gate})
	b := startLocalCfg(t, ln, Config{Name: "node-b", Peers: ln.Peers()}, a.clus.Load().ms.GossipAddr())
	poll(t, "two nodes settle", settledTwo(a, b))
	gate.calls.Store(0) // the gate counts from the checks on
	rcp, _ := recipientOwnedBy(a.Ring(), "node-a", "")
	ctx := context.Background()
	req := &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{42}}
	check := func() *pb.CheckResponse {
		resp, err := a.Check(ctx, req)
		if err != nil {
			t.Error(err)
			return &pb.CheckResponse{}
		}
		return resp
	}
	first := make(chan *pb.CheckResponse, 1)
	go func() { first <- check() }()
	<-gate.entered // the first attempt waits for its backup
	second := make(chan *pb.CheckResponse, 1)
	go func() { second <- check() }()
	<-gate.passed // the duplicate's first send went to the backup again
	close(gate.release)
	for name, ch := range map[string]chan *pb.CheckResponse{"first attempt": first, "duplicate": second} {
		if resp := <-ch; len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) || resp.Admitted[0] {
			t.Errorf("%s: %v; want UNAVAILABLE", name, resp)
		}
	}
	wantDecidedAgain(t, a, rcp, check())
}

// TestBackupRefusesOwnerOutOfItsRingSinceAcquiring is rule 8's mechanism:
// a backup whose gossip saw the owner leave or fail since the owner last
// acquired the partition from it refuses the owner's sends with ABORTED
// (the owner may have been frozen while others decided for it); the item
// fails, is taken back, and the owner acquires the partition again from
// every member, after which the backup takes its sends again.
func TestBackupRefusesOwnerOutOfItsRingSinceAcquiring(t *testing.T) {
	ln := NewLocalNetwork()
	a, b := twoLocal(t, ln, "")
	rcp, p := recipientOwnedBy(a.Ring(), "node-a", "")
	ctx := context.Background()
	b.ho.mu.Lock()
	acquirer, departures := b.ho.parts[p].acquirer, b.ho.parts[p].acquirerDepartures
	b.ho.parts[p].acquirerDepartures++ // as if b had seen a go since a acquired p from it
	b.ho.mu.Unlock()
	if acquirer != "node-a" || departures != b.clus.Load().ms.Departures("node-a") {
		t.Fatalf("b's record of p's acquirer: %q at %d departures; want node-a at %d", acquirer, departures, b.clus.Load().ms.Departures("node-a"))
	}
	req := &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{7}}
	resp, err := a.Check(ctx, req)
	if err != nil || len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) || resp.Admitted[0] {
		t.Fatalf("with b fencing a: %v %v; want UNAVAILABLE", resp, err)
	}
	if got := b.Stats().StaleRefusals; got != 1 {
		t.Fatalf("b refused %d calls as stale, want 1", got)
	}
	poll(t, "a acquires p again and b takes its sends", func() error {
		resp, err := a.Check(ctx, req)
		if err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] {
			return fmt.Errorf("%v %v", resp.GetErrors(), err)
		}
		return nil
	})
	if got := a.Stats().Reacquired; got < 1 {
		t.Fatalf("a acquired %d partitions again after the refusal, want at least 1", got)
	}
	wantDecidedAgain(t, a, rcp, &pb.CheckResponse{Admitted: []bool{true}, Recorded: []bool{true}})
}

// TestLateReplicateRecordsNothing: a Replicate call its backup reads more
// than LateRequestSlack after the owner's deadline (the backup was frozen,
// say) records nothing: the owner has given up on it and taken its sends
// back, so a send recorded now would be counted for nobody.
func TestLateReplicateRecordsNothing(t *testing.T) {
	ln := NewLocalNetwork()
	a, b := twoLocal(t, ln, "")
	r := a.Ring()
	rcp, _ := recipientOwnedBy(r, "node-a", "node-b")
	key, tag := KeyOf(rcp)
	var enc walEncoder
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: a.nowMs(), cost: 1, id: 7})
	ref := b.view.Load().domains[DefaultDomain].ref
	before := b.store.Stats(ref).Records
	late := time.Now().Add(-LateRequestSlack - time.Second).UnixMilli()
	_, err := b.rpc().Replicate(context.Background(), &pb.ReplicateRequest{Node: "node-a", RingEpoch: r.Epoch(), Sends: enc.bytes(), NotAfterMs: late})
	if st := status.Convert(err); st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "not_after_ms") {
		t.Fatalf("a Replicate read 2 s past its deadline: %v, want DeadlineExceeded naming not_after_ms", err)
	}
	if after := b.store.Stats(ref).Records; after != before || b.Stats().LateRequests != 1 {
		t.Fatalf("b holds %d records after the late Replicate, %d before; %d late requests counted, want 1", after, before, b.Stats().LateRequests)
	}
}

// TestDecisionOfAnEarlierOpeningFails: a node decides a send with its
// partition open, and before the send is on its backup, closes the
// partition and opens it again (it acquired it anew: newer history merged,
// as after a freeze, rule 8). The decision was made from the record of the
// earlier opening, which may lack what others admitted: the item must fail
// and its send be taken back, although the backup took it.
func TestDecisionOfAnEarlierOpeningFails(t *testing.T) {
	ln := NewLocalNetwork()
	gate := &replicateGate{Peers: ln.Peers(), pass: true, entered: make(chan struct{}), release: make(chan struct{}), passed: make(chan struct{})}
	a := startLocalCfg(t, ln, Config{Name: "node-a", Peers: gate})
	b := startLocalCfg(t, ln, Config{Name: "node-b", Peers: ln.Peers()}, a.clus.Load().ms.GossipAddr())
	poll(t, "two nodes settle", settledTwo(a, b))
	gate.calls.Store(0)
	rcp, p := recipientOwnedBy(a.Ring(), "node-a", "")
	ctx := context.Background()
	done := make(chan *pb.CheckResponse, 1)
	go func() {
		resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{9}})
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-gate.entered // decided; its send waits for the backup
	a.closePartition(p)
	a.openPartition(p)
	close(gate.release)
	if resp := <-done; resp == nil || len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) || resp.Admitted[0] {
		t.Fatalf("a decision of the opening before: %v; want UNAVAILABLE", resp)
	}
	if got := a.Stats().ReopenedFailures; got != 1 {
		t.Fatalf("ReopenedFailures = %d, want 1", got)
	}
	peek, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || peek.Used[0] != 0 {
		t.Fatalf("a counts %v (%v), want 0: the failed send taken back", peek.GetUsed(), err)
	}
}
