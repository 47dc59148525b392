package gossip

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/freqring/freqring/ring"
	"github.com/hashicorp/memberlist"
)

// Defaults of Config. See the package comment for what the timings give.
const (
	DefaultRejoinInterval      = 10 * time.Second
	DefaultProbeInterval       = 500 * time.Millisecond
	DefaultProbeTimeout        = 250 * time.Millisecond
	DefaultSuspicionMult       = 4
	DefaultGossipInterval      = 200 * time.Millisecond
	DefaultPushPullInterval    = 15 * time.Second
	DefaultTCPTimeout          = 3 * time.Second
	DefaultDeadNodeReclaimTime = 5 * time.Second

	// defaultWait bounds SetState and Leave when their context has no deadline.
	defaultWait = 5 * time.Second
	// joinBackoffMin and joinBackoffMax bound the pause between join attempts in Start.
	joinBackoffMin = 100 * time.Millisecond
	joinBackoffMax = 5 * time.Second
	maxNodeName    = 128
)

var (
	// ErrClosed is returned by calls on a closed Membership.
	ErrClosed = errors.New("gossip: membership closed")
	// ErrLeft is returned by SetState after Leave.
	ErrLeft = errors.New("gossip: membership has left the cluster")
)

// Config configures a Membership. A zero field takes the default named in its
// comment.
type Config struct {
	NodeName      string // unique and stable across restarts (the pod name); "" means os.Hostname(); at most 128 bytes
	BindAddr      string // gossip UDP and TCP listen address; "" means 0.0.0.0; not used with a Transport
	BindPort      int    // gossip port; 0 means a free port chosen by the OS (the usual fixed port is 7946); see Transport
	AdvertiseAddr string // address peers reach this node at; "" means BindAddr, or the first private IP when BindAddr is 0.0.0.0
	AdvertisePort int    // port peers reach this node at; 0 means the bound port (with a Transport, see there)
	GRPCAddr      string // gRPC host:port published to peers and clients; required; at most 255 bytes
	State         State  // state announced at start; 0 means StateJoining

	// Join lists the seeds: "host:port", or a DNS name that resolves to
	// several addresses (every address is tried, so a Kubernetes headless
	// service works); without a port, the node's own BindPort is used. Start
	// retries until it reaches one seed (reaching itself counts). Empty means
	// form a cluster of one and wait for others to join.
	Join []string
	// RejoinInterval is how often the seeds are joined again, to heal a
	// partition or a split start; 0 means 10s, negative disables.
	RejoinInterval time.Duration

	// Keyring, if set, encrypts and authenticates gossip: packets and
	// streams no key opens are dropped (memberlist's GossipVerifyIncoming
	// and GossipVerifyOutgoing). nil means plaintext gossip that anyone who
	// reaches the port can join. Every member needs a key in common.
	Keyring *Keyring

	// Transport carries the gossip packets and streams; nil means
	// memberlist's own UDP and TCP transport, bound to BindAddr:BindPort.
	// With a Transport, BindAddr is not used and BindPort only gives the port
	// of a seed named without one; the node's address (GossipAddr, what
	// peers and seeds name) is what the Transport's FinalAdvertiseAddr
	// returns when given AdvertiseAddr and AdvertisePort as they are (0 is
	// the Transport's to interpret). A memberlist.NodeAwareTransport is also
	// told the name of the member it sends to. Start takes the Transport
	// over: Close shuts it down, and so does a Start that fails. One
	// Transport serves one Membership.
	//
	// For a cluster inside one process, such as a test, give each member a
	// transport of one memberlist.MockNetwork, made by NewTransport(NodeName)
	// (the mock routes by member name first), and name seeds by those
	// transports' addresses ("127.0.0.1:1", "127.0.0.1:2", ...): they are
	// labels that no socket listens on and no DNS name resolves to. The
	// package comment lists the mock's limits.
	Transport memberlist.Transport

	Placement ring.Config // placement parameters of the rings built; must match the whole cluster and its clients
	// Agreement is published with Placement; only the members that publish
	// the agreement most members share are in the ring (see Agreement).
	Agreement Agreement
	Logger    *slog.Logger // nil means discard; memberlist's own lines go to it at Debug ([ERR] and [WARN] at Warn, at most one of a kind every 10 s)

	// Failure detection and dissemination (memberlist's SWIM with Lifeguard).
	// The package comment explains the defaults and the detection time.
	ProbeInterval       time.Duration // time between failure probes of one member; 0 means 500ms
	ProbeTimeout        time.Duration // wait for a direct ack before indirect probes; 0 means 250ms; at most ProbeInterval
	SuspicionMult       int           // suspicion lasts SuspicionMult*max(1, log10(members))*ProbeInterval at least; 0 means 4; [1, 100]
	GossipInterval      time.Duration // time between gossip rounds (to 3 random members); 0 means 200ms
	PushPullInterval    time.Duration // time between full state syncs with a random member; 0 means 15s
	TCPTimeout          time.Duration // timeout of stream connections (join, push-pull, TCP fallback probe); 0 means 3s
	DeadNodeReclaimTime time.Duration // after this long dead, a name may come back from a new address; 0 means 5s, negative never

	// Clock skew (clock.go). MaxClockSkew is how far this member's clock
	// may be from the majority's before it leaves every ring; 0 means
	// 250ms, negative means it is measured but never excluded.
	// ClockInterval is how often the other members' clocks are measured; 0
	// means 1s. Now is this member's wall clock, the one its decisions use;
	// nil means time.Now.
	MaxClockSkew  time.Duration
	ClockInterval time.Duration
	Now           func() time.Time

	// Refuses reports whether a member's gRPC address (host:port) refuses
	// connections: nothing listens there, so its process is gone (see
	// Suspect). nil means a TCP dial of at most 250ms that fails with
	// ECONNREFUSED. A test of in-process members gives its own.
	Refuses func(grpcAddr string) bool
}

