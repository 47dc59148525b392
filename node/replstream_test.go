package node

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// fakeReplStream is the owner's side of a ReplicateStream whose backup the
// test plays: Send hands each request to sent, Recv returns what the test
// puts in acks, or ends with the error put in fail.
type fakeReplStream struct {
	grpc.ClientStream // unused
	ctx               context.Context
	sent              chan *pb.ReplicateRequest
	acks              chan *pb.ReplicateAck
	fail              chan error
	gone              bool // Send fails with io.EOF and ends the stream
}

func newFakeReplStream(ctx context.Context) *fakeReplStream {
	return &fakeReplStream{ctx: ctx, sent: make(chan *pb.ReplicateRequest, 16), acks: make(chan *pb.ReplicateAck, 16), fail: make(chan error, 1)}
}

func (f *fakeReplStream) Send(req *pb.ReplicateRequest) error {
	select {
	case <-f.ctx.Done():
		return io.EOF
	default:
	}
	if f.gone {
		// The backup went away before the request left: gRPC's Send says
		// io.EOF, and Recv why.
		f.fail <- status.Error(codes.Unavailable, "backup restarting")
		return io.EOF
	}
	f.sent <- req
	return nil
}

func (f *fakeReplStream) Recv() (*pb.ReplicateAck, error) {
	select {
	case a := <-f.acks:
		return a, nil
	case err := <-f.fail:
		return nil, err
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

// fakeStreamPeer is a backup reached through streams the test plays: each
// ReplicateStream call opens the next fakeReplStream (its ctx is the one
// the owner opened it with), and unary Replicate calls are counted and
// succeed.
type fakeStreamPeer struct {
	Peer    // unused
	mu      sync.Mutex
	streams []*fakeReplStream
	opened  chan *fakeReplStream
	unary   atomic.Int64
	stuck   bool // ReplicateStream waits for its context to end
	gone    int  // the first gone streams fail their first Send
}

func (p *fakeStreamPeer) ReplicateStream(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[pb.ReplicateRequest, pb.ReplicateAck], error) {
	if p.stuck { // a connection that is never made
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	f := newFakeReplStream(ctx)
	p.mu.Lock()
	f.gone = len(p.streams) < p.gone
	p.streams = append(p.streams, f)
	p.mu.Unlock()
	p.opened <- f
	return f, nil
}

func (p *fakeStreamPeer) Replicate(context.Context, *pb.ReplicateRequest, ...grpc.CallOption) (*pb.ReplicateResponse, error) {
	p.unary.Add(1)
	return &pb.ReplicateResponse{}, nil
}

type fakePeers struct{ p Peer }

func (f fakePeers) Peer(ring.Member) (Peer, error) { return f.p, nil }
func (fakePeers) Prune(*ring.Ring)                 {}
func (fakePeers) Close() error                     { return nil }

// bareOwner returns an owner node with nothing but what its replicators
// use, whose peers are all p, and the cancel of its mover context (its
// Close).
func bareOwner(p Peer) (*Node, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	return &Node{cfg: Config{Name: "owner"}, peers: fakePeers{p}, moverCtx: ctx, replicators: map[string]*replicator{}}, cancel
}

// replicatorTo returns a replicator of a bare owner node whose backup is p.
func replicatorTo(t *testing.T, p Peer) *replicator {
	n, cancel := bareOwner(p)
	t.Cleanup(cancel)
	return n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:1"})
}

func call(rp *replicator) chan error {
	done := make(chan error, 1)
	go func() { done <- rp.call(&replCall{epoch: 7}) }()
	return done
}

// TestReplStreamMatchesAcksByID makes two calls on one stream and answers
// them in the other order, one with an error: each call gets its own ack.
func TestReplStreamMatchesAcksByID(t *testing.T) {
	p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
	rp := replicatorTo(t, p)
	first := call(rp)
	f := <-p.opened
	r1 := <-f.sent
	second := call(rp)
	r2 := <-f.sent
	if r1.CallId == r2.CallId || r1.Node != "owner" || r1.RingEpoch != 7 {
		t.Fatalf("requests %v and %v: want distinct call ids, node owner, epoch 7", r1, r2)
	}
	f.acks <- &pb.ReplicateAck{CallId: r2.CallId, Code: uint32(codes.FailedPrecondition), Message: "not backed here"}
	if err := <-second; status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "not backed here" {
		t.Fatalf("second call: %v, want the ack's FAILED_PRECONDITION", err)
	}
	f.acks <- &pb.ReplicateAck{CallId: r1.CallId}
	if err := <-first; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if len(p.opened) != 0 || p.unary.Load() != 0 {
		t.Fatalf("%d more streams, %d unary calls: want one stream for both calls", len(p.opened), p.unary.Load())
	}
	if got := rp.n.replCalls.Load(); got != 2 {
		t.Fatalf("%d calls counted, want 2", got)
	}
}

// TestReplStreamBreakFailsWaitingCalls breaks the stream while a call waits:
// the call fails with the stream's error, and the next call opens a new
// stream.
func TestReplStreamBreakFailsWaitingCalls(t *testing.T) {
	p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
	rp := replicatorTo(t, p)
	waiting := call(rp)
	f := <-p.opened
	<-f.sent
	f.fail <- status.Error(codes.Unavailable, "connection reset")
	if err := <-waiting; status.Code(err) != codes.Unavailable {
		t.Fatalf("waiting call: %v, want the stream's UNAVAILABLE", err)
	}
	next := call(rp)
	g := <-p.opened
	if g == f {
		t.Fatal("the next call reused the broken stream")
	}
	r := <-g.sent
	g.acks <- &pb.ReplicateAck{CallId: r.CallId}
	if err := <-next; err != nil {
		t.Fatalf("call on the new stream: %v", err)
	}
	if f.ctx.Err() == nil {
		t.Fatal("the broken stream's context is not cancelled")
	}
}

// TestReplStreamCallTimesOut never answers a call: after ForwardTimeout it
// fails with DEADLINE_EXCEEDED and ends the stream (its context is
// cancelled), so the next call opens a new one.
func TestReplStreamCallTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
		rp := replicatorTo(t, p)
		start := time.Now()
		waiting := call(rp)
		f := <-p.opened
		<-f.sent
		err := <-waiting
		if status.Code(err) != codes.DeadlineExceeded || time.Since(start) != ForwardTimeout {
			t.Fatalf("unanswered call: %v after %v, want DEADLINE_EXCEEDED after %v", err, time.Since(start), ForwardTimeout)
		}
		synctest.Wait()
		if f.ctx.Err() == nil {
			t.Fatal("the stream of a call that timed out is still open")
		}
		next := call(rp)
		g := <-p.opened
		r := <-g.sent
		g.acks <- &pb.ReplicateAck{CallId: r.CallId}
		if err := <-next; err != nil {
			t.Fatalf("call on the new stream: %v", err)
		}
	})
}

