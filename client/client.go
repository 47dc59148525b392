package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// Defaults and bounds of Config, and the limits of one item. The item limits
// are the node's (package node: MaxBatch, MaxRecipientBytes, MaxContentBytes,
// window.MaxCost); the client checks them itself so that a bad item is
// reported as the caller's error even when no node answers.
const (
	DefaultTimeout     = 500 * time.Millisecond
	DefaultMaxBatch    = 256
	DefaultMaxInFlight = 2

	MaxTimeout     = 10 * time.Minute
	MaxMaxDelay    = 100 * time.Millisecond
	MaxMaxInFlight = 1024

	MaxRequestItems   = 10_000   // items per Check RPC a node accepts; bounds MaxBatch
	MaxRecipientBytes = 256      // bytes per recipient
	MaxContentBytes   = 64 << 10 // bytes per content
	MaxCost           = 1000     // sends one item may count as

	// maxResponseBytes bounds a response the client accepts; a response to
	// MaxRequestItems items of 16 rules is about 2.5 MB.
	maxResponseBytes = 16 << 20
)

// Timings of the ring watch and the seed rounds of New.
const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
	// asyncRefreshTimeout bounds a refresh started by a response that carried
	// another epoch (no caller waits on it).
	asyncRefreshTimeout = 2 * time.Second
	// asyncRefreshGap spaces those refreshes: while nodes disagree on the
	// ring (for a gossip round or two after a change), responses alternate
	// between their epochs, and each would ask for the ring again.
	asyncRefreshGap = 50 * time.Millisecond
	// degradedLogEvery spaces the warnings logged while decisions degrade.
	degradedLogEvery = time.Second
)

var (
	// ErrClosed is returned by calls on a closed Client, and by calls in
	// flight when Close is called.
	ErrClosed = errors.New("client: closed")
	// ErrEpochMismatch is returned by New when the ring this client computes
	// from a node's member list and placement has another epoch than the
	// node's: the two place keys differently (different builds of package
	// ring), so routing by this client would be wrong.
	ErrEpochMismatch = errors.New("client: ring epoch mismatch")
)

// FailurePolicy says what a check answers when no node can decide it before
// its deadline.
type FailurePolicy int

const (
	// FailOpen admits (Admitted and Degraded true): the sending pipeline
	// keeps working while the limiter does not. The default.
	FailOpen FailurePolicy = iota
	// FailClosed denies (Admitted false, Degraded true).
	FailClosed
)

