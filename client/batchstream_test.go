package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// answerEach serves a CheckStream of f by answering each request with
// answer, in order, until the stream ends.
func (f *fakeLimiter) answerEach(answer func(*pb.CheckRequest) *pb.CheckResponse) func(checkStreamServer) error {
	return func(s checkStreamServer) error {
		for {
			req, err := s.Recv()
			if err != nil {
				return nil
			}
			if err := s.Send(f.streamAnswer(req, answer(req))); err != nil {
				return err
			}
		}
	}
}

// batchOf returns n items for recipients r<from>, r<from+1>, ...
func batchOf(from, n int) []Item {
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{Recipient: fmt.Sprintf("r%d", from+i)}
	}
	return items
}

// decidedInOrder fails tb unless decs are batchOf(from, ...)'s decisions by
// recipientTime, undegraded.
func decidedInOrder(tb testing.TB, decs []Decision, err error, from int) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("CheckBatch: %v", err)
	}
	for i, d := range decs {
		if d.Degraded || !d.Admitted || !d.DecidedAt.Equal(time.UnixMilli(t0+int64(from+i))) {
			tb.Fatalf("item %d (r%d): %+v; want admitted at t0+%dms", i, from+i, d, from+i)
		}
	}
}

// TestBatchStreamsAreReused: CheckBatch's requests go on CheckStreams, one
// request at a time on each, and a stream that answered carries the next
// request: sequential batches use one stream, concurrent ones at most one
// each, and every caller gets its own items' decisions.
func TestBatchStreamsAreReused(t *testing.T) {
	f := &fakeLimiter{}
	f.stream = f.answerEach(recipientTime)
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, f.addr)
	for k := range 20 {
		decs, err := cl.CheckBatch(context.Background(), batchOf(10*k, 3))
		decidedInOrder(t, decs, err, 10*k)
	}
	if s := cl.Stats(); s.Streamed != 20 || s.RPCs != 20 || s.Retries != 0 || f.streamCalls() != 1 || len(f.requests()) != 0 {
		t.Fatalf("stats %+v, %d streams, %d unary requests: want 20 requests on one stream", s, f.streamCalls(), len(f.requests()))
	}

	const callers = 8
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			for k := range 10 {
				from := 1000 + 100*(10*w+k)
				decs, err := cl.CheckBatch(context.Background(), batchOf(from, 5))
				decidedInOrder(t, decs, err, from)
			}
		})
	}
	wg.Wait()
	if s := cl.Stats(); s.Streamed != 100 || f.streamCalls() > 1+callers {
		t.Fatalf("stats %+v, %d streams: want 100 requests on at most %d streams", s, f.streamCalls(), 1+callers)
	}
}

// TestBatchStreamErrors: a request failed whole on the stream is every
// item's error (INVALID_ARGUMENT: the caller's, not retried) or retried
// (UNAVAILABLE), as from a unary Check.
func TestBatchStreamErrors(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	f := &fakeLimiter{}
	f.stream = f.answerEach(func(req *pb.CheckRequest) *pb.CheckResponse {
		r := req.Recipients[0]
		mu.Lock()
		seen[r]++
		first := seen[r] == 1
		mu.Unlock()
		switch {
		case r == "r0":
			return &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(codes.InvalidArgument), Message: "costs: 2 entries"}}
		case r == "r10" && first:
			return &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(codes.Unavailable), Message: "node is not serving"}}
		}
		return recipientTime(req)
	})
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, f.addr)
	_, err := cl.CheckBatch(context.Background(), batchOf(0, 2))
	var bad ItemErrors
	if !errors.As(err, &bad) || len(bad) != 2 || bad[1].Index != 1 || bad[1].Code != codes.InvalidArgument ||
		!strings.Contains(bad[1].Message, "refused the request: costs: 2 entries") {
		t.Fatalf("r0, r1: %v; want both items' INVALID_ARGUMENT", err)
	}
	decs, err := cl.CheckBatch(context.Background(), batchOf(10, 2))
	decidedInOrder(t, decs, err, 10)
	if s := cl.Stats(); s.Retries != 2 || s.Degraded != 0 || s.Streamed != 3 || f.streamCalls() != 1 {
		t.Fatalf("stats %+v, %d streams: want the second batch retried once, every request on one stream", s, f.streamCalls())
	}
}