// TestReplicateFallsBackToUnary plays a backup of an older version, which
// answers ReplicateStream with UNIMPLEMENTED: the call goes as a unary
// Replicate and succeeds, later calls go unary without opening streams,
// and after noStreamFor the owner tries a stream again.
func TestReplicateFallsBackToUnary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
		rp := replicatorTo(t, p)
		first := call(rp)
		f := <-p.opened
		<-f.sent
		f.fail <- status.Error(codes.Unimplemented, "unknown method ReplicateStream for service freqring.v1.Peer")
		if err := <-first; err != nil || p.unary.Load() != 1 {
			t.Fatalf("first call: %v after %d unary calls, want it sent unary and done", err, p.unary.Load())
		}
		for range 3 {
			if err := <-call(rp); err != nil {
				t.Fatal(err)
			}
		}
		if len(p.opened) != 0 || p.unary.Load() != 4 {
			t.Fatalf("%d streams opened, %d unary calls: want none opened and 4 unary", len(p.opened), p.unary.Load())
		}
		if got := rp.n.replUnaryCalls.Load(); got != 4 {
			t.Fatalf("%d unary calls counted, want 4", got)
		}
		time.Sleep(noStreamFor)
		later := call(rp)
		g := <-p.opened
		r := <-g.sent
		g.acks <- &pb.ReplicateAck{CallId: r.CallId}
		if err := <-later; err != nil || p.unary.Load() != 4 {
			t.Fatalf("after %v: %v, %d unary calls: want a stream again", noStreamFor, err, p.unary.Load())
		}
	})
}

