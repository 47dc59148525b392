// Package nodetest runs N-node freqring clusters in one process, for tests,
// `freqring cluster` and `freqring bench --start-cluster`, as
// net/http/httptest does for HTTP servers.
//
// By default each node serves gRPC on 127.0.0.1 (node.Serve) and gossips on
// 127.0.0.1, so that clients reach it as they would a real one. With
// InMemory, nodes reach each other through a node.LocalNetwork and serve no
// gRPC: tests call their methods directly, and a stopped node is simply
// unreachable.
//
// Every start waits until the node reports SERVING, and WaitConverged waits
// on ring changes (never on a timer), so tests do not race their own setup.
package nodetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/freeport"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
)

// Config configures a Cluster. A zero field takes the default named in its
// comment.
type Config struct {
	Size    int          // nodes Start starts, [1, 50]; 0 means 3
	Rules   *rules.Set   // nil means the embedded defaults
	Clock   node.Clock   // nil means the system clock
	DataDir string       // "" means memory-only nodes; else node NAME keeps its WAL and snapshots in DataDir/NAME
	Logger  *slog.Logger // nil means discard
	// Gossip is the template of every node's gossip config (BindPort and
	// Join are set per node); nil means FastGossip().
	Gossip *gossip.Config
	// BasePort, if set, puts node i's gRPC on 127.0.0.1:BasePort+i and its
	// gossip on 127.0.0.1:BasePort+100+i; 0 means free ports.
	BasePort int
	// NamePrefix names node i NamePrefix+i; "" means "node-".
	NamePrefix string
	// InMemory connects the nodes through a node.LocalNetwork instead of
	// gRPC; they serve no gRPC and Addr is a name, not an address.
	InMemory bool
	// Faults (which implies InMemory) puts the nodes' gossip, peer calls
	// and Cluster.Check on one in-process network that the test freezes
	// members of (Freeze, Thaw) and cuts links in (Cut, Isolate, Heal); see
	// faults.go. Gossip loses no packet there but those of a cut link.
	Faults bool
	// DialOptions are what the cluster's own calls (its waits for a node to
	// serve) dial nodes with; nil means plaintext. A cluster whose Node hook
	// turns TLS on passes its TLS credentials here.
	DialOptions []grpc.DialOption
	// PeerKeys are the cluster keys its nodes sign their peer calls with
	// (node.Config.PeerKeys); nil means a random key Start makes, so that
	// every test cluster authenticates its peers as a production one does.
	// Gossip stays plaintext unless Gossip carries a Keyring.
	PeerKeys node.Keys
	// Node, if set, adjusts each node's config last.
	Node func(cfg *node.Config)
	// StartTimeout bounds the wait for a node to serve and for rings to
	// converge; 0 means 30 seconds.
	StartTimeout time.Duration
}

// FastGossip is the gossip of test clusters: on 127.0.0.1, detecting a
// crashed member in about two to three seconds, joining the seeds again
// every second (so that members that declared each other dead while a busy
// machine starved them meet again, as the production rejoin loop does). Its
// probe timeout and suspicion multiplier leave room for race-instrumented
// tests on two cores shared with another test run: a member wrongly declared
// dead (a process starved for more than the suspicion time, 1.8 s) changes
// every ring, which fails the tests that want no retryable error.
func FastGossip() gossip.Config {
	return gossip.Config{
		BindAddr: "127.0.0.1", DeadNodeReclaimTime: 200 * time.Millisecond, RejoinInterval: time.Second,
		ProbeInterval: 300 * time.Millisecond, ProbeTimeout: 250 * time.Millisecond, SuspicionMult: 6,
		GossipInterval: 50 * time.Millisecond,
	}
}

// skewedClock is a member's clock: base (nil: the system clock) plus a
// skew in ns that SkewClock sets. Safe for concurrent use.
type skewedClock struct {
	base node.Clock
	skew atomic.Int64
}

func (c *skewedClock) Now() int64 {
	if c.base == nil {
		return time.Now().UnixNano() + c.skew.Load()
	}
	return c.base.Now() + c.skew.Load()
}

// wall is the system clock plus the skew.
func (c *skewedClock) wall() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }

// SkewClock sets m's clock to run d ahead of the cluster's (Config.Clock),
// behind for a negative d, from now on and across restarts; 0 puts it back.
// The node's decisions and its gossip clock measurements use it.
func (c *Cluster) SkewClock(m *Member, d time.Duration) { m.clock.skew.Store(int64(d)) }

// Member is one node of a Cluster.
type Member struct {
	Name       string
	Node       *node.Node
	Addr       string // gRPC address (InMemory: the node's name on the LocalNetwork)
	GossipAddr string // host:port of its gossip

	clock  *skewedClock       // the node's clock: Config.Clock plus the skew SkewClock sets; kept across restarts
	lis    *killListener      // nil InMemory
	cancel context.CancelFunc // stops Serve
	served chan error         // Serve's result
	down   atomic.Bool        // stored after the fields above, so Up's callers see them set
}