func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// Config configures a Client. A zero field takes the default named in its
// comment.
type Config struct {
	// Seeds are gRPC host:port addresses of some nodes of the cluster; the
	// client asks them for the ring at start, and again if it loses every
	// member. Required: at least one.
	Seeds []string
	// Timeout is the deadline of a call whose context has none, or a later
	// one: the longest a Check or CheckBatch waits before it answers by
	// FailurePolicy. 0 means 500ms; [1ms, 10m].
	Timeout time.Duration
	// FailurePolicy answers the checks no node decided in time. The zero
	// value is FailOpen.
	FailurePolicy FailurePolicy
	// MaxBatch is the most items one coalesced Check RPC carries (concurrent
	// single Checks to one node share an RPC). 0 means 256; [1, 10000].
	MaxBatch int
	// MaxInFlight is how many coalesced Check RPCs to one member may be
	// outstanding. A single Check goes out at once while fewer are; beyond,
	// single Checks queue and the next RPC carries all that queued. 0 means
	// 2; [1, 1024].
	MaxInFlight int
	// MaxDelay makes each coalesced batch wait this long for more items
	// after its first, on top of MaxInFlight. 0 (or negative) means no wait,
	// the default; at most 100ms. Note that Go timers shorter than a
	// millisecond may fire a millisecond late.
	MaxDelay time.Duration
	// DialOptions are used for every connection to a node. nil means
	// insecure transport credentials; a non-nil list replaces that default,
	// so it must set credentials itself.
	DialOptions []grpc.DialOption
	// Logger receives ring changes (Info), degraded answers (Warn, at most
	// once a second) and watch errors (Debug). nil means discard.
	Logger *slog.Logger
	// Rand draws the request ids of items that have none. nil means the
	// runtime's per-thread ChaCha8 generator, seeded from the OS
	// (math/rand/v2's top-level functions). A non-nil source is called under
	// a mutex; seed it differently in every process: nodes remember recorded
	// (request id, recipient) pairs for a while (node.Config.IdempotencyWindow,
	// 1 minute by default), and two clients that draw the same ids would have
	// a send to the same recipient taken for a retry. A fixed seed is for
	// tests.
	Rand rand.Source
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.DialOptions == nil {
		c.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate checks a Config with defaults filled in.
func (c Config) validate() error {
	if len(c.Seeds) == 0 {
		return errors.New("client: Seeds is empty: want at least one gRPC host:port")
	}
	for i, s := range c.Seeds {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("client: Seeds[%d] %q is not host:port: %w", i, s, err)
		}
	}
	if c.Timeout < time.Millisecond || c.Timeout > MaxTimeout {
		return fmt.Errorf("client: Timeout %v out of range [1ms, %v]", c.Timeout, MaxTimeout)
	}
	if c.FailurePolicy != FailOpen && c.FailurePolicy != FailClosed {
		return fmt.Errorf("client: FailurePolicy %d out of range [%d (FailOpen), %d (FailClosed)]", int(c.FailurePolicy), FailOpen, FailClosed)
	}
	if c.MaxBatch < 1 || c.MaxBatch > MaxRequestItems {
		return fmt.Errorf("client: MaxBatch %d out of range [1, %d]", c.MaxBatch, MaxRequestItems)
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > MaxMaxInFlight {
		return fmt.Errorf("client: MaxInFlight %d out of range [1, %d]", c.MaxInFlight, MaxMaxInFlight)
	}
	if c.MaxDelay > MaxMaxDelay {
		return fmt.Errorf("client: MaxDelay %v out of range (-∞, %v] (0 or negative: no wait)", c.MaxDelay, MaxMaxDelay)
	}
	return nil
}

// Client checks items against a freqring cluster, sending each to the node
// that owns its recipient. It is safe for concurrent use.
type Client struct {
	cfg Config
	log *slog.Logger

	cur  atomic.Pointer[routes] // the ring calls route by; never nil after New
	life context.Context        // ends at Close; parent of the client's own RPCs
	stop context.CancelFunc

	closed atomic.Bool
	loops  sync.WaitGroup // watch loop, refresh loop, batchers
	rpcs   sync.WaitGroup // coalesced Check RPCs in flight (started by batchers)

	mu      sync.Mutex       // guards peers, changed and, with closed, starting goroutines
	peers   map[string]*peer // by gRPC address; one connection each
	changed chan struct{}    // closed and replaced at every ring change

	installMu sync.Mutex             // serializes ring installs (swap, then prune)
	watching  atomic.Pointer[string] // address of the node the ring watch is on

	flightMu    sync.Mutex // guards flight
	flight      *flight    // the Ring fetch in progress, if any
	lastRefresh atomic.Int64
	refreshReq  chan refreshRequest // cap 1: refreshes asked for by responses

	randMu sync.Mutex // guards cfg.Rand

	lastDegradedLog atomic.Int64 // unix ns
	degradedSince   atomic.Int64 // degraded answers since the last warning

	st counters
}

// peer is one member address: its connection and, once a single Check
// needs it, its batcher.
type peer struct {
	addr string
	conn *grpc.ClientConn
	cli  pb.LimiterClient
	b    *batcher // nil until first used; guarded by Client.mu
}

// flight is one Ring fetch that concurrent refreshes share.
type flight struct {
	done chan struct{}
	err  error
}

// refreshRequest asks the refresh loop to fetch the ring from addr, whose
// node answered with epoch.
type refreshRequest struct {
	addr  string
	epoch uint64
}

// New connects to the cluster: it asks every seed for the ring, takes the
// first answer, and builds the same placement as the nodes (package ring).
// It retries the seeds with backoff until one answers or ctx is done, so give
// ctx a deadline. It fails with ErrEpochMismatch if the ring it builds has
// another epoch than the node's. The Client then follows ring changes on its
// own until Close.
func New(ctx context.Context, cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	life, stop := context.WithCancel(context.Background())
	c := &Client{
		cfg: cfg, log: cfg.Logger, life: life, stop: stop,
		peers: map[string]*peer{}, changed: make(chan struct{}),
		refreshReq: make(chan refreshRequest, 1),
	}
	r, err := c.bootstrap(ctx)
	if err != nil {
		c.shutdown()
		return nil, err
	}
	c.install(r, "seed")
	c.loops.Add(2)
	go c.watchLoop()
	go c.refreshLoop()
	return c, nil
}

// bootstrap asks every seed for the ring at once, in rounds with backoff,
// until one answers with a ring this build places identically, or ctx ends.
func (c *Client) bootstrap(ctx context.Context) (*ring.Ring, error) {
	type answer struct {
		seed string
		r    *ring.Ring
		err  error
	}
	backoff := backoffMin
	for round := 1; ; round++ {
		// A round ends when every seed has answered or failed; a seed that
		// does not answer at all must not hold the others' next round.
		rctx, cancel := context.WithTimeout(ctx, max(4*c.cfg.Timeout, 2*time.Second))
		answers := make(chan answer, len(c.cfg.Seeds))
		for _, s := range c.cfg.Seeds {
			go func() {
				p, err := c.peer(s)
				if err != nil {
					answers <- answer{s, nil, err}
					return
				}
				resp, err := p.cli.Ring(rctx, &pb.RingRequest{})
				if err != nil {
					answers <- answer{s, nil, err}
					return
				}
				r, err := ringOf(resp)
				answers <- answer{s, r, err}
			}()
		}
		var errs []error
		var found *ring.Ring
		var mismatch error
		for range c.cfg.Seeds { // every goroutine of the round has sent when this ends
			a := <-answers
			switch {
			case a.err == nil && found == nil:
				found = a.r
				cancel() // the others need not finish
			case errors.Is(a.err, ErrEpochMismatch):
				mismatch = a.err
			case a.err != nil:
				errs = append(errs, fmt.Errorf("seed %s: %w", a.seed, a.err))
			}
		}
		cancel()
		switch {
		case found != nil:
			return found, nil
		case mismatch != nil:
			return nil, mismatch // retrying cannot help
		}
		c.log.Warn("no seed answered the Ring RPC", "round", round, "err", errors.Join(errs...))
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("client: no seed of %v answered with a ring before ctx ended (%w): %w", c.cfg.Seeds, ctx.Err(), errors.Join(errs...))
		case <-t.C:
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// ringOf builds the ring a node described, and checks that this build
// computes the node's epoch from it.
func ringOf(resp *pb.RingResponse) (*ring.Ring, error) {
	if resp.Placement == nil {
		return nil, fmt.Errorf("client: node %s sent a ring without placement parameters", resp.Node)
	}
	if len(resp.Members) == 0 || resp.Epoch == 0 {
		return nil, fmt.Errorf("client: node %s has an empty ring (epoch %d, %d members)", resp.Node, resp.Epoch, len(resp.Members))
	}
	ms := make([]ring.Member, len(resp.Members))
	for i, m := range resp.Members {
		ms[i] = ring.Member{Name: m.Name, Addr: m.Addr}
	}
	pl := resp.Placement
	r, err := ring.New(ms, ring.Config{PartitionCount: int(pl.PartitionCount), ReplicationFactor: int(pl.ReplicationFactor), Load: pl.Load})
	if err != nil {
		return nil, fmt.Errorf("client: ring of node %s: %w", resp.Node, err)
	}
	if r.Epoch() != resp.Epoch {
		return nil, fmt.Errorf("%w: node %s reports epoch %016x for %d members (partitions %d, replication %d, load %g); this client computes %016x from the same: the node and this client place keys differently (another version of package ring?)",
			ErrEpochMismatch, resp.Node, resp.Epoch, len(ms), pl.PartitionCount, pl.ReplicationFactor, pl.Load, r.Epoch())
	}
	return r, nil
}

// install makes r the ring calls route by, unless it has the current epoch,
// and closes the connections of members that left. It reports whether the
// ring changed.
func (c *Client) install(r *ring.Ring, source string) bool {
	c.installMu.Lock()
	defer c.installMu.Unlock()
	var old *ring.Ring
	if rt := c.cur.Load(); rt != nil {
		old = rt.r
	}
	if old != nil && old.Epoch() == r.Epoch() {
		return false
	}
	c.cur.Store(newRoutes(r))
	c.st.ringChanges.Add(1)
	oldEpoch := uint64(0)
	if old != nil {
		oldEpoch = old.Epoch()
	}
	c.log.Info("ring changed", "epoch", r.Epoch(), "old_epoch", oldEpoch, "members", r.Len(), "from", source)

	keep := make(map[string]bool, r.Len())
	for _, m := range r.Members() {
		keep[m.Addr] = true
	}
	var gone []*peer
	c.mu.Lock()
	for addr, p := range c.peers {
		if !keep[addr] {
			gone = append(gone, p)
			delete(c.peers, addr)
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	for _, p := range gone {
		p.close()
	}
	return true
}

// close stops the peer's batcher (its queued items fail as retryable) and
// closes its connection (its RPCs in flight end with Canceled).
func (p *peer) close() {
	if p.b != nil {
		p.b.close()
	}
	p.conn.Close()
}

// ringChanged returns a channel closed at the next ring change.
func (c *Client) ringChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// peer returns the peer at addr, connecting on first use (grpc.NewClient
// does not dial until an RPC needs it).
func (c *Client) peer(addr string) (*peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if p := c.peers[addr]; p != nil {
		return p, nil
	}
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes))}, c.cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: connecting to %s: %w", addr, err)
	}
	p := &peer{addr: addr, conn: conn, cli: pb.NewLimiterClient(conn)}
	c.peers[addr] = p
	return p, nil
}

// batcher returns p's batcher, starting it on first use.
func (c *Client) batcher(p *peer) (*batcher, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if p.b == nil {
		if c.peers[p.addr] != p {
			return nil, errMemberLeft // pruned since the caller looked it up
		}
		p.b = newBatcher(c, p)
		c.loops.Add(1)
		go p.b.loop()
	}
	return p.b, nil
}

// Ring returns the ring the client routes by now. It is never nil.
func (c *Client) Ring() *ring.Ring { return c.cur.Load().r }

// routes is a ring with its partition table flattened to member indexes, so
// that a batch groups its items by owner without hashing addresses.
type routes struct {
	r       *ring.Ring
	members []ring.Member // sorted by name
	owner   []int32       // partition -> index in members
}

func newRoutes(r *ring.Ring) *routes {
	rt := &routes{r: r, members: r.Members(), owner: make([]int32, r.Config().PartitionCount)}
	index := make(map[string]int32, len(rt.members))
	for i, m := range rt.members {
		index[m.Name] = int32(i)
	}
	for p := range rt.owner {
		rt.owner[p] = index[r.PartitionOwner(p).Name]
	}
	return rt
}

// ownerIndex returns the index in members of the owner of recipient. The
// ring must not be empty.
func (rt *routes) ownerIndex(recipient string) int {
	return int(rt.owner[rt.r.PartitionString(recipient)])
}

// Close stops the client's goroutines and closes its connections. Calls in
// flight return ErrClosed; later calls too. Close returns nil, also when
// called again.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	c.closed.Store(true)
	c.mu.Unlock()
	c.shutdown()
	return nil
}

// shutdown cancels the client's context, stops the batchers and waits for
// every goroutine, then closes the connections.
func (c *Client) shutdown() {
	c.closed.Store(true)
	c.stop()
	c.mu.Lock()
	peers := c.peers
	c.peers = map[string]*peer{}
	c.mu.Unlock()
	for _, p := range peers {
		if p.b != nil {
			p.b.close()
		}
	}
	c.loops.Wait() // batchers, watch and refresh loops: none starts an RPC after this
	c.rpcs.Wait()
	for _, p := range peers {
		p.conn.Close()
	}
}

// watchLoop keeps a WatchRing stream open to some member and installs every
// ring it sends. When the stream breaks it reconnects, to another member if
// there is one, with jittered exponential backoff (reset by a stream that
// delivered a ring).
func (c *Client) watchLoop() {
	defer c.loops.Done()
	backoff := backoffMin
	last := ""
	for {
		addr := c.pickAddr(last)
		got, err := c.watch(addr)
		if c.life.Err() != nil {
			return
		}
		c.log.Debug("ring watch ended", "addr", addr, "received", got, "err", err)
		if got {
			backoff = backoffMin
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-c.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, backoffMax)
		last = addr
	}
}

// watch follows the WatchRing stream of the node at addr until it breaks.
func (c *Client) watch(addr string) (received bool, err error) {
	p, err := c.peer(addr)
	if err != nil {
		return false, err
	}
	stream, err := p.cli.WatchRing(c.life, &pb.RingRequest{})
	if err != nil {
		return false, err
	}
	c.watching.Store(&addr)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		received = true
		r, err := ringOf(resp)
		if err != nil {
			c.log.Error("ignoring a ring from the watch", "addr", addr, "err", err)
			continue
		}
		c.install(r, "watch "+addr)
	}
}

