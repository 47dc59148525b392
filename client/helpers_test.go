package client

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/freeport"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring"
)

// t0 is the test clock's start, unix ms (2026-09-21).
const t0 = 1_790_000_000_000

// testClock is a settable node clock, unix ns.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() int64              { return c.ns.Load() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// tnode is one node of an in-process cluster.
type tnode struct {
	m    *nodetest.Member
	n    *node.Node
	addr string // gRPC
	name string
}

// tcluster runs nodes in this process on 127.0.0.1 (nodetest), each with
// its own gRPC server and gossip port, sharing one clock.
type tcluster struct {
	tb    testing.TB
	lc    *nodetest.Cluster
	nodes []*tnode
}

// newCluster starts size nodes, n0 to n<size-1>, and waits until they agree
// on a ring of all of them. clk nil means the system clock.
func newCluster(tb testing.TB, size int, clk node.Clock) *tcluster {
	tb.Helper()
	lc, err := nodetest.Start(context.Background(), nodetest.Config{Size: size, Clock: clk, NamePrefix: "n",
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		tb.Fatal(err)
	}
	c := &tcluster{tb: tb, lc: lc}
	tb.Cleanup(c.stopAll)
	for _, m := range lc.Members() {
		c.nodes = append(c.nodes, &tnode{m: m, n: m.Node, addr: m.Addr, name: m.Name})
	}
	return c
}

// add starts a node that joins the running ones; nodetest names it n<i>
// for the i-th node started, which name must be.
func (c *tcluster) add(name string) *tnode {
	c.tb.Helper()
	m, err := c.lc.Add(context.Background())
	if err != nil {
		c.tb.Fatal(err)
	}
	if m.Name != name {
		c.tb.Fatalf("started %s, want %s", m.Name, name)
	}
	n := &tnode{m: m, n: m.Node, addr: m.Addr, name: m.Name}
	c.nodes = append(c.nodes, n)
	return n
}

// leave stops a node gracefully: it leaves the ring, then stops serving.
func (c *tcluster) leave(n *tnode) {
	if err := c.lc.Stop(n.m); err != nil {
		c.tb.Errorf("stopping %s: %v", n.name, err)
	}
}

// kill stops a node as a crash would: its connections reset, its gossip
// stops without a word.
func (c *tcluster) kill(n *tnode) {
	if err := c.lc.Kill(n.m); err != nil {
		c.tb.Errorf("killing %s: %v", n.name, err)
	}
}

// stopAll stops every node that is up, one after the other.
func (c *tcluster) stopAll() {
	if err := c.lc.Close(); err != nil {
		c.tb.Errorf("stopping the cluster: %v", err)
	}
}

// up returns the running nodes.
func (c *tcluster) up() []*tnode {
	var out []*tnode
	for _, n := range c.nodes {
		if !n.m.Down() {
			out = append(out, n)
		}
	}
	return out
}

func (c *tcluster) addrs() []string { return c.lc.Addrs() }

func (c *tcluster) byName(name string) *tnode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.tb.Fatalf("no node %s", name)
	return nil
}

// forwardedOut returns the items each node has forwarded, by name.
func (c *tcluster) forwardedOut() map[string]int64 {
	out := map[string]int64{}
	for _, n := range c.nodes {
		out[n.name] = n.n.Stats().ForwardedOut
	}
	return out
}

// waitConverged waits until every running node reports the same ring of
// want members and every partition move it started is done, and returns
// its epoch.
func (c *tcluster) waitConverged(want int) uint64 {
	c.tb.Helper()
	if err := c.lc.WaitConverged(context.Background(), want); err != nil {
		c.tb.Fatal(err)
	}
	if err := c.lc.WaitSettled(context.Background()); err != nil {
		c.tb.Fatal(err)
	}
	return c.up()[0].n.Ring().Epoch()
}

