package node_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestShutdownEndsWatchers is issue 12's case 9: a client watching the ring
// (every client does) kept a stopping node in GracefulStop for the whole
// grace period. With a grace of ten minutes, Serve must return as soon as
// the in-flight calls are done, ending the watch with UNAVAILABLE. So must a
// client's CheckStream, open but idle, and a peer's ReplicateStream.
func TestShutdownEndsWatchers(t *testing.T) {
	for _, clustered := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "gossip"}[clustered], func(t *testing.T) {
			keys := node.StaticKeys{[]byte("0123456789abcdef0123456789abcdef")}
			cfg := node.Config{ShutdownGrace: 10 * time.Minute, PeerKeys: keys}
			if clustered {
				g := nodetest.FastGossip()
				cfg.Cluster, cfg.Name = &g, "node-0"
			}
			n, err := node.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() { served <- n.Serve(ctx, lis) }()
			wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer wcancel()
			if err := nodetest.WaitServing(wctx, lis.Addr().String()); err != nil {
				t.Fatal(err)
			}
			// Signed as a member (whose name is not in the ring): its
			// ReplicateStream gets past the Peer service's guard.
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithPerRPCCredentials(node.PeerCallCredentials("stranger", keys)))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			watch, err := pb.NewLimiterClient(conn).WatchRing(wctx, &pb.RingRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := watch.Recv(); err != nil {
				t.Fatalf("first ring: %v", err)
			}
			checks, err := pb.NewLimiterClient(conn).CheckStream(wctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := checks.Send(&pb.CheckRequest{Recipients: []string{"+8613800000001"}, StreamId: 1}); err != nil {
				t.Fatal(err)
			}
			if resp, err := checks.Recv(); err != nil || resp.StreamId != 1 || len(resp.Admitted) != 1 {
				t.Fatalf("streamed check: %v, %v", resp, err)
			}
			// A peer's ReplicateStream, open but idle: its one request (from a
			// node outside the ring) answered with an error ack.
			repl, err := pb.NewPeerClient(conn).ReplicateStream(wctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := repl.Send(&pb.ReplicateRequest{Node: "stranger", CallId: 5}); err != nil {
				t.Fatal(err)
			}
			if ack, err := repl.Recv(); err != nil || ack.CallId != 5 || ack.Code == 0 {
				t.Fatalf("replication ack: %v, %v; want call id 5 refused", ack, err)
			}
			cancel()
			select {
			case err := <-served:
				if err != nil {
					t.Fatalf("Serve: %v", err)
				}
			case <-time.After(time.Minute): // far below the grace, far above a busy machine's shutdown
				t.Fatal("Serve still waits for a ring watcher a minute after its context ended")
			}
			for {
				if _, err = watch.Recv(); err != nil {
					break
				}
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("the watch ended with %v, want UNAVAILABLE", err)
			}
			if _, err = checks.Recv(); status.Code(err) != codes.Unavailable {
				t.Fatalf("the check stream ended with %v, want UNAVAILABLE", err)
			}
			if _, err = repl.Recv(); status.Code(err) != codes.Unavailable {
				t.Fatalf("the replication stream ended with %v, want UNAVAILABLE", err)
			}
		})
	}
}