// pickAddr returns a random member address other than avoid, or a random
// seed if there is none.
func (c *Client) pickAddr(avoid string) string {
	var cands []string
	for _, m := range c.Ring().Members() {
		if m.Addr != avoid {
			cands = append(cands, m.Addr)
		}
	}
	if len(cands) == 0 {
		cands = c.cfg.Seeds
	}
	return cands[rand.IntN(len(cands))]
}

// requestRefresh asks the refresh loop, without waiting, to fetch the ring
// from the node at addr, which answered with epoch.
func (c *Client) requestRefresh(addr string, epoch uint64) {
	select {
	case c.refreshReq <- refreshRequest{addr, epoch}:
	default: // one is pending; it will do
	}
}

// refreshLoop serves requestRefresh.
func (c *Client) refreshLoop() {
	defer c.loops.Done()
	for {
		var req refreshRequest
		select {
		case <-c.life.Done():
			return
		case req = <-c.refreshReq:
		}
		if c.Ring().Epoch() == req.epoch {
			continue // the watch was faster
		}
		ctx, cancel := context.WithTimeout(c.life, asyncRefreshTimeout)
		if err := c.refresh(ctx, req.addr, "", time.Time{}); err != nil && c.life.Err() == nil {
			c.log.Debug("ring refresh failed", "err", err)
		}
		cancel()
		t := time.NewTimer(asyncRefreshGap)
		select {
		case <-c.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refresh fetches the ring with a Ring RPC and installs it. It asks prefer
// first (if not ""), then the members in random order with avoid last, then
// the seeds; each try gets half the time left. Concurrent refreshes share one
// fetch. A refresh whose caller's attempt began before the last successful
// fetch began (since) is skipped: that ring is as fresh as one fetched now.
func (c *Client) refresh(ctx context.Context, prefer, avoid string, since time.Time) error {
	if !since.IsZero() && c.lastRefresh.Load() >= since.UnixNano() {
		return nil
	}
	c.flightMu.Lock()
	if f := c.flight; f != nil {
		c.flightMu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	c.flight = f
	c.flightMu.Unlock()

	f.err = c.fetchRing(ctx, prefer, avoid)

	c.flightMu.Lock()
	c.flight = nil
	c.flightMu.Unlock()
	close(f.done)
	return f.err
}

// fetchRing is the work of refresh.
func (c *Client) fetchRing(ctx context.Context, prefer, avoid string) error {
	start := time.Now()
	c.st.ringRefreshes.Add(1)
	var cands []string
	seen := map[string]bool{}
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			cands = append(cands, a)
		}
	}
	add(prefer)
	ms := c.Ring().Members()
	rand.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	for _, m := range ms {
		if m.Addr != avoid {
			add(m.Addr)
		}
	}
	add(avoid)
	for _, s := range c.cfg.Seeds {
		add(s)
	}
	var errs []error
	for i, addr := range cands {
		if ctx.Err() != nil {
			break
		}
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < len(cands)-1 {
			tctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		}
		err := c.fetchFrom(tctx, addr)
		cancel()
		if err == nil {
			for { // keep the latest start
				last := c.lastRefresh.Load()
				if last >= start.UnixNano() || c.lastRefresh.CompareAndSwap(last, start.UnixNano()) {
					break
				}
			}
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if errors.Is(err, ErrClosed) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return fmt.Errorf("client: ring refresh: %w", errors.Join(errs...))
}

// fetchFrom asks the node at addr for the ring and installs it.
func (c *Client) fetchFrom(ctx context.Context, addr string) error {
	p, err := c.peer(addr)
	if err != nil {
		return err
	}
	resp, err := p.cli.Ring(ctx, &pb.RingRequest{})
	if err != nil {
		return err
	}
	r, err := ringOf(resp)
	if err != nil {
		return err
	}
	c.install(r, "refresh "+addr)
	return nil
}

// newID returns a nonzero request id.
func (c *Client) newID() uint64 {
	for {
		var id uint64
		if c.cfg.Rand == nil {
			id = rand.Uint64()
		} else {
			c.randMu.Lock()
			id = c.cfg.Rand.Uint64()
			c.randMu.Unlock()
		}
		if id != 0 {
			return id
		}
	}
}

// jitter returns a random duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// Stats are the client's counters since New. Each is read atomically; the set
// is not one snapshot.
type Stats struct {
	Calls         int64 // Check and CheckBatch calls
	Items         int64 // items in those calls
	RPCs          int64 // Check RPCs sent
	Retries       int64 // items sent a second time, after a ring refresh
	Degraded      int64 // items answered by FailurePolicy
	RingRefreshes int64 // Ring RPC rounds after New (for a retry, or on a response with another epoch)
	RingChanges   int64 // rings installed, the first one included
	ItemErrors    int64 // items that failed as the caller's error (*ItemError)
	Duplicates    int64 // items a node answered from its idempotency table (Decision.Duplicate)
	Coalesced     int64 // items of single Checks that shared an RPC with another caller's
}

type counters struct {
	calls, items, rpcs, retries, degraded, ringRefreshes, ringChanges, itemErrors, duplicates, coalesced atomic.Int64
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := &c.st
	return Stats{
		Calls: s.calls.Load(), Items: s.items.Load(), RPCs: s.rpcs.Load(), Retries: s.retries.Load(),
		Degraded: s.degraded.Load(), RingRefreshes: s.ringRefreshes.Load(), RingChanges: s.ringChanges.Load(),
		ItemErrors: s.itemErrors.Load(), Duplicates: s.duplicates.Load(), Coalesced: s.coalesced.Load(),
	}
}