func (c Config) withDefaults() (Config, error) {
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return c, fmt.Errorf("gossip: NodeName empty and no hostname: %w", err)
		}
		c.NodeName = h
	}
	if c.BindAddr == "" {
		c.BindAddr = "0.0.0.0"
	}
	if c.State == 0 {
		c.State = StateJoining
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RejoinInterval, DefaultRejoinInterval)
	def(&c.ProbeInterval, DefaultProbeInterval)
	def(&c.ProbeTimeout, DefaultProbeTimeout)
	def(&c.GossipInterval, DefaultGossipInterval)
	def(&c.PushPullInterval, DefaultPushPullInterval)
	def(&c.TCPTimeout, DefaultTCPTimeout)
	def(&c.DeadNodeReclaimTime, DefaultDeadNodeReclaimTime)
	def(&c.MaxClockSkew, DefaultMaxClockSkew)
	def(&c.ClockInterval, DefaultClockInterval)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Refuses == nil {
		c.Refuses = refusesTCP
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = DefaultSuspicionMult
	}
	return c, nil
}

// validate checks a Config with defaults filled in.
func (c Config) validate() error {
	if len(c.NodeName) > maxNodeName {
		return fmt.Errorf("gossip: NodeName %q is %d bytes, max %d", c.NodeName, len(c.NodeName), maxNodeName)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		return fmt.Errorf("gossip: BindPort %d out of range [0, 65535]", c.BindPort)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("gossip: AdvertisePort %d out of range [0, 65535]", c.AdvertisePort)
	}
	if len(c.Agreement.Version) > maxVersion {
		return fmt.Errorf("gossip: Agreement.Version is %d bytes, max %d", len(c.Agreement.Version), maxVersion)
	}
	if len(c.GRPCAddr) > maxGRPCAddr {
		return fmt.Errorf("gossip: GRPCAddr is %d bytes, max %d", len(c.GRPCAddr), maxGRPCAddr)
	}
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("gossip: GRPCAddr %q is not host:port: %w", c.GRPCAddr, err)
	}
	if !c.State.valid() {
		return fmt.Errorf("gossip: State %d out of range [%d, %d]", c.State, StateJoining, StateLeaving)
	}
	for i, s := range c.Join {
		if s == "" {
			return fmt.Errorf("gossip: Join[%d] is empty", i)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ProbeInterval", c.ProbeInterval},
		{"ProbeTimeout", c.ProbeTimeout},
		{"GossipInterval", c.GossipInterval},
		{"PushPullInterval", c.PushPullInterval},
		{"TCPTimeout", c.TCPTimeout},
		{"ClockInterval", c.ClockInterval},
	} {
		if d.v < 0 {
			return fmt.Errorf("gossip: %s %v is negative, want > 0 (or 0 for the default)", d.name, d.v)
		}
	}
	if c.ProbeTimeout > c.ProbeInterval {
		return fmt.Errorf("gossip: ProbeTimeout %v out of range (0, ProbeInterval %v]", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.SuspicionMult < 1 || c.SuspicionMult > 100 {
		return fmt.Errorf("gossip: SuspicionMult %d out of range [1, 100]", c.SuspicionMult)
	}
	if _, err := ring.New(nil, c.Placement); err != nil {
		return fmt.Errorf("gossip: Placement: %w", err)
	}
	return nil
}

// MemberState is one live member as gossip sees it. Members that memberlist
// suspects of failure are still listed (and still in the ring) until they
// are declared dead.
type MemberState struct {
	Name       string
	GRPCAddr   string
	GossipAddr string // host:port of memberlist
	State      State  // 0 if the member's metadata did not decode; then it is not in the ring
	// Boot is a random number chosen by each Start: a member that restarted
	// under the same name has a new one. (memberlist keeps its incarnation
	// numbers private, so this stands in for them.)
	Boot uint64
	// Rules, Protocol and Version are the member's published Agreement;
	// Agreed is false for a binary that publishes none.
	Agreed   bool
	Rules    uint64
	Protocol uint32
	Version  string
	// Excluded says why a serving member is not in the ring because it
	// disagrees with it (see Agreement) or its clock is skewed; ""
	// otherwise.
	Excluded string
	// ClockSkewed is the member's published clock judgment (clock.go):
	// its clock is beyond its MaxClockSkew of the majority's, and it is out
	// of the ring. ClockOffset is its clock minus the majority's when it
	// last changed that judgment (0 before).
	ClockSkewed bool
	ClockOffset time.Duration
}

// Membership tracks the members of the cluster through memberlist and keeps a
// ring of the live ones. It is safe for concurrent use.
//
// The ring counts every member memberlist considers alive or suspect whose
// metadata decodes, except those in StateLeaving. It is rebuilt after every
// join, leave, failure and metadata update.
type Membership struct {
	cfg        Config
	log        *slog.Logger
	ml         *memberlist.Memberlist
	gossipAddr string
	started    time.Time // Start's time, the origin of mono
	clk        clocks

	logw *logWriter // memberlist's log lines go through it

	metaMu sync.Mutex // guards meta, the local metadata
	meta   meta

	nodesMu sync.Mutex // guards nodes
	// nodes mirrors memberlist's live (alive or suspect) members. It is kept
	// from event callbacks, which run under memberlist's lock, because the
	// *Node values that Members() returns are updated in place without it.
	nodes map[string]nodeInfo
	// departed holds the members that vanished (left or failed) while
	// serving or leaving and have not come back since.
	departed map[string]Departure
	// departures counts, per member name, the times it left or failed
	// (Departures); never reset.
	departures map[string]uint64
	// excluded is, for each serving member left out of the ring because it
	// disagrees with it, why; written by rebuild.
	excluded map[string]string
	// conflicts are the members seen under this member's own name at
	// another gossip address, by that address (NameConflicts).
	conflicts map[string]NameConflict
	// down holds the members marked down because they refuse connections
	// (down.go), until memberlist declares them dead or sees a new boot id;
	// looking and lastLook are the looks at members running and done.
	down     map[string]downMark
	looking  map[string]bool
	lastLook map[string]time.Time
	// markedDown counts the marks (Stats.MarkedDown).
	markedDown atomic.Int64

	changedCh chan struct{} // capacity 1; "nodes changed", drained by eventLoop
	done      chan struct{} // closed by Close; stops eventLoop and rejoinLoop
	wg        sync.WaitGroup

	lifeMu sync.RWMutex // guards closed and left; held across memberlist's Leave, UpdateNode and Shutdown
	closed bool
	left   bool

	cur        atomic.Pointer[ring.Ring]
	mu         sync.Mutex // guards watchers and the order of cur updates
	watchers   map[chan *ring.Ring]struct{}
	watchClose bool // watchers closed by Close
}

// nodeInfo is a copy of a memberlist Node, taken under memberlist's lock.
type nodeInfo struct {
	gossipAddr string
	meta       []byte
}

// Start creates the local member, joins the seeds (see Config.Join) and
// returns once it has joined, or, with no seeds, at once. ctx bounds only the
// start: if it ends before any seed answers, Start releases everything and
// returns an error that wraps ctx.Err(). The returned Membership already has a
// Ring.
func Start(ctx context.Context, cfg Config) (*Membership, error) {
	cfg, err := cfg.withDefaults()
	if err == nil {
		err = cfg.validate()
	}
	if err != nil {
		if cfg.Transport != nil {
			_ = cfg.Transport.Shutdown() // Start owns it; memberlist shuts it down on the failures below
		}
		return nil, err
	}
	m := &Membership{
		cfg:  cfg,
		log:  cfg.Logger.With("node", cfg.NodeName),
		logw: &logWriter{log: cfg.Logger.With("node", cfg.NodeName)},
		meta: meta{State: cfg.State, Boot: rand.Uint64(), GRPC: cfg.GRPCAddr, Agreed: true, Version: cfg.Agreement.Version,
			Key:     agreementKey{rules: cfg.Agreement.Rules, protocol: cfg.Agreement.Protocol, placement: effectivePlacement(cfg.Placement)},
			Clocked: true},
		started:    time.Now(),
		clk:        clocks{samples: map[string][]clockSample{}, replies: make(chan clockMsg, 64), measured: make(chan struct{}, 1)},
		nodes:      make(map[string]nodeInfo),
		departed:   make(map[string]Departure),
		departures: make(map[string]uint64),
		conflicts:  make(map[string]NameConflict),
		down:       make(map[string]downMark),
		looking:    make(map[string]bool),
		lastLook:   make(map[string]time.Time),
		changedCh:  make(chan struct{}, 1),
		done:       make(chan struct{}),
		watchers:   make(map[chan *ring.Ring]struct{}),
	}
	m.ml, err = memberlist.Create(m.memberlistConfig())
	if err != nil {
		on := net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort))
		if cfg.Transport != nil {
			on = fmt.Sprintf("a %T", cfg.Transport)
		}
		return nil, fmt.Errorf("gossip: start memberlist on %s: %w", on, err)
	}
	m.gossipAddr = m.ml.LocalNode().Address()
	if len(cfg.Join) > 0 {
		if err := m.joinFirst(ctx); err != nil {
			_ = m.ml.Shutdown()
			return nil, err
		}
	}
	m.rebuild()
	m.wg.Go(m.eventLoop)
	m.wg.Go(m.clockLoop)
	if len(cfg.Join) > 0 && cfg.RejoinInterval > 0 {
		m.wg.Go(m.rejoinLoop)
	}
	m.log.Info("gossip: started", "gossip_addr", m.gossipAddr, "encrypted", cfg.Keyring != nil, "grpc_addr", cfg.GRPCAddr,
		"state", cfg.State, "members", m.Ring().Len(), "epoch", fmt.Sprintf("%016x", m.Ring().Epoch()))
	return m, nil
}