// Cluster is a running in-process cluster. One goroutine drives it (Add,
// Stop, Kill, Restart, Close); Up, Members and Addrs may be called from
// others meanwhile, as a load does.
type Cluster struct {
	cfg     Config
	net     *node.LocalNetwork // InMemory
	faults  *faultNet          // Faults
	mu      sync.Mutex         // guards members
	members []*Member
	next    int // number of the next node Add starts
}

// Start starts cfg.Size nodes, each joining the ones before, and waits
// until every node serves and all agree on a ring of all of them.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Size == 0 {
		cfg.Size = 3
	}
	if cfg.Size < 1 || cfg.Size > 50 {
		return nil, fmt.Errorf("nodetest: Size %d out of range [1, 50]", cfg.Size)
	}
	if cfg.Rules == nil {
		cfg.Rules = rules.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
		// FREQRING_NODETEST_LOG names a file that the nodes of every
		// cluster without a Logger append their logs to (debug level), to
		// read a test failure.
		if path := os.Getenv("FREQRING_NODETEST_LOG"); path != "" {
			if f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err == nil {
				cfg.Logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
		}
	}
	if cfg.Gossip == nil {
		g := FastGossip()
		cfg.Gossip = &g
	}
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "node-"
	}
	if cfg.PeerKeys == nil {
		key := make([]byte, 32)
		rand.Read(key)
		cfg.PeerKeys = node.StaticKeys{key}
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	c := &Cluster{cfg: cfg}
	if cfg.Faults {
		c.cfg.InMemory = true
		c.faults = newFaultNet()
	}
	if c.cfg.InMemory {
		c.net = node.NewLocalNetwork()
	}
	if c.faults != nil {
		c.net.Carry(c.faults.carry)
	}
	for range cfg.Size {
		if _, err := c.Add(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitConverged(ctx, cfg.Size); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.WaitSettled(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Add starts one more node, which joins the running ones, and waits until it
// serves (not until rings converge: see WaitConverged).
func (c *Cluster) Add(ctx context.Context) (*Member, error) {
	i := c.next
	c.next++
	m := &Member{Name: fmt.Sprintf("%s%d", c.cfg.NamePrefix, i)}
	m.down.Store(true) // until it serves
	return m, c.start(ctx, m, i)
}

// start starts m as node number i.
func (c *Cluster) start(ctx context.Context, m *Member, i int) error {
	lis, err := c.listen(m, i)
	if err != nil {
		return err
	}
	n, err := c.newNode(m, i)
	if err != nil {
		if lis != nil {
			lis.Close()
		}
		return err
	}
	m.Node = n
	c.mu.Lock()
	if !c.has(m) {
		c.members = append(c.members, m)
	}
	c.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	if c.cfg.InMemory {
		return c.openInMemory(sctx, m)
	}
	return c.serve(sctx, m, lis)
}

// listen opens m's gRPC listener (m.Addr, or a port chosen as Config says)
// and sets m.Addr; an in-memory member gets an address and no listener.
// The gRPC listener comes before the gossip port: while it is open, the
// free port chosen for gossip cannot be its port.
func (c *Cluster) listen(m *Member, i int) (net.Listener, error) {
	if c.cfg.InMemory {
		m.Addr = m.Name + ".in-memory:1" // host:port, as gossip metadata wants
		return nil, nil
	}
	addr := m.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
		if c.cfg.BasePort != 0 {
			addr = fmt.Sprintf("127.0.0.1:%d", c.cfg.BasePort+i)
		}
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("nodetest: %s: %w", m.Name, err)
	}
	m.Addr = lis.Addr().String()
	return lis, nil
}

// newNode picks m's gossip port (kept across restarts) and makes its node,
// joining the members up.
func (c *Cluster) newNode(m *Member, i int) (*node.Node, error) {
	gc := *c.cfg.Gossip
	gc.Join = nil
	for _, o := range c.Up() {
		if o != m {
			gc.Join = append(gc.Join, o.GossipAddr)
		}
	}
	switch {
	case c.faults != nil:
		if m.GossipAddr == "" {
			m.GossipAddr = c.faults.gossipAddr()
		}
		gc.BindAddr, gc.Transport = "", c.faults.newEnd(m.Name, m.GossipAddr)
	case m.GossipAddr != "": // a restart keeps its ports
		_, port, _ := net.SplitHostPort(m.GossipAddr)
		fmt.Sscan(port, &gc.BindPort)
	case c.cfg.BasePort != 0:
		gc.BindPort = c.cfg.BasePort + 100 + i
	default:
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		gc.BindPort = p
	}
	if c.faults == nil {
		m.GossipAddr = fmt.Sprintf("127.0.0.1:%d", gc.BindPort)
	}
	if m.clock == nil {
		m.clock = &skewedClock{base: c.cfg.Clock}
	}
	// Gossip measures the system clock plus the skew: a test's Clock may
	// stand still or jump, which the measurement would take for skew.
	gc.Now = m.clock.wall
	if c.cfg.InMemory {
		gc.Refuses = c.refuses // no socket to dial: a member down refuses
	}
	ncfg := node.Config{Rules: c.cfg.Rules, Clock: m.clock, Name: m.Name, AdvertiseAddr: m.Addr,
		Cluster: &gc, Logger: c.cfg.Logger, PeerKeys: c.cfg.PeerKeys}
	if c.cfg.DataDir != "" {
		ncfg.DataDir = filepath.Join(c.cfg.DataDir, m.Name)
	}
	if c.cfg.InMemory {
		ncfg.Peers = c.net.PeersFrom(m.Addr)
	}
	if c.faults != nil {
		c.faults.named(m.Addr, m.Name)
	}
	if c.cfg.Node != nil {
		c.cfg.Node(&ncfg)
	}
	return node.New(ncfg)
}

// openInMemory opens in-memory member m, registered on the cluster's
// network before Open: peers may forward to it as soon as it announces
// serving.
func (c *Cluster) openInMemory(ctx context.Context, m *Member) error {
	c.net.Register(m.Addr, m.Node)
	if err := m.Node.Open(ctx); err != nil {
		c.net.Unregister(m.Addr)
		m.down.Store(true)
		return fmt.Errorf("nodetest: %s: %w", m.Name, err)
	}
	m.cancel = func() {}
	m.down.Store(false)
	return nil
}

// serve serves member m's node on lis until Kill or Stop, and waits until
// it reports serving (ctx bounds the wait).
func (c *Cluster) serve(ctx context.Context, m *Member, lis net.Listener) error {
	runCtx, stop := context.WithCancel(context.Background())
	m.lis = &killListener{Listener: lis}
	m.cancel = stop
	m.served = make(chan error, 1)
	go func() { m.served <- m.Node.Serve(runCtx, m.lis) }()
	if err := waitServing(ctx, m.Addr, m.served, c.cfg.DialOptions...); err != nil {
		stop()
		m.down.Store(true)
		return fmt.Errorf("nodetest: %s: %w", m.Name, err)
	}
	m.down.Store(false)
	return nil
}

func (c *Cluster) has(m *Member) bool {
	for _, o := range c.members {
		if o == m {
			return true
		}
	}
	return false
}

// refuses reports whether in-memory member addr is down (killed, stopped,
// or restarting), as a dial of its port would find none listening.
func (c *Cluster) refuses(addr string) bool {
	for _, m := range c.Members() {
		if m.Addr == addr {
			return m.Down()
		}
	}
	return true
}

// Members returns every node started, running or not, in start order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Member(nil), c.members...)
}

// Up returns the running nodes.
func (c *Cluster) Up() []*Member {
	var out []*Member
	for _, m := range c.Members() {
		if !m.down.Load() {
			out = append(out, m)
		}
	}
	return out
}

// Addrs returns the gRPC addresses of the running nodes.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, m := range c.Up() {
		out = append(out, m.Addr)
	}
	return out
}

