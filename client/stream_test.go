package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

type checkStreamServer = grpc.BidiStreamingServer[pb.CheckRequest, pb.CheckResponse]

// streamAnswer completes a streamed answer of f: stream_id and ring epoch.
func (f *fakeLimiter) streamAnswer(req *pb.CheckRequest, resp *pb.CheckResponse) *pb.CheckResponse {
	resp.StreamId = req.StreamId
	if resp.RingEpoch == 0 {
		resp.RingEpoch = f.ring().Epoch()
	}
	return resp
}

// recipientTime answers req admitting all, each item decided at t0 plus the
// number its recipient ends with, so that a caller can tell its own answer.
func recipientTime(req *pb.CheckRequest) *pb.CheckResponse {
	resp := admitAll(req, nil)
	for i, r := range req.Recipients {
		k, _ := strconv.Atoi(strings.TrimLeft(r, "r"))
		resp.DecidedAtMs[i] = t0 + int64(k)
	}
	return resp
}

// TestStreamAnswersOutOfOrder: single checks go as requests on one
// CheckStream; the node answers four of them in reverse order, and each
// caller gets its own item's decision.
func TestStreamAnswersOutOfOrder(t *testing.T) {
	f := &fakeLimiter{}
	f.stream = func(s checkStreamServer) error {
		var held []*pb.CheckRequest
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			if held = append(held, req); len(held) < 4 {
				continue
			}
			for i := len(held) - 1; i >= 0; i-- {
				if err := s.Send(f.streamAnswer(held[i], recipientTime(held[i]))); err != nil {
					return err
				}
			}
			held = nil
		}
	}
	startFake(t, f)
	cl := newClient(t, Config{MaxBatch: 1, MaxInFlight: 4, Timeout: 30 * time.Second}, f.addr)
	var wg sync.WaitGroup
	for k := range 4 {
		wg.Go(func() {
			d, err := cl.Check(context.Background(), Item{Recipient: fmt.Sprintf("r%d", k)})
			if err != nil || d.Degraded || !d.DecidedAt.Equal(time.UnixMilli(t0+int64(k))) {
				t.Errorf("r%d: %+v, %v; want decided at t0+%dms", k, d, err, k)
			}
		})
	}
	wg.Wait()
	if s := cl.Stats(); s.Streamed != 4 || s.RPCs != 4 || s.Degraded != 0 || f.streamCalls() != 1 {
		t.Fatalf("stats %+v, %d streams: want 4 requests on one stream", s, f.streamCalls())
	}
}

// TestStreamErrors: item errors and requests failed whole come back on the
// stream as they do from Check: the caller's fault is an *ItemError, the
// rest is retried with the same request id, and the stream goes on.
func TestStreamErrors(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{} // requests per recipient
	f := &fakeLimiter{}
	f.stream = func(s checkStreamServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			r := req.Recipients[0]
			mu.Lock()
			seen[r]++
			first := seen[r] == 1
			mu.Unlock()
			resp := admitAll(req, nil)
			switch {
			case r == "bad":
				resp = admitAll(req, map[int]*pb.ItemError{0: {Code: uint32(codes.InvalidArgument), Message: "domains[0]: unknown domain"}})
			case r == "retry" && first:
				resp = admitAll(req, map[int]*pb.ItemError{0: {Code: uint32(codes.Unavailable), Message: "owner did not answer"}})
			case r == "malformed":
				resp = &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(codes.InvalidArgument), Message: "costs: 2 entries"}}
			case r == "notserving" && first:
				resp = &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(codes.Unavailable), Message: "node is not serving"}}
			}
			if err := s.Send(f.streamAnswer(req, resp)); err != nil {
				return err
			}
		}
	}
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, f.addr)
	ctx := context.Background()

	_, err := cl.Check(ctx, Item{Recipient: "bad"})
	var ie *ItemError
	if !errors.As(err, &ie) || ie.Code != codes.InvalidArgument || ie.Message != "domains[0]: unknown domain" {
		t.Fatalf("bad: %v, want the node's INVALID_ARGUMENT", err)
	}
	_, err = cl.Check(ctx, Item{Recipient: "malformed"})
	if !errors.As(err, &ie) || ie.Code != codes.InvalidArgument || !strings.Contains(ie.Message, "refused the request: costs: 2 entries") {
		t.Fatalf("malformed: %v, want the request's INVALID_ARGUMENT", err)
	}
	for _, r := range []string{"retry", "notserving"} {
		before := cl.Stats().Retries
		d, err := cl.Check(ctx, Item{Recipient: r})
		if err != nil || !d.Admitted || d.Degraded || cl.Stats().Retries != before+1 {
			t.Fatalf("%s: %+v, %v, stats %+v: want admitted after one retry", r, d, err, cl.Stats())
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Fatalf("%d unary requests, want none", n)
	}
	if s := cl.Stats(); s.Streamed != 6 || s.Degraded != 0 || f.streamCalls() != 1 {
		t.Fatalf("stats %+v, %d streams: want 6 requests on one stream", s, f.streamCalls())
	}
}

