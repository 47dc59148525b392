package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
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

	// streamWindow and connWindow are the static flow-control windows of
	// the client's connections, bytes, as the nodes' (node.StreamWindow):
	// gRPC's default window estimation sends a PING for nearly every
	// answer of small request-answer traffic. DialOptions may override them.
	streamWindow = 1 << 20
	connWindow   = 4 << 20
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
	// UnaryChecks sends the coalesced single Checks and CheckBatch's
	// requests as unary Check RPCs. false (the default) sends single Checks
	// as requests on one CheckStream per member, and each CheckBatch request
	// on a CheckStream of its own, taken from a pool per member (up to 64
	// idle), which costs the node and the client less per request and
	// waits less; against a node that does not implement CheckStream
	// (UNIMPLEMENTED, an older version) the client sends unary Checks
	// anyway, and tries the stream again a minute later.
	UnaryChecks bool
	// DialOptions are used for every connection to a node. nil means TLS
	// with the TLS field if set, else plaintext; a non-nil list replaces
	// that default, so it must set credentials itself.
	DialOptions []grpc.DialOption
	// TLS, if set, dials every node over TLS with this configuration (its
	// RootCAs verify the nodes; Certificates or GetClientCertificate give a
	// client certificate if the nodes ask for one). nil means plaintext.
	// Set it or DialOptions, not both.
	TLS *tls.Config
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
	switch {
	case c.DialOptions != nil:
	case c.TLS != nil:
		c.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c.TLS))}
	default:
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

// New connects to the cluster: it asks every seed for the ring, takes the
// first answer, and builds the same placement as the nodes (package ring).
// It retries the seeds with backoff until one answers or ctx is done, so give
// ctx a deadline. It fails with ErrEpochMismatch if the ring it builds has
// another epoch than the node's. The Client then follows ring changes on its
// own until Close.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.TLS != nil && cfg.DialOptions != nil {
		return nil, errors.New("client: TLS and DialOptions are both set: set TLS, or credentials in DialOptions")
	}
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

// Stats are the client's counters since New. Each is read atomically; the set
// is not one snapshot.
type Stats struct {
	Calls         int64 // Check and CheckBatch calls
	Items         int64 // items in those calls
	RPCs          int64 // Check RPCs and CheckStream requests sent
	Retries       int64 // items sent again, after a ring refresh (once per retry)
	Degraded      int64 // items answered by FailurePolicy
	RingRefreshes int64 // Ring RPC rounds after New (for a retry, or on a response with another epoch)
	RingChanges   int64 // rings installed, the first one included
	ItemErrors    int64 // items that failed as the caller's error (*ItemError)
	Duplicates    int64 // items a node answered from its idempotency table (Decision.Duplicate)
	Coalesced     int64 // items of single Checks that shared an RPC with another caller's
	Streamed      int64 // requests sent on a CheckStream (counted in RPCs too)
	// ItemErrorsByCode splits ItemErrors by gRPC code name
	// ("InvalidArgument"); codes never seen are absent.
	ItemErrorsByCode map[string]int64
}

type counters struct {
	calls, items, rpcs, retries, degraded, ringRefreshes, ringChanges, itemErrors, duplicates, coalesced, streamed atomic.Int64

	byCode [numCodes]atomic.Int64 // item errors by gRPC code
}

// numCodes is the number of gRPC codes (OK to Unauthenticated).
const numCodes = 17

// itemFailed counts item errors es.
func (s *counters) itemFailed(es ...*ItemError) {
	s.itemErrors.Add(int64(len(es)))
	for _, e := range es {
		code := e.Code
		if int(code) >= numCodes {
			code = codes.Unknown
		}
		s.byCode[code].Add(1)
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	s := &c.st
	st := Stats{
		Calls: s.calls.Load(), Items: s.items.Load(), RPCs: s.rpcs.Load(), Retries: s.retries.Load(),
		Degraded: s.degraded.Load(), RingRefreshes: s.ringRefreshes.Load(), RingChanges: s.ringChanges.Load(),
		ItemErrors: s.itemErrors.Load(), Duplicates: s.duplicates.Load(), Coalesced: s.coalesced.Load(),
		Streamed: s.streamed.Load(), ItemErrorsByCode: map[string]int64{},
	}
	for code := range s.byCode {
		if v := s.byCode[code].Load(); v != 0 {
			st.ItemErrorsByCode[codes.Code(code).String()] = v
		}
	}
	return st
}