// TestBatchStreamDeadline: a request unanswered at the attempt's deadline
// ends its stream (its state is unknown: the late answer must not be read
// as the next request's); the retry and the next batches go on a new one.
func TestBatchStreamDeadline(t *testing.T) {
	ended := make(chan struct{})
	f := &fakeLimiter{}
	var once sync.Once
	f.stream = func(s checkStreamServer) error {
		held := false
		once.Do(func() { held = true })
		if held { // the first stream reads a request and never answers it
			if _, err := s.Recv(); err != nil {
				return nil
			}
			<-s.Context().Done()
			close(ended)
			return nil
		}
		return f.answerEach(recipientTime)(s)
	}
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 2 * time.Second}, f.addr) // the first attempt 1.5 s, the retry 0.5 s
	decs, err := cl.CheckBatch(context.Background(), batchOf(0, 2))
	decidedInOrder(t, decs, err, 0) // the retry, on a second stream
	select {
	case <-ended:
	case <-time.After(patient):
		t.Fatal("the stream of the unanswered request is still open")
	}
	for k := range 3 {
		decs, err := cl.CheckBatch(context.Background(), batchOf(10*(k+1), 2))
		decidedInOrder(t, decs, err, 10*(k+1))
	}
	if s := cl.Stats(); s.Retries != 2 || s.Degraded != 0 || f.streamCalls() != 2 {
		t.Fatalf("stats %+v, %d streams: want one retry and 2 streams", s, f.streamCalls())
	}
}

// TestBatchStreamNodeRestart: a real node killed and restarted at its
// address while the client keeps an idle stream to it. The next batch finds
// that stream broken and goes on a new one in the same attempt: decided by
// the node, without a retry or the failure policy.
func TestBatchStreamNodeRestart(t *testing.T) {
	c := newCluster(t, 1, nil)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, c.addrs()...)
	ctx := context.Background()
	items := func(from int) []Item {
		its := make([]Item, 3)
		for i := range its {
			its[i] = Item{Recipient: fmt.Sprintf("+861380002%04d", from+i)}
		}
		return its
	}
	if decs, err := cl.CheckBatch(ctx, items(0)); err != nil || decs[0].Degraded {
		t.Fatalf("before: %+v, %v", decs, err)
	}
	n := c.nodes[0]
	restartAndReconnect(t, c, cl, n)
	before := cl.Stats()
	decs, err := cl.CheckBatch(ctx, items(10))
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range decs {
		if d.Degraded || !d.Admitted || d.Node != n.name {
			t.Fatalf("after the restart, item %d: %+v (stats %+v)", i, d, cl.Stats())
		}
	}
	if s := cl.Stats(); s.Retries != before.Retries || s.Streamed != before.Streamed+1 {
		t.Fatalf("stats %+v after %+v: want one request on a stream, no retry", s, before)
	}
}

// TestRetriesUntilAnswered: an item whose node fails it again and again is
// sent again, with the same request id, until a node answers it within the
// call's deadline, not answered by the failure policy after one retry: the
// first attempt may have been recorded with its answer lost, and only an
// answer (here, the duplicate's) tells the caller so.
func TestRetriesUntilAnswered(t *testing.T) {
	const failures = 4
	var mu sync.Mutex
	ids := map[string][]uint64{}
	f := &fakeLimiter{}
	f.stream = f.answerEach(func(req *pb.CheckRequest) *pb.CheckResponse {
		r := req.Recipients[0]
		mu.Lock()
		ids[r] = append(ids[r], req.RequestIds[0])
		tries := len(ids[r])
		mu.Unlock()
		if tries <= failures {
			return &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(codes.Unavailable), Message: "the backup did not confirm"}}
		}
		resp := recipientTime(req)
		resp.Duplicates = []uint32{0}
		return resp
	})
	startFake(t, f)
	cl := newClient(t, Config{Timeout: 30 * time.Second}, f.addr)
	d, err := cl.Check(context.Background(), Item{Recipient: "r1"})
	if err != nil || d.Degraded || !d.Admitted || !d.Duplicate {
		t.Fatalf("Check: %+v %v; want the duplicate's answer after %d failures", d, err, failures)
	}
	decs, err := cl.CheckBatch(context.Background(), batchOf(2, 1))
	if err != nil || decs[0].Degraded || !decs[0].Duplicate {
		t.Fatalf("CheckBatch: %+v %v; want the duplicate's answer after %d failures", decs, err, failures)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range []string{"r1", "r2"} {
		if len(ids[r]) != failures+1 {
			t.Fatalf("%s sent %d times, want %d", r, len(ids[r]), failures+1)
		}
		for _, id := range ids[r] {
			if id != ids[r][0] || id == 0 {
				t.Fatalf("%s sent with request ids %v: want one nonzero id", r, ids[r])
			}
		}
	}
	if s := cl.Stats(); s.Retries != 2*failures || s.Degraded != 0 {
		t.Fatalf("stats %+v: want %d retries, none degraded", s, 2*failures)
	}
}
