package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

// serveLimited serves a memory-only node with limits and returns its address.
func serveLimited(t *testing.T, l node.Limits) string {
	t.Helper()
	n, err := node.New(node.Config{Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return serveNode(t, n)
}

func dial(t *testing.T, addr string) (*grpc.ClientConn, pb.LimiterClient) {
	t.Helper()
	conn := dialNode(t, addr)
	return conn, pb.NewLimiterClient(conn)
}

// TestServerLimits is issue 12's case 10: requests, contents, streams per
// connection, ring watchers and idle connections are bounded.
func TestServerLimits(t *testing.T) {
	addr := serveLimited(t, node.Limits{MaxRequestBytes: 4 << 10, MaxContentBytes: 100, MaxStreams: 2, MaxWatchers: 3,
		IdleTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("request", func(t *testing.T) {
		_, c := dial(t, addr)
		big := &pb.CheckRequest{Recipients: []string{"+8613800000001"}, Contents: [][]byte{make([]byte, 5<<10)}}
		if _, err := c.Check(ctx, big); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a 5 KiB request: %v, want RESOURCE_EXHAUSTED", err)
		}
	})
	t.Run("content", func(t *testing.T) {
		_, c := dial(t, addr)
		resp, err := c.Check(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000001", "+8613800000002"},
			Contents: [][]byte{make([]byte, 101), make([]byte, 100)}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Errors) != 1 || resp.Errors[0].Index != 0 || !strings.Contains(resp.Errors[0].Message, "contents[0]: 101 bytes, more than 100") {
			t.Fatalf("errors %v, want one for contents[0]", resp.Errors)
		}
	})
	t.Run("streams and watchers", func(t *testing.T) {
		conn1, c1 := dial(t, addr)
		_ = conn1
		watch := func(c pb.LimiterClient, wait time.Duration) error {
			wctx, wcancel := context.WithTimeout(ctx, wait)
			t.Cleanup(wcancel)
			s, err := c.WatchRing(wctx, &pb.RingRequest{})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}
		for i := range 2 {
			if err := watch(c1, 30*time.Second); err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
		}
		// The connection's two streams are taken: a third call waits for
		// one, until its deadline.
		if err := watch(c1, 300*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("a third stream on one connection: %v, want DEADLINE_EXCEEDED while it waits", err)
		}
		_, c2 := dial(t, addr)
		if err := watch(c2, 30*time.Second); err != nil {
			t.Fatalf("watch 3 on a second connection: %v", err)
		}
		_, c3 := dial(t, addr)
		err := watch(c3, 30*time.Second)
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "3 ring watchers") {
			t.Fatalf("a fourth watcher: %v, want RESOURCE_EXHAUSTED naming the bound", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		conn, c := dial(t, addr)
		if _, err := c.Ring(ctx, &pb.RingRequest{}); err != nil {
			t.Fatal(err)
		}
		for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				t.Fatal("the idle connection was never closed")
			}
		}
	})
}
