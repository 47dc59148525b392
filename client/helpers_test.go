package client

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
)

// t0 is the test clock's start, unix ms (2026-09-21).
const t0 = 1_790_000_000_000

// testClock is a settable node clock, unix ns.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() int64              { return c.ns.Load() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// killListener is a listener whose kill closes it and every connection it
// accepted, as the death of the process would: peers see resets, new
// connections are refused.
type killListener struct {
	net.Listener
	mu    sync.Mutex // guards conns, dead
	conns []net.Conn
	dead  bool
}

func (l *killListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		conn.Close()
		return nil, net.ErrClosed
	}
	l.conns = append(l.conns, conn)
	return conn, nil
}

func (l *killListener) kill() {
	l.mu.Lock()
	l.dead = true
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	l.Listener.Close()
	for _, c := range conns {
		c.Close()
	}
}

// tnode is one node of an in-process cluster.
type tnode struct {
	name   string
	n      *node.Node
	addr   string // gRPC
	gossip int    // gossip port on 127.0.0.1
	lis    *killListener
	cancel context.CancelFunc
	served chan error
	down   bool
}

// tcluster runs nodes in this process on 127.0.0.1, each with its own gRPC
// server (node.Serve) and gossip port, sharing one clock and rule set.
type tcluster struct {
	tb    testing.TB
	clk   node.Clock // nil: the system clock
	rules *node.RuleSet
	nodes []*tnode
}

// fastGossip detects a crashed member in about a second on one host.
func fastGossip() gossip.Config {
	return gossip.Config{
		BindAddr: "127.0.0.1", DeadNodeReclaimTime: 200 * time.Millisecond, RejoinInterval: -1,
		ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond, SuspicionMult: 2,
		GossipInterval: 50 * time.Millisecond,
	}
}

// newCluster starts size nodes, n0 to n<size-1>, and waits until they agree
// on a ring of all of them. clk nil means the system clock.
func newCluster(tb testing.TB, size int, clk node.Clock) *tcluster {
	tb.Helper()
	c := &tcluster{tb: tb, clk: clk, rules: node.DefaultRules()}
	tb.Cleanup(c.stopAll)
	for i := range size {
		c.add(fmt.Sprintf("n%d", i))
	}
	c.waitConverged(size)
	return c
}

// add starts a node that joins the running ones (or forms a cluster alone).
func (c *tcluster) add(name string) *tnode {
	tb := c.tb
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gc := fastGossip()
	gc.BindPort = freePort(tb)
	for _, n := range c.up() {
		gc.Join = append(gc.Join, fmt.Sprintf("127.0.0.1:%d", n.gossip))
	}
	n, err := node.New(node.Config{Name: name, Rules: c.rules, Clock: c.clk, Shards: 4, SweepInterval: -1, Cluster: &gc})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &tnode{name: name, n: n, addr: lis.Addr().String(), gossip: gc.BindPort, lis: &killListener{Listener: lis}, cancel: cancel, served: make(chan error, 1)}
	go func() { tn.served <- n.Serve(ctx, tn.lis) }()
	c.nodes = append(c.nodes, tn)
	waitServing(tb, tn.addr)
	return tn
}

// leave stops a node gracefully: it leaves the ring, then stops serving.
func (c *tcluster) leave(n *tnode) {
	if n.down {
		return
	}
	n.down = true
	n.cancel()
	<-n.served
}

// kill stops a node as a crash would: its connections reset, its gossip
// stops without a word.
func (c *tcluster) kill(n *tnode) {
	if n.down {
		return
	}
	n.down = true
	n.lis.kill()
	<-n.served // Serve returns when its listener fails, after closing the node
	n.cancel()
}

// stopAll stops every node that is up, one after the other: a node leaves
// fastest while its peers are there to hear it.
func (c *tcluster) stopAll() {
	for _, n := range c.up() {
		c.leave(n)
	}
}

// up returns the running nodes.
func (c *tcluster) up() []*tnode {
	var out []*tnode
	for _, n := range c.nodes {
		if !n.down {
			out = append(out, n)
		}
	}
	return out
}

func (c *tcluster) addrs() []string {
	var out []string
	for _, n := range c.up() {
		out = append(out, n.addr)
	}
	return out
}

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

// waitConverged waits, through a WatchRing stream to each running node, until
// they all report the same ring of want members, and returns its epoch.
func (c *tcluster) waitConverged(want int) uint64 {
	tb := c.tb
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	up := c.up()
	type update struct {
		i       int
		epoch   uint64
		members int
	}
	updates := make(chan update)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, n := range up {
		conn := dial(tb, n.addr)
		defer conn.Close()
		stream, err := pb.NewLimiterClient(conn).WatchRing(ctx, &pb.RingRequest{})
		if err != nil {
			tb.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := stream.Recv()
				if err != nil {
					return
				}
				select {
				case updates <- update{i, r.Epoch, len(r.Members)}:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	latest := make([]update, len(up))
	for {
		select {
		case u := <-updates:
			latest[u.i] = u
		case <-ctx.Done():
			tb.Fatalf("rings did not converge on %d members: %+v", want, latest)
		}
		ok := true
		for _, u := range latest {
			ok = ok && u.members == want && u.epoch == latest[0].epoch
		}
		if ok {
			return latest[0].epoch
		}
	}
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

// freePort returns a port that is free on 127.0.0.1 for TCP and UDP.
func freePort(tb testing.TB) int {
	tb.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	tb.Fatal("no free port")
	return 0
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

	mu      sync.Mutex // guards reqs, extra, rings, watched
	reqs    []*pb.CheckRequest
	extra   []ring.Member
	rings   int             // Ring RPCs answered
	watched []chan struct{} // closed when a WatchRing stream has sent its ring
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