// TestStreamCancel: a caller that stops waiting gets its answer by the
// failure policy at once; the node's late answer is dropped, and the
// stream serves the next call.
func TestStreamCancel(t *testing.T) {
	release := make(chan struct{})
	got := make(chan struct{}, 1)
	f := &fakeLimiter{}
	f.stream = func(s checkStreamServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			if req.Recipients[0] == "slow" {
				got <- struct{}{}
				<-release
			}
			if err := s.Send(f.streamAnswer(req, recipientTime(req))); err != nil {
				return err
			}
		}
	}
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second, FailurePolicy: FailClosed}, f.addr)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-got; cancel() }()
	d, err := cl.Check(ctx, Item{Recipient: "slow"})
	if err != nil || !d.Degraded || d.Admitted {
		t.Fatalf("canceled call: %+v, %v; want denied by FailClosed, degraded", d, err)
	}
	close(release) // the late answer arrives; nobody waits for it
	for k := range 3 {
		d, err := cl.Check(context.Background(), Item{Recipient: fmt.Sprintf("r%d", k+5)})
		if err != nil || d.Degraded || !d.DecidedAt.Equal(time.UnixMilli(t0+int64(k+5))) {
			t.Fatalf("after the cancel: %+v, %v", d, err)
		}
	}
	if f.streamCalls() != 1 {
		t.Fatalf("%d streams, want 1", f.streamCalls())
	}
}

// TestStreamBreaks: a stream that ends before it answers (the node
// restarted) fails its requests as retryable; the retry goes on a new
// stream with the same request id.
func TestStreamBreaks(t *testing.T) {
	var mu sync.Mutex
	var ids []uint64
	f := &fakeLimiter{}
	f.stream = func(s checkStreamServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			mu.Lock()
			ids = append(ids, req.RequestIds...)
			first := len(ids) == 1
			mu.Unlock()
			if first {
				return status.Error(codes.Unavailable, "node is shutting down")
			}
			if err := s.Send(f.streamAnswer(req, recipientTime(req))); err != nil {
				return err
			}
		}
	}
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, f.addr)
	d, err := cl.Check(context.Background(), Item{Recipient: "r7"})
	if err != nil || d.Degraded || !d.DecidedAt.Equal(time.UnixMilli(t0+7)) {
		t.Fatalf("%+v, %v", d, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 2 || ids[0] == 0 || ids[1] != ids[0] || f.streamCalls() != 2 || cl.Stats().Retries != 1 {
		t.Fatalf("request ids %v on %d streams, stats %+v: want one retry with the same id on a new stream", ids, f.streamCalls(), cl.Stats())
	}
}

// TestStreamNodeRestart: a real node killed and restarted at its address
// while the client holds a CheckStream to it: the checks after the restart
// are decided by it, not by the failure policy.
func TestStreamNodeRestart(t *testing.T) {
	c := newCluster(t, 1, nil)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, c.addrs()...)
	ctx := context.Background()
	for k := range 3 {
		if d, err := cl.Check(ctx, Item{Recipient: fmt.Sprintf("+861380000%04d", k)}); err != nil || d.Degraded {
			t.Fatalf("before: %+v, %v", d, err)
		}
	}
	n := c.nodes[0]
	restartAndReconnect(t, c, cl, n) // the stream the client held is broken; the next check must open another
	for k := range 3 {
		d, err := cl.Check(ctx, Item{Recipient: fmt.Sprintf("+861380001%04d", k)})
		if err != nil || d.Degraded || !d.Admitted || d.Node != n.name {
			t.Fatalf("after the restart: %+v, %v (stats %+v)", d, err, cl.Stats())
		}
	}
	if s := cl.Stats(); s.Streamed < 6 || s.Degraded != 0 {
		t.Fatalf("stats %+v: want every check on a stream, none degraded", s)
	}
}

// TestStreamFallsBackToUnary: against a node without CheckStream (an older
// version), batches and single checks go as unary Checks, without trying
// the stream on every call: a batch finds the stream missing, and the
// single checks after it do not try it; with UnaryChecks the stream is
// never tried.
func TestStreamFallsBackToUnary(t *testing.T) {
	f := startFake(t, &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		return recipientTime(req), nil
	}})
	cl := newClient(t, Config{}, f.addr)
	p, err := cl.peer(f.addr)
	if err != nil {
		t.Fatal(err)
	}
	decs, err := cl.CheckBatch(context.Background(), batchOf(10, 2))
	decidedInOrder(t, decs, err, 10)
	if p.noStream.Load() <= time.Now().UnixNano() {
		t.Fatal("after UNIMPLEMENTED the stream is not set aside")
	}
	for k := range 3 {
		d, err := cl.Check(context.Background(), Item{Recipient: fmt.Sprintf("r%d", k)})
		if err != nil || d.Degraded || !d.DecidedAt.Equal(time.UnixMilli(t0+int64(k))) {
			t.Fatalf("r%d: %+v, %v", k, d, err)
		}
	}
	if s := cl.Stats(); s.Streamed != 0 || s.RPCs != 4 || s.Retries != 0 || len(f.requests()) != 4 {
		t.Fatalf("stats %+v, %d unary requests: want 4 unary Checks", s, len(f.requests()))
	}

	g := &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		return recipientTime(req), nil
	}}
	g.stream = func(checkStreamServer) error { return errors.New("BUG: UnaryChecks opened a stream") }
	startFake(t, g)
	cl = newClient(t, Config{UnaryChecks: true}, g.addr)
	if d, err := cl.Check(context.Background(), Item{Recipient: "r1"}); err != nil || d.Degraded {
		t.Fatalf("UnaryChecks: %+v, %v", d, err)
	}
	decs, err = cl.CheckBatch(context.Background(), batchOf(10, 2))
	decidedInOrder(t, decs, err, 10)
	if g.streamCalls() != 0 || len(g.requests()) != 2 {
		t.Fatalf("UnaryChecks: %d streams, %d unary requests", g.streamCalls(), len(g.requests()))
	}
}