// waitClientEpoch waits until cl routes by the ring of epoch.
func waitClientEpoch(tb testing.TB, cl *Client, epoch uint64) {
	tb.Helper()
	timeout := time.After(10 * time.Second)
	for {
		ch := cl.ringChanged()
		if got := cl.Ring().Epoch(); got == epoch {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			tb.Fatalf("client ring epoch %016x, want %016x (members %v)", cl.Ring().Epoch(), epoch, cl.Ring().Members())
		}
	}
}

// freePort returns a port that is free on 127.0.0.1 for TCP and UDP, below
// the ephemeral range (package freeport).
func freePort(tb testing.TB) int {
	tb.Helper()
	port, err := freeport.TCPAndUDP()
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

func dial(tb testing.TB, addr string) *grpc.ClientConn {
	tb.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	return conn
}

// waitServing waits until the node at addr reports SERVING.
func waitServing(tb testing.TB, addr string) {
	tb.Helper()
	conn := dial(tb, addr)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		tb.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			tb.Fatalf("health of %s: %v", addr, err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// newClient starts a client of cfg (seeds filled in if cfg has none), closed
// at the end of the test.
func newClient(tb testing.TB, cfg Config, seeds ...string) *Client {
	tb.Helper()
	if cfg.Seeds == nil {
		cfg.Seeds = seeds
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := New(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	return cl
}

// fakeLimiter is a Limiter server whose Check the test scripts. Its ring is
// itself alone, plus the members of extra. Its WatchRing sends the ring once
// and then nothing, so that only Ring RPCs bring changes.
type fakeLimiter struct {
	pb.UnimplementedLimiterServer
	addr  string
	epoch uint64 // what Ring reports; 0 means the true epoch
	check func(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
	// stream, if set, serves each CheckStream call; nil means UNIMPLEMENTED,
	// as a node of an older version answers.
	stream func(s grpc.BidiStreamingServer[pb.CheckRequest, pb.CheckResponse]) error

	mu      sync.Mutex // guards reqs, extra, rings, watched, streams
	reqs    []*pb.CheckRequest
	extra   []ring.Member
	rings   int             // Ring RPCs answered
	watched []chan struct{} // closed when a WatchRing stream has sent its ring
	streams int             // CheckStream calls served
}

// watchSent returns a channel closed when the next WatchRing stream has
// sent its ring.
func (f *fakeLimiter) watchSent() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.watched = append(f.watched, ch)
	return ch
}

// setExtra changes the fake's ring to itself and extra; it returns the new
// epoch.
func (f *fakeLimiter) setExtra(extra ...ring.Member) uint64 {
	f.mu.Lock()
	f.extra = extra
	f.mu.Unlock()
	return f.ring().Epoch()
}

func (f *fakeLimiter) ring() *ring.Ring {
	f.mu.Lock()
	ms := append([]ring.Member{{Name: "fake", Addr: f.addr}}, f.extra...)
	f.mu.Unlock()
	r, err := ring.New(ms, ring.Config{})
	if err != nil {
		panic(err)
	}
	return r
}

// startFake serves f on 127.0.0.1 until the test ends.
func startFake(tb testing.TB, f *fakeLimiter) *fakeLimiter {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f.addr = lis.Addr().String()
	srv := grpc.NewServer()
	pb.RegisterLimiterServer(srv, f)
	go srv.Serve(lis)
	tb.Cleanup(srv.Stop)
	return f
}

func (f *fakeLimiter) ringResponse() *pb.RingResponse {
	r := f.ring()
	cfg := r.Config()
	epoch := r.Epoch()
	if f.epoch != 0 {
		epoch = f.epoch
	}
	resp := &pb.RingResponse{
		Epoch: epoch, Node: "fake",
		Placement: &pb.Placement{PartitionCount: uint32(cfg.PartitionCount), ReplicationFactor: uint32(cfg.ReplicationFactor), Load: cfg.Load},
	}
	for _, m := range r.Members() {
		resp.Members = append(resp.Members, &pb.Member{Name: m.Name, Addr: m.Addr})
	}
	return resp
}

func (f *fakeLimiter) Ring(context.Context, *pb.RingRequest) (*pb.RingResponse, error) {
	f.mu.Lock()
	f.rings++
	f.mu.Unlock()
	return f.ringResponse(), nil
}

func (f *fakeLimiter) ringCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rings
}

func (f *fakeLimiter) WatchRing(_ *pb.RingRequest, s grpc.ServerStreamingServer[pb.RingResponse]) error {
	if err := s.Send(f.ringResponse()); err != nil {
		return err
	}
	f.mu.Lock()
	for _, ch := range f.watched {
		close(ch)
	}
	f.watched = nil
	f.mu.Unlock()
	<-s.Context().Done()
	return nil
}

func (f *fakeLimiter) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	resp, err := f.check(ctx, req)
	if resp != nil && resp.RingEpoch == 0 {
		resp.RingEpoch = f.ring().Epoch()
	}
	return resp, err
}

func (f *fakeLimiter) CheckStream(s grpc.BidiStreamingServer[pb.CheckRequest, pb.CheckResponse]) error {
	if f.stream == nil {
		return f.UnimplementedLimiterServer.CheckStream(s)
	}
	f.mu.Lock()
	f.streams++
	f.mu.Unlock()
	return f.stream(s)
}

func (f *fakeLimiter) streamCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams
}

func (f *fakeLimiter) requests() []*pb.CheckRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.CheckRequest(nil), f.reqs...)
}