func (m *Membership) memberlistConfig() *memberlist.Config {
	c := m.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.NodeName
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = cmp.Or(c.AdvertisePort, c.BindPort) // memberlist replaces it when BindPort is 0
	if c.Transport != nil {
		mc.AdvertisePort = c.AdvertisePort // the Transport decides what 0 means
	}
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.SuspicionMult = c.SuspicionMult
	mc.GossipInterval = c.GossipInterval
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	mc.DeadNodeReclaimTime = max(c.DeadNodeReclaimTime, 0) // memberlist: 0 means never
	mc.Transport = c.Transport                             // nil: memberlist binds BindAddr:BindPort
	if c.Keyring != nil {
		mc.Keyring = c.Keyring.kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	d := delegate{m}
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Logger = log.New(m.logw, "", 0)
	return mc
}

// joinFirst joins the seeds, retrying with exponential backoff (100ms to 5s,
// jittered) until one answers or ctx ends.
func (m *Membership) joinFirst(ctx context.Context) error {
	wait := joinBackoffMin
	for attempt := 1; ; attempt++ {
		n, err := m.join()
		if n == 0 && err == nil {
			err = errors.New("no seed address answered")
		}
		if n > 0 {
			m.log.Info("gossip: joined", "seeds", m.cfg.Join, "reached", n, "attempt", attempt)
			return nil
		}
		pause := wait/2 + rand.N(wait/2+1)
		m.log.Warn("gossip: join failed, retrying", "seeds", m.cfg.Join, "attempt", attempt, "retry_in", pause, "err", err)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gossip: join %q: %w (last error: %w)", m.cfg.Join, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, joinBackoffMax)
	}
}

// join contacts every address of every seed once and returns how many
// answered. It checks done between seeds, so Close waits for at most one
// TCPTimeout per address of one seed.
func (m *Membership) join() (int, error) {
	var total int
	var errs []error
	for _, seed := range m.cfg.Join {
		select {
		case <-m.done:
			return total, ErrClosed
		default:
		}
		n, err := m.ml.Join([]string{seed})
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if total > 0 {
		return total, nil
	}
	return 0, errors.Join(errs...)
}

// rejoinLoop joins the seeds every RejoinInterval until Close.
func (m *Membership) rejoinLoop() {
	t := time.NewTicker(m.cfg.RejoinInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		}
		m.lifeMu.RLock()
		gone := m.closed || m.left
		m.lifeMu.RUnlock()
		if gone {
			return
		}
		n, err := m.join()
		m.log.Debug("gossip: rejoin", "seeds", m.cfg.Join, "reached", n, "err", err)
	}
}

// eventLoop rebuilds the ring after each batch of membership events until Close.
func (m *Membership) eventLoop() {
	for {
		select {
		case <-m.done:
			return
		case <-m.changedCh:
			m.rebuild()
		}
	}
}

// changed records that nodes changed. It never blocks: events that arrive
// while a rebuild is pending are folded into it.
func (m *Membership) changed() {
	select {
	case m.changedCh <- struct{}{}:
	default:
	}
}

// rebuild builds the ring of the current members and publishes it if its
// epoch differs. Only Start (before eventLoop runs) and eventLoop call it.
func (m *Membership) rebuild() {
	m.nodesMu.Lock()
	cands := make([]candidate, 0, len(m.nodes))
	skewed := map[string]string{}
	for name, n := range m.nodes {
		md, err := decodeMeta(n.meta)
		if err != nil {
			m.log.Warn("gossip: member left out of the ring", "member", name, "gossip_addr", n.gossipAddr, "err", err)
			continue
		}
		if _, down := m.down[name]; down {
			continue // refuses connections: gone (down.go)
		}
		if md.State != StateServing {
			continue // joining: not ready to decide; leaving: handing over
		}
		if md.Skewed {
			skewed[name] = fmt.Sprintf("its clock was %v off the majority's, beyond its max clock skew: it decides nothing until its time sync brings it back",
				md.Offset)
			continue
		}
		cands = append(cands, candidate{name: name, addr: md.GRPC, key: md.Key, legacy: !md.Agreed})
	}
	ms, excluded := chooseRing(cands)
	for name, why := range skewed {
		if excluded == nil {
			excluded = map[string]string{}
		}
		excluded[name] = why
	}
	prevExcluded := m.excluded
	m.excluded = excluded
	m.nodesMu.Unlock()
	m.logExclusions(prevExcluded, excluded)
	r, err := ring.New(ms, m.cfg.Placement)
	if err != nil {
		// Names are unique in memberlist and Placement was validated.
		m.log.Error("gossip: BUG: cannot build ring; keeping the old one", "members", len(ms), "err", err)
		return
	}
	old := m.cur.Load()
	if old != nil && old.Epoch() == r.Epoch() {
		return
	}
	m.mu.Lock()
	m.cur.Store(r)
	for w := range m.watchers {
		sendLatest(w, r)
	}
	m.mu.Unlock()
	if old != nil {
		m.log.Info("gossip: ring changed", "epoch", fmt.Sprintf("%016x", r.Epoch()),
			"prev_epoch", fmt.Sprintf("%016x", old.Epoch()), "members", r.Len(), "prev_members", old.Len())
	}
}

// sendLatest puts r in w, replacing a value the watcher has not taken yet.
// Only rebuild sends, under mu, so the second send cannot block.
func sendLatest(w chan *ring.Ring, r *ring.Ring) {
	select {
	case w <- r:
		return
	default:
	}
	select {
	case <-w:
	default:
	}
	w <- r
}

// Ring returns the current placement. It never returns nil; after Close it
// returns the last ring.
func (m *Membership) Ring() *ring.Ring { return m.cur.Load() }

// Watch returns a channel that holds the newest ring: the current one at
// once, then each ring with a new epoch. A slow reader skips intermediate
// rings but always gets the newest. cancel (idempotent) stops the watch and
// closes the channel; Close closes every channel.
func (m *Membership) Watch() (<-chan *ring.Ring, func()) {
	w := make(chan *ring.Ring, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	w <- m.cur.Load()
	if m.watchClose {
		close(w)
		return w, func() {}
	}
	m.watchers[w] = struct{}{}
	return w, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.watchers[w]; ok {
			delete(m.watchers, w)
			close(w)
		}
	}
}

// Stats are a Membership's counters since Start.
type Stats struct {
	// BadPackets counts gossip packets and streams that did not decode (or
	// decrypt): random bytes on the gossip port, a member with another key.
	// They are one kind of warning: at most one is logged every 10 s.
	BadPackets int64
	// Warnings counts memberlist's warning and error lines ([WARN], [ERR]),
	// the bad packets' among them. At most one line of a kind is logged
	// every 10 s, with the number of that kind left out since the last one;
	// WarningsNotLogged counts the lines left out.
	Warnings, WarningsNotLogged int64
	// MarkedDown counts the members marked down here because their gRPC
	// address refused connections (Suspect), ahead of failure detection.
	MarkedDown int64
}

// Stats returns the counters. Safe for concurrent use.
func (m *Membership) Stats() Stats {
	return Stats{BadPackets: m.logw.badPackets.Load(), Warnings: m.logw.warnings.Load(), WarningsNotLogged: m.logw.notLogged.Load(),
		MarkedDown: m.markedDown.Load()}
}

// Members returns the live members (alive or suspect, and not marked down:
// see Suspect), sorted by name.
func (m *Membership) Members() []MemberState {
	m.nodesMu.Lock()
	out := make([]MemberState, 0, len(m.nodes))
	for name, n := range m.nodes {
		if _, down := m.down[name]; down {
			continue
		}
		s := MemberState{Name: name, GossipAddr: n.gossipAddr}
		if md, err := decodeMeta(n.meta); err == nil {
			s.GRPCAddr, s.State, s.Boot = md.GRPC, md.State, md.Boot
			s.Agreed, s.Rules, s.Protocol, s.Version = md.Agreed, md.Key.rules, md.Key.protocol, md.Version
			s.Excluded = m.excluded[name]
			s.ClockSkewed, s.ClockOffset = md.Skewed, md.Offset
		}
		out = append(out, s)
	}
	m.nodesMu.Unlock()
	slices.SortFunc(out, func(a, b MemberState) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Departures returns how many times member name has left or failed, as this
// member's gossip saw it, since Start: a count that only grows, so that a
// node can tell whether a member was out of its view, however briefly,
// since it last looked (a member that vanished was out of every ring
// built here, and its partitions may have been decided for elsewhere).
// Safe for concurrent use.
func (m *Membership) Departures(name string) uint64 {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	return m.departures[name]
}

// Departure is how and when a member vanished (see Membership.Departed).
type Departure struct {
	At      time.Time // when this member's gossip saw it vanish
	Leaving bool      // it had announced StateLeaving: it left gracefully
}

// Departed returns the members that vanished (left or failed) since Start
// while serving or leaving, and have not come back since. A node counting
// who may still decide (a majority rule) uses it rather than sampling
// Members: its own gossip can see a member serve and vanish, or announce
// leaving and leave, between two samples, as a starved node's can at its
// first join.
func (m *Membership) Departed() map[string]Departure {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	return maps.Clone(m.departed)
}

// Name returns the local node name.
func (m *Membership) Name() string { return m.cfg.NodeName }

// GossipAddr returns the host:port peers reach the local node's memberlist at.
func (m *Membership) GossipAddr() string { return m.gossipAddr }

// SetState announces a new state for the local node and waits until the
// update has been sent to a peer, until ctx ends, or for 5s if ctx has no
// deadline. The local metadata (and the local ring) change at once, even when
// it returns a timeout error; gossip still spreads the update later.
func (m *Membership) SetState(ctx context.Context, s State) error {
	if !s.valid() {
		return fmt.Errorf("gossip: state %d out of range [%d, %d]", s, StateJoining, StateLeaving)
	}
	return m.update(ctx, "state "+s.String(), func(md *meta) {
		m.log.Info("gossip: state", "state", s, "prev", md.State)
		md.State = s
	})
}

// SetAgreement announces a new Agreement for the local node (after its
// rules were reloaded), as SetState announces a state: the local metadata
// and ring change at once, and it waits as SetState does. Placement stays.
func (m *Membership) SetAgreement(ctx context.Context, a Agreement) error {
	if len(a.Version) > maxVersion {
		return fmt.Errorf("gossip: Agreement.Version is %d bytes, max %d", len(a.Version), maxVersion)
	}
	return m.update(ctx, "agreement", func(md *meta) {
		m.log.Info("gossip: agreement", "rules", fmt.Sprintf("%016x", a.Rules), "prev_rules", fmt.Sprintf("%016x", md.Key.rules), "protocol", a.Protocol)
		md.Key.rules, md.Key.protocol, md.Version = a.Rules, a.Protocol, a.Version
	})
}

// update changes the local metadata with fn and announces it; what names
// the change in errors.
func (m *Membership) update(ctx context.Context, what string, fn func(*meta)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	switch {
	case m.closed:
		return ErrClosed
	case m.left:
		return ErrLeft
	}
	m.metaMu.Lock()
	fn(&m.meta)
	m.metaMu.Unlock()
	if err := m.ml.UpdateNode(waitFor(ctx)); err != nil {
		return fmt.Errorf("gossip: announce %s: %w", what, err)
	}
	return nil
}

// Leave announces that the local node leaves the cluster and waits until the
// announcement has been sent to a peer, until ctx ends, or for 5s if ctx has
// no deadline. Peers drop the node from their rings at once instead of after
// failure detection. The node keeps gossiping until Close. Calling Leave
// again does nothing.
func (m *Membership) Leave(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.closed {
		return ErrClosed // memberlist panics on Leave after Shutdown
	}
	m.left = true
	err := m.ml.Leave(waitFor(ctx))
	m.log.Info("gossip: left", "err", err)
	if err != nil {
		return fmt.Errorf("gossip: leave: %w", err)
	}
	return nil
}

// Close stops memberlist at once, without a leave message (call Leave first
// for a graceful exit; without it peers see a failure), stops the event and
// rejoin loops and waits for them, and closes every Watch channel. It may
// wait up to TCPTimeout for a join in flight. Calling Close again does
// nothing.
func (m *Membership) Close() error {
	m.lifeMu.Lock()
	if m.closed {
		m.lifeMu.Unlock()
		return nil
	}
	m.closed = true
	err := m.ml.Shutdown()
	m.lifeMu.Unlock()
	close(m.done)
	m.wg.Wait()
	m.mu.Lock()
	for w := range m.watchers {
		close(w)
	}
	m.watchers = nil
	m.watchClose = true
	m.mu.Unlock()
	m.log.Info("gossip: closed")
	if err != nil {
		return fmt.Errorf("gossip: shutdown: %w", err)
	}
	return nil
}

// waitFor turns ctx into the timeout memberlist's blocking calls take.
func waitFor(ctx context.Context) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return defaultWait
	}
	return max(time.Until(d), time.Millisecond) // memberlist waits forever on 0
}

// delegate implements memberlist's Delegate, EventDelegate and
// ConflictDelegate. memberlist calls the event methods with its node lock
// held, so they only copy, log and signal.
type delegate struct{ m *Membership }

func (d delegate) NodeMeta(limit int) []byte {
	d.m.metaMu.Lock()
	b := d.m.meta.append(nil)
	d.m.metaMu.Unlock()
	if len(b) > limit {
		panic(fmt.Sprintf("BUG: gossip metadata is %d bytes, limit %d", len(b), limit))
	}
	return b
}

func (d delegate) NotifyMsg(b []byte) {
	if len(b) > 0 && b[0] == msgDown {
		d.m.downMessage(b)
		return
	}
	d.m.clockMessage(b)
}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

func (d delegate) NotifyJoin(n *memberlist.Node) {
	info := d.put(n)
	md, err := decodeMeta(info.meta)
	d.m.log.Info("gossip: member joined", "member", n.Name, "gossip_addr", info.gossipAddr,
		"grpc_addr", md.GRPC, "state", md.State, "meta_err", err)
}

func (d delegate) NotifyUpdate(n *memberlist.Node) {
	info := d.put(n)
	md, err := decodeMeta(info.meta)
	d.m.log.Info("gossip: member updated", "member", n.Name, "gossip_addr", info.gossipAddr,
		"grpc_addr", md.GRPC, "state", md.State, "meta_err", err)
}

func (d delegate) NotifyLeave(n *memberlist.Node) {
	d.m.nodesMu.Lock()
	if md, err := decodeMeta(d.m.nodes[n.Name].meta); err == nil && (md.State == StateServing || md.State == StateLeaving) {
		d.m.departed[n.Name] = Departure{At: time.Now(), Leaving: md.State == StateLeaving}
	}
	delete(d.m.nodes, n.Name)
	delete(d.m.down, n.Name) // a departure as any other now
	d.m.departures[n.Name]++
	d.m.nodesMu.Unlock()
	d.m.changed()
	// memberlist does not say whether it left or failed (Node.State is not set).
	d.m.log.Info("gossip: member left or failed", "member", n.Name, "gossip_addr", n.Address())
}

func (d delegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name == d.m.cfg.NodeName {
		md, _ := decodeMeta(other.Meta)
		d.m.nodesMu.Lock()
		d.m.conflicts[other.Address()] = NameConflict{GossipAddr: other.Address(), GRPCAddr: md.GRPC}
		d.m.nodesMu.Unlock()
		d.m.log.Error("gossip: another member uses this member's name: unless it is a former run of this one that others have not yet seen go, give each member a unique name",
			"name", existing.Name, "this_addr", existing.Address(), "other_addr", other.Address(), "other_grpc_addr", md.GRPC)
		return
	}
	d.m.log.Warn("gossip: name conflict; the newcomer is ignored until the old member is dead for DeadNodeReclaimTime",
		"member", existing.Name, "existing_addr", existing.Address(), "new_addr", other.Address(),
		"reclaim_time", d.m.cfg.DeadNodeReclaimTime)
}

// metaBoot returns the boot id of metadata b, 0 if it does not decode.
func metaBoot(b []byte) uint64 {
	md, err := decodeMeta(b)
	if err != nil {
		return 0
	}
	return md.Boot
}

// NameConflict is a member seen under this member's own name at another
// gossip address: another process with the same name, or a former run of
// this one (restarted at another address) that the others have not yet seen
// go.
type NameConflict struct {
	GossipAddr string // its gossip host:port
	GRPCAddr   string // its gRPC host:port, from its metadata ("" if it had none)
}

// NameConflicts returns the members seen under this member's own name at
// another address since Start, in no order. A member that sees one while it
// starts should find out whether it still answers (at GRPCAddr) and, if so,
// refuse to go on: two members with one name split the ring (memberlist
// ignores the newcomer, which then owns everything alone).
func (m *Membership) NameConflicts() []NameConflict {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	out := make([]NameConflict, 0, len(m.conflicts))
	for _, c := range m.conflicts {
		out = append(out, c)
	}
	return out
}

func (d delegate) put(n *memberlist.Node) nodeInfo {
	info := nodeInfo{gossipAddr: n.Address(), meta: bytes.Clone(n.Meta)}
	d.m.nodesMu.Lock()
	d.m.nodes[n.Name] = info
	if mark, down := d.m.down[n.Name]; !down || metaBoot(info.meta) != mark.boot {
		delete(d.m.down, n.Name) // back under a new boot id: it restarted
		delete(d.m.departed, n.Name)
	}
	d.m.nodesMu.Unlock()
	d.m.changed()
	return info
}