// TestReplStreamEndsWithTheOwner closes the owner (its mover context): the
// stream ends and a waiting call fails.
func TestReplStreamEndsWithTheOwner(t *testing.T) {
	p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
	n, cancel := bareOwner(p)
	rp := n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:1"})
	waiting := call(rp)
	f := <-p.opened
	<-f.sent
	cancel()
	if err := <-waiting; status.Code(err) != codes.Canceled {
		t.Fatalf("waiting call: %v, want CANCELED", err)
	}
	if !errors.Is(f.ctx.Err(), context.Canceled) {
		t.Fatal("the stream outlived its owner")
	}
}

// TestReplStreamOpeningTimesOut reaches a backup whose connection is never
// made: the call fails after ForwardTimeout, as a unary call would.
func TestReplStreamOpeningTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &fakeStreamPeer{stuck: true}
		rp := replicatorTo(t, p)
		start := time.Now()
		err := <-call(rp)
		if err == nil || time.Since(start) != ForwardTimeout || !strings.Contains(err.Error(), "opening a replication stream to backup") {
			t.Fatalf("call: %v after %v, want a failure to open after %v", err, time.Since(start), ForwardTimeout)
		}
	})
}

// TestReplStreamResendsWhatNeverLeft ends the stream as a call is sent
// (Send says io.EOF: nothing reached the backup): the call goes once more,
// on a new stream, and succeeds.
func TestReplStreamResendsWhatNeverLeft(t *testing.T) {
	p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4), gone: 1}
	rp := replicatorTo(t, p)
	done := call(rp)
	<-p.opened
	var g *fakeReplStream
	select {
	case g = <-p.opened:
	case err := <-done:
		t.Fatalf("call: %v without a second stream, want it sent again on a new one", err)
	}
	r := <-g.sent
	g.acks <- &pb.ReplicateAck{CallId: r.CallId}
	if err := <-done; err != nil {
		t.Fatalf("call: %v, want it sent again on a new stream", err)
	}
}

// TestReplicatorOfAMovedBackupIsRetired changes a backup's address: the old
// replicator's stream ends, it opens no other (a call still queued on it
// goes unary, to the old address, as before streams), and the new
// replicator opens its own.
func TestReplicatorOfAMovedBackupIsRetired(t *testing.T) {
	p := &fakeStreamPeer{opened: make(chan *fakeReplStream, 4)}
	n, cancel := bareOwner(p)
	t.Cleanup(cancel)
	old := n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:1"})
	waiting := call(old)
	f := <-p.opened
	<-f.sent
	moved := n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:2"})
	if moved == old {
		t.Fatal("a backup at a new address kept its replicator")
	}
	if err := <-waiting; status.Code(err) != codes.Unavailable || f.ctx.Err() == nil {
		t.Fatalf("call on the old stream: %v (stream context %v), want UNAVAILABLE and the stream ended", err, f.ctx.Err())
	}
	queued := call(old)
	var err error
	select {
	case err = <-queued:
	case <-p.opened:
		t.Fatal("the retired replicator opened a stream")
	}
	if err != nil || len(p.opened) != 0 || p.unary.Load() != 1 {
		t.Fatalf("queued call on the retired replicator: %v, %d streams opened, %d unary calls; want one unary call", err, len(p.opened), p.unary.Load())
	}
	done := call(moved)
	g := <-p.opened
	r := <-g.sent
	g.acks <- &pb.ReplicateAck{CallId: r.CallId}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStuckOpeningHoldsNoOtherBackup opens a stream to a backup whose
// connection is never made, then moves that backup: replacing its
// replicator does not wait for the opening (replicatorFor serves every
// backup's replication).
func TestStuckOpeningHoldsNoOtherBackup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &fakeStreamPeer{stuck: true}
		n, cancel := bareOwner(p)
		defer cancel()
		stuck := call(n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:1"}))
		synctest.Wait() // the call waits in ReplicateStream
		start := time.Now()
		n.replicatorFor(ring.Member{Name: "backup", Addr: "backup:2"})
		if d := time.Since(start); d != 0 {
			t.Fatalf("replacing the replicator waited %v for a stream being opened", d)
		}
		if err := <-stuck; err == nil {
			t.Fatal("the call to a backup never reached succeeded")
		}
	})
}