// admitAll answers req as a node with one rule "r" (10 per minute) that
// admits everything, except the items failed lists (index -> error).
func admitAll(req *pb.CheckRequest, failed map[int]*pb.ItemError) *pb.CheckResponse {
	n := len(req.Recipients)
	resp := &pb.CheckResponse{
		Admitted: make([]bool, n), Recorded: make([]bool, n), DeniedBy: make([]int32, n),
		RetryAfterMs: make([]int64, n), DecidedAtMs: make([]int64, n), RuleCounts: make([]uint32, n),
		Domains: map[string]*pb.Domain{"default": {Name: "default", Rules: []*pb.Rule{{Name: "r", Scope: "recipient", Limit: 10, WindowMs: 60_000, Window: "1m0s"}}}},
	}
	for i := range n {
		resp.DeniedBy[i] = -1
		resp.DecidedAtMs[i] = t0
		if e := failed[i]; e != nil {
			e.Index = uint32(i)
			resp.Errors = append(resp.Errors, e)
			continue
		}
		resp.Admitted[i], resp.Recorded[i], resp.RuleCounts[i] = true, true, 1
		resp.Used = append(resp.Used, 1)
		resp.Remaining = append(resp.Remaining, 9)
		resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, 0)
	}
	return resp
}

// restartAndReconnect kills n and restarts it at its address, waits until
// it owns its partitions again, and then until cl's connection to it is up.
func restartAndReconnect(tb testing.TB, c *tcluster, cl *Client, n *tnode) {
	tb.Helper()
	ctx := context.Background()
	c.kill(n)
	if err := c.lc.Restart(ctx, n.m); err != nil {
		tb.Fatal(err)
	}
	// Serving is not yet owning: until its ring holds itself and its
	// partitions are open, the node answers UNAVAILABLE, which a busy
	// machine can stretch past the client's one retry.
	if err := c.lc.WaitConverged(ctx, 1); err != nil {
		tb.Fatal(err)
	}
	if err := c.lc.WaitSettled(ctx); err != nil {
		tb.Fatal(err)
	}
	// A call on a connection in reconnect backoff fails at once (as a unary
	// Check would): wait until the connection is up again.
	p, err := cl.peer(n.addr)
	if err != nil {
		tb.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for st := p.conn.GetState(); st != connectivity.Ready; st = p.conn.GetState() {
		p.conn.Connect()
		if !p.conn.WaitForStateChange(wctx, st) {
			tb.Fatalf("the connection to the restarted node is %v after 30s", st)
		}
	}
}