// Down reports whether m is stopped.
func (m *Member) Down() bool { return m.down.Load() }

// Stop stops m gracefully: it leaves the ring, finishes in-flight calls and
// closes (with a DataDir, a final snapshot). A frozen m thaws first.
func (c *Cluster) Stop(m *Member) error {
	if !m.down.CompareAndSwap(false, true) {
		return nil
	}
	if c.cfg.InMemory {
		if c.faults != nil {
			c.faults.setFrozen(m.Name, false) // a frozen process cannot leave
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
		defer cancel()
		m.Node.Leave(ctx)
		c.net.Unregister(m.Addr)
		return m.Node.Close()
	}
	m.cancel()
	return <-m.served
}

// Kill stops m as a crash would: its connections reset and its gossip stops
// without a word (the node is still closed, so goroutines end).
func (c *Cluster) Kill(m *Member) error {
	if !m.down.CompareAndSwap(false, true) {
		return nil
	}
	if c.cfg.InMemory {
		if c.faults != nil {
			c.faults.killed(m.Name)
		}
		c.net.Unregister(m.Addr)
		return m.Node.Close()
	}
	m.lis.kill()
	err := <-m.served // Serve returns when its listener fails, after closing the node
	m.cancel()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Restart starts a stopped m again under its name, addresses and data
// directory, and waits until it serves.
func (c *Cluster) Restart(ctx context.Context, m *Member) error {
	if !m.down.Load() {
		return fmt.Errorf("nodetest: %s is running", m.Name)
	}
	i := 0
	for j, o := range c.Members() {
		if o == m {
			i = j
		}
	}
	return c.start(ctx, m, i)
}

// Close stops every running node, one after the other (a node leaves
// fastest while its peers are there to hear it), and returns their errors.
func (c *Cluster) Close() error {
	var errs []error
	for _, m := range c.Up() {
		if err := c.Stop(m); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
		}
	}
	return errors.Join(errs...)
}

// WaitConverged waits until every running node's ring has want members and
// the same epoch, watching ring changes (Node.WatchRing).
func (c *Cluster) WaitConverged(ctx context.Context, want int) error {
	return c.WaitConvergedOn(ctx, c.Up(), want)
}

// WaitConvergedOn is WaitConverged for the nodes of members up (the side
// of a network partition, say).
func (c *Cluster) WaitConvergedOn(ctx context.Context, up []*Member, want int) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	type update struct {
		i       int
		epoch   uint64
		members int
	}
	updates := make(chan update)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, m := range up {
		wg.Go(func() {
			m.Node.WatchRing(ctx, func(r *pb.RingResponse) error {
				select {
				case updates <- update{i, r.Epoch, len(r.Members)}:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
		})
	}
	latest := make([]update, len(up))
	for {
		select {
		case u := <-updates:
			latest[u.i] = u
		case <-ctx.Done():
			return fmt.Errorf("nodetest: rings did not converge on %d members: %+v", want, latest)
		}
		ok := true
		for _, u := range latest {
			ok = ok && u.members == want && u.epoch == latest[0].epoch
		}
		if ok {
			return nil
		}
	}
}

// WaitSettled waits until every partition is open on exactly one running
// node, its owner under that node's ring, which all running nodes share:
// every move is done. It polls the nodes' Stats every 5 ms.
func (c *Cluster) WaitSettled(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.settled()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodetest: partitions did not settle: %v", err)
		case <-tick.C:
		}
	}
}

// settled returns nil if every partition is open on exactly its owner.
func (c *Cluster) settled() error {
	up := c.Up()
	if len(up) == 0 {
		return nil
	}
	r := up[0].Node.Ring()
	var opens []int
	for _, m := range up {
		if e := m.Node.Ring().Epoch(); e != r.Epoch() {
			return fmt.Errorf("%s has ring %d, %s has %d", m.Name, e, up[0].Name, r.Epoch())
		}
		s := m.Node.Stats()
		if opens == nil {
			opens = make([]int, len(s.Open))
		}
		for p, open := range s.Open {
			if open {
				opens[p]++
				if o := r.PartitionOwner(p); o.Name != m.Name {
					return fmt.Errorf("partition %d is open on %s, its owner is %s", p, m.Name, o.Name)
				}
			}
		}
	}
	for p, k := range opens {
		if k != 1 {
			return fmt.Errorf("partition %d is open on %d nodes", p, k)
		}
	}
	return nil
}

// freePort returns a port that is free on 127.0.0.1 for TCP and UDP (gossip
// uses both), below the ephemeral range (package freeport).
func freePort() (int, error) { return freeport.TCPAndUDP() }

// WaitServing waits until the node at addr reports SERVING through gRPC
// health, or ctx ends. A test that starts Serve itself calls it before the
// first check: Serve answers NOT_SERVING while the node recovers.
func WaitServing(ctx context.Context, addr string) error { return waitServing(ctx, addr, nil) }

// WaitServingWith is WaitServing dialling with opts (a node serving TLS
// needs TLS credentials); no opts means plaintext.
func WaitServingWith(ctx context.Context, addr string, opts ...grpc.DialOption) error {
	return waitServing(ctx, addr, nil, opts...)
}

// waitServing waits until the node at addr reports SERVING through gRPC
// health, or Serve returns (served; nil never does). No opts means
// plaintext.
func waitServing(ctx context.Context, addr string, served <-chan error, opts ...grpc.DialOption) error {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		// Opening the watch waits for a connection (WaitForReady), so it
		// runs here, beside served: a Serve that fails and closes its
		// listener is reported at once, not as a dial error at ctx's end.
		w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			got <- err
			return
		}
		for {
			r, err := w.Recv()
			if err != nil {
				got <- err
				return
			}
			if r.Status == healthpb.HealthCheckResponse_SERVING {
				got <- nil
				return
			}
		}
	}()
	select {
	case err := <-got:
		if err == nil || served == nil {
			return err
		}
		// The watch ends when Serve stops the server: its error says why.
		select {
		case serr := <-served:
			return fmt.Errorf("stopped before serving: %v (health watch: %v)", serr, err)
		case <-ctx.Done():
			return err
		}
	case err := <-served:
		return fmt.Errorf("stopped before serving: %v", err)
	}
}

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
