package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/usage"
	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// Limits of one Check request.
const (
	MaxBatch          = 10_000   // items per request
	MaxRecipientBytes = 256      // bytes per recipient
	MaxContentBytes   = 64 << 10 // bytes per content: the default of Limits.MaxContentBytes
	MaxRequestBytes   = 16 << 20 // bytes per request message: the default of Limits.MaxRequestBytes
)

// DefaultDomain is the domain of an item that names none.
const DefaultDomain = "default"

// Clock returns the current time in unix nanoseconds. It is the only clock a
// node reads to decide.
type Clock interface{ Now() int64 }

type systemClock struct{}

func (systemClock) Now() int64 { return time.Now().UnixNano() }

// Config configures a Node. A zero field takes the default named in its
// comment.
type Config struct {
	Rules         *rules.Set    // nil means the embedded default rules (rules.Default)
	SweepInterval time.Duration // how often idle records are reclaimed and sparse slab chunks given back; 0 means 1 minute, negative disables
	Clock         Clock         // nil means the system clock
	// NewTicker starts the ticker of a background loop that polls (the
	// sweep, snapshots and WAL recovery, the mover's look at who is
	// present, a drain's wait) and returns its channel and its stop
	// function; nil means time.NewTicker. Tests inject their own.
	NewTicker func(d time.Duration) (<-chan time.Time, func())
	Logger    *slog.Logger // nil means discard

	// DataDir holds the write-ahead log and snapshots. Empty means memory
	// only: a restart forgets every send.
	DataDir string
	// Sync is the WAL's fsync policy (see package wal); the zero value,
	// wal.SyncBatch, fsyncs every group commit before replying.
	Sync wal.SyncPolicy
	// SyncInterval is the fsync period under wal.SyncInterval; 0 means 10ms.
	SyncInterval time.Duration
	// GroupWait is how long a WAL group commit gathers appends while other
	// Checks are in flight (wal.Options.GroupWait); 0 means 1ms, negative
	// never waits. A lone Check never waits.
	GroupWait time.Duration
	// PlainFsync makes the WAL fsync with fsync(2) on the calling goroutine
	// instead of through an io_uring where the kernel allows one
	// (wal.Options.PlainFsync).
	PlainFsync bool
	// HeapSlabs keeps the store's records on the Go heap instead of memory
	// it maps outside it for transparent huge pages
	// (store.Config.HeapSlabs).
	HeapSlabs bool
	// SegmentBytes is the WAL segment size; 0 means 64 MiB.
	SegmentBytes int64
	// SnapshotInterval is the longest time between snapshots; 0 means 1
	// minute, negative means only on shutdown and by SnapshotWALBytes.
	SnapshotInterval time.Duration
	// SnapshotWALBytes takes a snapshot once the WAL has grown this much
	// since the last one; 0 means 64 MiB, negative disables. With
	// SnapshotInterval it bounds the WAL a restart replays. Neither starts a
	// snapshot sooner than 10 times the last one's duration after it began,
	// so that snapshots of a large store take at most a tenth of the time.
	SnapshotWALBytes int64
	// SnapshotWALRatio caps the bytes snapshots write at this many times
	// the WAL's own: a snapshot waits, whatever SnapshotInterval and
	// SnapshotWALBytes say, until the WAL has grown by the last snapshot's
	// size divided by it. A store of 100M recipients (a 12.7 GB snapshot)
	// at 35,000 sends/s then takes one about every hour instead of every few
	// minutes, and a crash restart replays up to that hour of WAL. 0 means
	// 3, negative means no cap.
	SnapshotWALRatio float64
	// RetentionMargin is kept beyond the longest rule window before WAL
	// segments are deleted; 0 means 10 minutes.
	RetentionMargin time.Duration
	// SkipCorrupt starts past damaged WAL records, skipping only the damaged
	// bytes, or from the WAL alone when no snapshot is intact, logging what
	// it skips, instead of refusing to start. A damaged snapshot with an
	// intact one before it needs no override: Open falls back on its own.
	SkipCorrupt bool
	// DropRemovedDomains lets Open drop, for good, the recovered history of
	// domains the rules lack; false means Open refuses to start with
	// ErrRemovedDomains naming them (see removed.go for why).
	DropRemovedDomains bool

	// Name is the node's name in the ring, unique and stable across restarts
	// (the pod name); "" means the host name.
	Name string
	// AdvertiseAddr is the gRPC host:port clients and peers reach this node
	// at; "" means the address Serve listens on.
	AdvertiseAddr string
	// Cluster, when set, joins a gossip membership (its NodeName, GRPCAddr
	// and Placement fields are taken from Name, AdvertiseAddr and Placement).
	// nil means a cluster of this node alone.
	Cluster *gossip.Config
	// Placement is the ring's placement; every node and client of a cluster
	// must use the same. The zero value means package ring's defaults. The
	// store has one lock per partition (Placement.PartitionCount).
	Placement ring.Config
	// Peers reaches other nodes; nil means gRPC in plaintext (GRPCPeers()).
	// Peers over TLS are GRPCPeers(grpc.WithTransportCredentials(...)). In-process
	// clusters pass a LocalNetwork's peers.
	Peers Peers
	// Replication says whether an admitted send is on its partition's
	// backup before the reply; the zero value is ReplicationSync.
	Replication Replication
	// AsyncBound is, with ReplicationAsync or for a domain of
	// rules.DurabilityAsync, the most sends of one partition that may be
	// admitted and not yet on its backup; 0 means 64.
	AsyncBound int
	// Durability is that of the domains whose rules name none
	// (rules.Set.Durability): what their admitted sends reach before the
	// answer goes out. The zero value means rules.DurabilityReplicated
	// (rules.DurabilityFsync for sends with no backup: a node alone, or
	// ReplicationOff). Sync
	// and Replication can only lower it: under wal.SyncInterval or
	// SyncNone no answer waits for an fsync, under ReplicationAsync none
	// waits for a backup beyond AsyncBound, and under ReplicationOff there
	// is no backup (docs/durability.md).
	Durability rules.Durability
	// ForgetDeadAfter is how long a member that vanished without leaving
	// still counts toward the cluster's size, of which a node needs a
	// majority in its ring to decide; 0 means 1 minute. A network partition
	// longer than this lets both sides decide (each then admits up to the
	// limits on its own until the partition heals and they merge).
	ForgetDeadAfter time.Duration

	// Limits bound requests, connections and ring watchers.
	Limits Limits

	// ShutdownGrace bounds, once Serve's context is done, the hand-over of
	// partitions (half of it) and then the wait for in-flight calls, before
	// Serve cuts them off; 0 means ShutdownGrace (10s). Serve returns as
	// soon as the calls are done: ring watchers are ended first.
	ShutdownGrace time.Duration

	// IdempotencyWindow is how long the request id of a recorded item is
	// remembered, so that a retry is not recorded twice; 0 means 1 minute.
	IdempotencyWindow time.Duration
	// IdempotencyCapacity bounds the ids remembered per domain (at most 42
	// bytes of memory per id of capacity); 0 means 1,048,576. Under a load
	// of more than capacity/window recorded ids a second, the oldest are
	// forgotten sooner, and at least the newest half of capacity are kept.
	IdempotencyCapacity int

	// MaxMemory is the process's memory budget in bytes, which its resident
	// set stays within (see Memory in the package doc): the store may hold
	// StoreBudget(MaxMemory), past which an item that would create a record
	// (a new recipient) or grow one (a known recipient's record that needs a
	// larger slot) fails with RESOURCE_EXHAUSTED (counted, logged at most
	// once a second), while denials, peeks and sends that fit a record's
	// slot are decided as always; Limiter calls decide at most an eighth of
	// it in items at once, at 1 KiB an item, the others waiting their turn
	// (inflightItems); snapshots use direct I/O chunks sized to it
	// (snapshotChunk). 0 means no limit; otherwise at least MinMaxMemory.
	// The node does not set the Go runtime's memory limit (a process-wide
	// setting): its caller does (cmd/freqring keeps it at GoMemoryLimit of
	// MaxMemory and the memory outside the Go runtime).
	MaxMemory int64
	// storeMaxBytes, if nonzero, replaces StoreBudget(MaxMemory) as the
	// store's limit: tests reach a limit without filling 96 MiB.
	storeMaxBytes int64

	// TLS, if set, is the gRPC listener's TLS configuration (its
	// certificate, and ClientAuth and ClientCAs for client certificates);
	// nil means plaintext. The caller owns it (it may reload certificates
	// through GetConfigForClient); the node never reads files.
	TLS *tls.Config
	// PeerMTLS makes the Peer service (Forward, Acquire, Release,
	// Replicate, Fill) answer UNAUTHENTICATED to a caller without a client
	// certificate verified against TLS.ClientCAs. It needs TLS with
	// ClientAuth at least tls.VerifyClientCertIfGiven.
	PeerMTLS bool
	// StatsZone is the time zone whose calendar days usage statistics are
	// kept in besides UTC's (see package usage); nil or UTC means UTC only.
	StatsZone *time.Location
	// StatsDays is how many calendar days of usage statistics each zone
	// keeps, today included; 0 means 35. Older days are dropped whole.
	StatsDays int
	// Observer, if set, receives the node's timings (Check latency and
	// items per call, WAL fsyncs, snapshots, recovery); see Observer for
	// its concurrency contract. nil means none.
	Observer Observer

	// PeerName, with PeerMTLS, is a DNS name the Peer service also wants in
	// the client certificate (its SANs), so that a client whose certificate
	// the same CA signed is not taken for a peer; "" means any verified
	// certificate.
	PeerName string
	// PeerKeys are the keys the cluster's members share (the gossip keys:
	// cmd/freqring reads one file for both). The node signs every call it
	// makes to a peer with the first (when Peers is nil; else Peers must
	// carry PeerCallCredentials) and takes a Peer call signed under any of
	// them, naming its caller (security.go). nil means calls are not
	// signed.
	PeerKeys Keys
	// InsecurePeers lets anyone who reaches the listener call the Peer
	// service. A cluster member (Cluster set) needs PeerKeys, PeerMTLS or
	// this; use it only on a network where nobody else can reach the
	// listener, or while a cluster moves to PeerKeys (members sign their
	// calls, and take unsigned ones too, until every one has the keys).
	InsecurePeers bool
	// AdminTokens are the bearer tokens an operator's Admin.SetOverride and
	// DeleteOverride must carry (or, under PeerMTLS, a verified client
	// certificate). nil means none: such calls are refused unless
	// InsecureAdmin.
	AdminTokens Keys
	// InsecureAdmin lets anyone who reaches the listener change overrides.
	InsecureAdmin bool

	// Services register further gRPC services for the node on the server
	// NewGRPCServer returns, beside the node's own: the Envoy rate limit
	// service of package gateway, which node does not import. Each is
	// called once per server, with the node.
	Services []func(grpc.ServiceRegistrar, *Node)
}

func (c *Config) fill() {
	if c.Rules == nil {
		c.Rules = rules.Default()
	}
	if c.Placement.PartitionCount == 0 {
		c.Placement.PartitionCount = ring.DefaultPartitionCount
	}
	if c.Placement.ReplicationFactor == 0 {
		c.Placement.ReplicationFactor = ring.DefaultReplicationFactor
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = time.Minute
	}
	if c.SnapshotWALRatio == 0 {
		c.SnapshotWALRatio = 3
	}
	if c.SnapshotWALBytes == 0 {
		c.SnapshotWALBytes = 64 << 20
	}
	if c.RetentionMargin == 0 {
		c.RetentionMargin = 10 * time.Minute
	}
	if c.NewTicker == nil {
		c.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	if c.AsyncBound == 0 {
		c.AsyncBound = 64
	}
	if c.Durability == rules.DurabilityDefault {
		c.Durability = rules.DurabilityReplicated
	}
	c.Limits.fill()
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = ShutdownGrace
	}
	if c.ForgetDeadAfter == 0 {
		c.ForgetDeadAfter = time.Minute
	}
	if c.IdempotencyWindow == 0 {
		c.IdempotencyWindow = time.Minute
	}
	if c.IdempotencyCapacity == 0 {
		c.IdempotencyCapacity = 1 << 20
	}
}

func (c *Config) validate() error {
	if _, err := ring.New(nil, c.Placement); err != nil {
		return fmt.Errorf("node: Placement: %w", err)
	}
	if err := c.Limits.validate(); err != nil {
		return err
	}
	if c.IdempotencyWindow < 0 {
		return fmt.Errorf("node: IdempotencyWindow %v is negative", c.IdempotencyWindow)
	}
	if c.Replication > ReplicationAsync {
		return fmt.Errorf("node: Replication %d is not one of sync (0), off (1), async (2)", c.Replication)
	}
	if c.AsyncBound < 1 || c.AsyncBound > 1<<20 {
		return fmt.Errorf("node: AsyncBound %d out of range [1, %d]", c.AsyncBound, 1<<20)
	}
	if c.Durability > rules.DurabilityAsync {
		return fmt.Errorf("node: Durability %d is not one of fsync (1), replicated (2), async (3)", c.Durability)
	}
	if unroutable(c.AdvertiseAddr) {
		return fmt.Errorf("node: AdvertiseAddr %q is a wildcard no client or peer can dial: give this host's address (--advertise HOST:PORT), or none to advertise its routable address", c.AdvertiseAddr)
	}
	if c.Cluster != nil && c.PeerKeys == nil && !c.PeerMTLS && !c.InsecurePeers {
		return fmt.Errorf("node: %w", ErrNoPeerAuth)
	}
	if c.PeerKeys != nil && len(c.PeerKeys.Keys()) == 0 {
		return errors.New("node: PeerKeys holds no key")
	}
	if c.PeerMTLS && (c.TLS == nil || c.TLS.ClientAuth < tls.VerifyClientCertIfGiven) {
		return fmt.Errorf("node: PeerMTLS needs TLS with ClientAuth at least VerifyClientCertIfGiven (have TLS %v)", c.TLS != nil)
	}
	if c.IdempotencyCapacity < 0 {
		return fmt.Errorf("node: IdempotencyCapacity %d is negative", c.IdempotencyCapacity)
	}
	if c.StatsDays < 0 || c.StatsDays > usage.MaxDays {
		return fmt.Errorf("node: StatsDays %d out of range [1, %d]; 0 means %d", c.StatsDays, usage.MaxDays, usage.DefaultDays)
	}
	if c.MaxMemory != 0 && c.MaxMemory < MinMaxMemory {
		return fmt.Errorf("node: MaxMemory %d bytes is below %d (128 MiB); 0 means no limit", c.MaxMemory, MinMaxMemory)
	}
	return nil
}

// ErrNoPeerAuth is New's error for a cluster member whose Peer service
// would take calls from anyone: Config.PeerKeys, PeerMTLS or InsecurePeers
// must say who its peers are.
var ErrNoPeerAuth = errors.New("a cluster member needs peer authentication: cluster keys (--cluster-keys FILE: `head -c 32 /dev/urandom | base64 > FILE`, the same file on every member), or peer certificates (--tls-cert, --tls-key, --tls-ca); --insecure-peers runs without, for a network nobody else can reach")

// Node decides checks against its rules over in-memory records. It is safe
// for concurrent use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	view  atomic.Pointer[view] // the rules in force and their bindings to the store

	ready       atomic.Bool   // Check decides; false until Open has recovered, and after Close
	stopping    chan struct{} // closed when Serve starts to shut down: ring watchers end
	stopOnce    sync.Once
	watchers    atomic.Int64 // WatchRing calls in progress
	opened      bool
	dur         *durable // nil without a DataDir
	recovery    RecoveryStats
	stopLoops   context.CancelFunc
	loops       sync.WaitGroup // background loops started by Open
	encoders    sync.Pool      // *walEncoder
	replicaSets sync.Pool      // *replicaSet (replica.go)

	clus  atomic.Pointer[cluster] // set by Open; RPCs may read it before
	peers Peers
	guard *guard // who may call the Peer and Admin services (security.go)
	// flight tracks the calls between their store changes and the end of
	// their WAL append; takenBack counts the calls whose failed append
	// made them take their sends back; walLogs throttles those failures'
	// log lines (durable.go).
	flight    walFlight
	takenBack atomic.Int64
	walLogs   throttle
	// snapshotFailures counts the snapshots that failed or were not tried
	// for lack of room.
	snapshotFailures atomic.Int64
	// servingKick wakes Serve's health loop when Serving may have changed
	// (the WAL failed or recovered).
	servingKick chan struct{}
	ho          *handoff
	// moverCtx is cancelled by Close: it ends partition moves in progress.
	moverCtx  context.Context
	stopMover context.CancelFunc

	replicated, replicationFailures atomic.Int64
	withdrawn                       atomic.Int64 // sends taken back because they did not stand (withdraw)
	lateRequests                    atomic.Int64 // Check, Forward and Replicate calls refused as read past their caller's deadline
	reopenedFailures                atomic.Int64 // items failed because their partition was acquired again while they were decided (failReopened)
	staleRefusals, reacquired       atomic.Int64 // rule 8: Replicate calls refused as a backup; partitions closed to acquire again as an owner
	replCalls, replUnaryCalls       atomic.Int64
	unacked                         []atomic.Int64         // per partition: sends admitted, not yet on the backup (async)
	replMu                          sync.Mutex             // guards replicators
	replicators                     map[string]*replicator // by backup name
	started                         time.Time

	checks, admitted, denied, failed, snapshots atomic.Int64
	forwardedOut, forwardedIn                   atomic.Int64
	admin                                       adminOverrides // the admin override layer of the view (overrides.go)
	memLog                                      throttle       // refusals at the memory limit: a line a second
	gate                                        *itemGate      // items Limiter calls decide at once; nil: no bound (memlimit.go)
	// usage counts decided items per day and domain (usage.go); saved in
	// DataDir at each snapshot and on Close.
	usage *usage.Tracker
	// shuttingDown is set when Serve begins to shut down: Serving reports
	// false from then on, while in-flight calls finish.
	shuttingDown atomic.Bool
	// decisions are the counters by domain, rule and result; bind points
	// each view's domains at theirs, so that they outlive the view.
	decisions decisionCounters

	reloadMu sync.Mutex // serialises Reload; Open holds it
	// reloads, reloadFailures and refunds back Stats.Reloads,
	// Stats.ReloadFailures and Stats.Refunds.
	reloads, reloadFailures, refunds atomic.Int64
	explains                         atomic.Int64 // Stats.Explains
	lastReload                       atomic.Pointer[lastReload]
}

// view is a rule set bound to the node's store: what a Check reads, through
// one atomic pointer, so that a reload swaps rules without moving records.
// It is immutable.
type view struct {
	rules   *rules.Set
	domains map[string]*domainView
	names   []string // sorted
	longest int64    // longest window of any domain, ms
	// maxContent is Config.Limits.MaxContentBytes.
	maxContent int
}

// domainView is one domain's rules, records, API description and counters.
type domainView struct {
	d     *window.Domain
	ref   store.Ref
	proto *pb.Domain // shared by every response; never modified
	// counters and rules (one per rule, in rule order) are the domain's
	// decision counters in Node.decisions, kept across reloads by name.
	counters *domainCounters
	rules    []*ruleCounter
	// ruleNames are the rule names in domain order, for usage statistics.
	ruleNames []string

	// over finds a key's override; nil when the domain has none (the hot
	// path's one nil check). variants[i] decides the keys of
	// over.Overrides[i]: its rules with the override's limits, over the
	// same records (the same name), sharing proto and counters.
	over     *rules.Binding
	variants []*domainView
	exempt   bool   // a variant of an exempt override: its keys are admitted unchecked, still recorded
	override string // the variant's override name; "" for the domain itself
	// durability is what the domain's recorded sends reach before their
	// answer: the rules', or Config.Durability.
	durability rules.Durability
}

// forKey returns the view that decides recipient rcp: its override's
// variant, or dv.
func (dv *domainView) forKey(rcp string) *domainView {
	if dv.over == nil {
		return dv
	}
	if i := dv.over.Lookup(rcp); i >= 0 {
		return dv.variants[i]
	}
	return dv
}

// newStore returns an empty store configured by cfg: New's, and the one
// resetStore starts over with.
func newStore(cfg *Config) (*store.Store, error) {
	return store.New(store.Config{Partitions: cfg.Placement.PartitionCount,
		IDHorizon: cfg.IdempotencyWindow, IDCapacity: cfg.IdempotencyCapacity,
		MaxBytes: cmp.Or(cfg.storeMaxBytes, StoreBudget(cfg.MaxMemory)), HeapSlabs: cfg.HeapSlabs})
}

// New returns a node serving cfg.Rules.
func New(cfg Config) (*Node, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := newStore(&cfg)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	tr, err := usage.New(usage.Config{Zone: cfg.StatsZone, Days: cfg.StatsDays})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), store: st, peers: cfg.Peers, started: time.Now(),
		stopping: make(chan struct{}), usage: tr, servingKick: make(chan struct{}, 1), gate: newItemGate(inflightItems(cfg.MaxMemory))}
	if n.peers == nil {
		var opts []grpc.DialOption
		if cfg.PeerKeys != nil {
			opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(PeerCallCredentials(cfg.Name, cfg.PeerKeys)))
		}
		n.peers = GRPCPeers(opts...)
	}
	n.guard = newGuard(&n.cfg, n.log)
	n.ho = newHandoff(st.Partitions())
	n.replicators = map[string]*replicator{}
	n.unacked = make([]atomic.Int64, st.Partitions())
	n.moverCtx, n.stopMover = context.WithCancel(context.Background())
	n.view.Store(n.bind(cfg.Rules))
	return n, nil
}

// bind binds a rule set to the node's store.
func (n *Node) bind(rs *rules.Set) *view {
	v := &view{rules: rs, domains: map[string]*domainView{}, names: rs.Names(), maxContent: n.cfg.Limits.MaxContentBytes}
	overrides := n.overridesFor(rs)
	for _, name := range v.names {
		d := rs.Domain(name)
		b, err := rules.Bind(d, overrides)
		if err != nil {
			// Validated overrides bind; this is a bug, not bad input.
			n.log.Error("BUG: overrides of a domain did not bind: serving it without them", "domain", name, "err", err)
			b = &rules.Binding{Base: d}
		}
		ruleNames := make([]string, d.NumRules())
		for i, r := range d.Rules() {
			ruleNames[i] = r.Name
		}
		dc, rcs := n.decisions.domain(name, ruleNames)
		dur := cmp.Or(rs.Durability(name), n.cfg.Durability)
		dv := &domainView{d: b.Base, ref: n.store.Bind(b.Base), proto: domainProto(d), counters: dc, rules: rcs, ruleNames: ruleNames, durability: dur}
		if len(b.Overrides) > 0 {
			dv.over = b
			for _, o := range b.Overrides {
				dv.variants = append(dv.variants, &domainView{d: o.Domain, ref: n.store.Bind(o.Domain), proto: dv.proto, counters: dc, rules: rcs,
					ruleNames: ruleNames, exempt: o.Exempt, override: o.Name, durability: dur})
			}
		}
		v.domains[name] = dv
		v.longest = max(v.longest, d.Longest())
	}
	return v
}

// bindName resolves a domain name for store.MergeImage.
func (v *view) bindName(name string) (store.Ref, bool) {
	if dv := v.domains[name]; dv != nil {
		return dv.ref, true
	}
	return store.Ref{}, false
}

func domainProto(d *window.Domain) *pb.Domain {
	p := &pb.Domain{Name: d.Name()}
	for _, r := range d.Rules() {
		p.Rules = append(p.Rules, &pb.Rule{
			Name: r.Name, Scope: r.Scope.String(), Limit: uint32(r.Limit),
			WindowMs: r.Nominal().Milliseconds(), Window: r.Nominal().String(), Shadow: r.Shadow,
		})
	}
	return p
}

// KeyOf returns the 64-bit key hash (xxhash64) of a recipient, which places it
// on the ring and in the store, and its 16-bit tag (CRC-32C), which tells
// apart two recipients whose key hashes collide.
func KeyOf(recipient string) (key uint64, tag uint16) {
	key = xxhash.Sum64String(recipient)
	tag = uint16(crc32.Checksum(unsafe.Slice(unsafe.StringData(recipient), len(recipient)), wal.Castagnoli))
	return key, tag
}

// ContentHash returns the 64-bit hash of a message content (xxhash64), never
// 0 (which means "no content").
func ContentHash(content []byte) uint64 {
	if len(content) == 0 {
		return 0
	}
	return max(xxhash.Sum64(content), 1)
}

// Rules answers the Rules RPC.
func (n *Node) Rules(context.Context, *pb.RulesRequest) (*pb.RulesResponse, error) {
	v := n.view.Load()
	resp := &pb.RulesResponse{}
	for _, name := range v.names {
		resp.Domains = append(resp.Domains, v.domains[name].proto)
	}
	return resp, nil
}

// Stats are a node's counters at one moment.
type Stats struct {
	Checks, Admitted, Denied, Failed int64 // items decided here since start
	ForwardedOut, ForwardedIn        int64 // items sent to their owners; items peers sent here
	Snapshots                        int64 // snapshots written since start
	SnapshotFailures                 int64 // snapshots that failed, or were not tried for lack of disk space, since start
	// WALFailed reports that the WAL has failed (a write or fsync error):
	// the node records nothing, and Serving is false, until it recovers.
	WALFailed bool
	// FailedByCode counts, by gRPC code name ("Unavailable"), the items this
	// node answered with an error: those failed here (Failed) and those
	// whose owner did not answer a forward. Codes never seen are absent.
	FailedByCode map[string]int64
	// Duplicates counts the items answered from the idempotency table (a
	// retried request id): not recorded again.
	Duplicates int64
	// Reloads and ReloadFailures count rules reloads applied and refused;
	// Refunds counts sends returned by request id.
	Reloads, ReloadFailures, Refunds int64
	// Explains counts the recipient lookups (Explain) callers made through
	// this node; each is logged with its caller.
	Explains   int64
	WAL        wal.Stats
	Gossip     gossip.Stats // zero without Config.Cluster
	Domains    []DomainStats
	Partitions []int64 // records per ring partition, all domains
	Open       []bool  // per ring partition: open here (this node decides for it)
	// Memory is the store's heap account: bytes held, its limit
	// (StoreBudget(Config.MaxMemory)), items refused at it (each a
	// RESOURCE_EXHAUSTED item error, also counted in Failed): for new
	// recipients and, RefusedGrowth of them, for known ones whose record
	// would have grown; and records replay, backups and merges created or
	// grew past it.
	Memory store.MemoryStats
	// GateWaits counts the Limiter calls that waited for their turn to
	// decide: with Config.MaxMemory, the items decided at once are bounded
	// (memlimit.go, itemGate).
	GateWaits int64
	// Serving is Serving().
	Serving bool
	// Ring is this node's view of the ring; zero before Open.
	Ring RingStats
	// ReplicatedSends and ReplicationFailures count sends acknowledged by
	// their partition's backup and sends the backup did not confirm;
	// ReplicationLag is the sends admitted and not yet on a backup (async).
	ReplicatedSends, ReplicationFailures, ReplicationLag int64
	// WithdrawnSends counts the sends this node recorded and took back
	// because they did not stand (the item failed): their backup did not
	// confirm them, or their partition was acquired again meanwhile.
	WithdrawnSends int64
	// StaleRefusals counts the Replicate calls this node refused as a
	// backup because their owner had not acquired the partition since it
	// was last out of this node's ring; Reacquired, the partitions this
	// node closed and acquired again after such a refusal (rule 8 of
	// partition.go).
	StaleRefusals, Reacquired int64
	// LateRequests counts the Check, Forward and Replicate calls refused
	// because the node read them more than LateRequestSlack after their
	// not_after_ms.
	LateRequests int64
	// ReopenedFailures counts the items failed, and their sends taken
	// back, because their partition was acquired again while they were
	// decided from its earlier record.
	ReopenedFailures int64
	// RefusedPeerCalls and RefusedAdminCalls count the calls to the Peer and
	// Admin services refused because their caller was not authenticated as
	// a member or an operator (security.go).
	RefusedPeerCalls, RefusedAdminCalls int64
	// Clock is this node's clock as measured against the members' over
	// gossip (gossip.ClockState); zero without Config.Cluster.
	Clock gossip.ClockState
	// ReplicateCalls counts the Replicate calls made to backups, each
	// carrying the sends of concurrent batches; ReplicateUnaryCalls those of
	// them made as unary calls instead of on a ReplicateStream (a backup of
	// an older version, or an in-process peer).
	ReplicateCalls, ReplicateUnaryCalls int64
}

// RingStats describe the ring a node routes by, as the node sees it.
type RingStats struct {
	Epoch   uint64 // the ring's epoch; nodes that agree show the same
	Members int    // members in it
	// Owned, Backed and Moving count the partitions this node owns, backs
	// up, and owns but has not acquired yet (a move in progress).
	Owned, Backed, Moving int
	OwnedRecords          int64 // records in the owned partitions, all domains
}

// DomainStats describes one domain's store and decisions.
type DomainStats struct {
	Name       string
	Records    int64 // recipients with a record
	Collisions int64 // records created beside another recipient's with the same 64-bit key hash
	Expired    int64 // idle records reclaimed
	Moved      int64 // records the sweep moved to lower slots so as to give sparse slab chunks back
	Compacted  int64 // records whose content logs the sweep dropped because no rule could count them
	Unreadable int64 // records the current or latest sweep pass could not decode, left as they were
	IndexBytes int64 // heap held by the index
	SlabBytes  int64 // heap held by record slabs
	LiveBytes  int64 // bytes of record slots in use
	// Admitted and Denied count the items of this domain decided here since
	// start; they survive rules reloads that keep the domain.
	Admitted, Denied int64
	// Rules are the counters of the domain's rules, in rule order.
	Rules []RuleStats
}

// StoreMemory returns the store's memory account (store.Store.Memory). It
// takes no lock. Safe for concurrent use once Serving has reported true:
// Open may replace the store before (see resetStore).
func (n *Node) StoreMemory() store.MemoryStats { return n.store.Memory() }

// Stats returns the node's counters. It takes each partition lock briefly.
// Safe for concurrent use.
func (n *Node) Stats() Stats {
	s := Stats{Checks: n.checks.Load(), Admitted: n.admitted.Load(), Denied: n.denied.Load(), Failed: n.failed.Load(),
		ForwardedOut: n.forwardedOut.Load(), ForwardedIn: n.forwardedIn.Load(), Snapshots: n.snapshots.Load(),
		FailedByCode: n.decisions.failedByCode(), Duplicates: n.decisions.duplicates.Load(),
		Reloads: n.reloads.Load(), ReloadFailures: n.reloadFailures.Load(), Refunds: n.refunds.Load(), Explains: n.explains.Load(),
		Memory: n.store.Memory(), Serving: n.Serving(), GateWaits: n.gate.waited(),
		ReplicatedSends: n.replicated.Load(), ReplicationFailures: n.replicationFailures.Load(), WithdrawnSends: n.withdrawn.Load(),
		StaleRefusals: n.staleRefusals.Load(), Reacquired: n.reacquired.Load(), LateRequests: n.lateRequests.Load(),
		ReopenedFailures: n.reopenedFailures.Load(),
		ReplicateCalls:   n.replCalls.Load(), ReplicateUnaryCalls: n.replUnaryCalls.Load(),
		RefusedPeerCalls: n.guard.refusedPeer.Load(), RefusedAdminCalls: n.guard.refusedAdmin.Load()}
	for p := range n.unacked {
		s.ReplicationLag += n.unacked[p].Load()
	}
	if n.dur != nil {
		s.WAL = n.dur.log.Stats()
		s.WALFailed = n.dur.log.Failed()
	}
	s.SnapshotFailures = n.snapshotFailures.Load()
	if c := n.clus.Load(); c != nil && c.ms != nil {
		s.Gossip = c.ms.Stats()
		s.Clock = c.ms.Clock()
	}
	v := n.view.Load()
	for _, name := range v.names {
		dv := v.domains[name]
		st := n.store.Stats(dv.ref)
		ds := DomainStats{
			Name: name, Records: st.Records, Collisions: st.Collisions, Expired: st.Expired, Moved: st.Moved,
			Compacted: st.Compacted, Unreadable: st.Unreadable,
			IndexBytes: st.IndexBytes, SlabBytes: st.SlabBytes, LiveBytes: st.LiveBytes,
			Admitted: dv.counters.admitted.Load(), Denied: dv.counters.denied.Load(),
		}
		for i, r := range dv.d.Rules() {
			ds.Rules = append(ds.Rules, RuleStats{Name: r.Name, Denied: dv.rules[i].denied.Load(), ShadowDenied: dv.rules[i].shadowDenied.Load()})
		}
		s.Domains = append(s.Domains, ds)
	}
	sort.Slice(s.Domains, func(i, j int) bool { return s.Domains[i].Name < s.Domains[j].Name })
	s.Partitions = make([]int64, n.store.Partitions())
	s.Open = make([]bool, n.store.Partitions())
	for p := range s.Partitions {
		s.Partitions[p] = n.store.PartitionLen(p)
		s.Open[p] = n.store.IsOpen(p)
	}
	if r := n.Ring(); r != nil {
		s.Ring.Epoch, s.Ring.Members = r.Epoch(), r.Len()
		for p := range n.store.Partitions() {
			if r.PartitionOwner(p).Name == n.cfg.Name {
				s.Ring.Owned++
				if !n.ho.isOpen(p) {
					s.Ring.Moving++
				}
				s.Ring.OwnedRecords += s.Partitions[p]
			}
			if b, ok := r.PartitionReplica(p); ok && b.Name == n.cfg.Name {
				s.Ring.Backed++
			}
		}
	}
	return s
}

// Sweep reclaims, in every domain, the records whose newest send is older
// than the domain's longest window, drops from the others the content logs
// no rule can count any more (store.Store.Sweep), and returns how many
// records it reclaimed. It acts as of SweepSlack ago, and locks one
// partition at a time for at most sweepBudget entries.
func (n *Node) Sweep(ctx context.Context) (int, error) {
	total := 0
	v := n.view.Load()
	for _, name := range v.names {
		dv := v.domains[name]
		for p := range n.store.Partitions() {
			for pos := 0; pos >= 0; {
				if err := ctx.Err(); err != nil {
					return total, err
				}
				var got int
				var err error
				pos, got, err = n.store.Sweep(p, dv.ref, pos, n.nowMs()-SweepSlack.Milliseconds(), sweepBudget)
				total += got
				if err != nil {
					return total, err
				}
			}
		}
		if bad := n.store.Stats(dv.ref).Unreadable; bad > 0 {
			n.log.Warn("the sweep found records it cannot decode; it left them as they are, and a decision on one fails",
				"domain", name, "records", bad)
		}
	}
	return total, nil
}

// SweepSlack is how far back the sweep acts: a record it reclaims, or a
// content log it drops, holds nothing a decision timed up to SweepSlack
// before the sweep could count. Such decisions exist: a batch takes its
// time before it locks its partitions one after another, and after a
// handoff a node whose clock is behind decides on records another node
// swept. It costs records a minute more in memory.
const SweepSlack = time.Minute

// sweepBudget bounds the index entries one sweep step visits under a
// partition lock: about 100 µs.
const sweepBudget = 2048

// Name returns the node's name (Config.Name).
func (n *Node) Name() string { return n.cfg.Name }

// Addr returns the gRPC address the node advertises (Config.AdvertiseAddr).
func (n *Node) Addr() string { return n.cfg.AdvertiseAddr }

// Status answers the Status RPC.
func (n *Node) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	s := n.Stats()
	resp := &pb.StatusResponse{
		Node: n.cfg.Name, Addr: n.cfg.AdvertiseAddr, Serving: n.ready.Load(),
		Checks: s.Checks, Admitted: s.Admitted, Denied: s.Denied, Failed: s.Failed,
		ForwardedOut: s.ForwardedOut, ForwardedIn: s.ForwardedIn, StartedUnixMs: n.started.UnixMilli(),
		GossipBadPackets: s.Gossip.BadPackets,
		MemoryRefusals:   s.Memory.Refused, StoreBytes: s.Memory.HeldBytes, StoreLimitBytes: s.Memory.MaxBytes,
		RulesReloads: s.Reloads, RulesReloadFailures: s.ReloadFailures,
		ClockOffsetMs: s.Clock.Offset.Milliseconds(), ClockSkewed: s.Clock.Skewed,
	}
	rs := n.RuleSet()
	resp.RulesHash, resp.RulesSource = fmt.Sprintf("%016x", rs.Hash()), rs.Source()
	if r := n.lastReload.Load(); r != nil {
		resp.LastReloadMs, resp.LastReloadError = r.atMs, r.err
	}
	resp.RingEpoch = s.Ring.Epoch
	resp.PartitionsOwned, resp.PartitionsMoving, resp.PartitionsBacked = uint32(s.Ring.Owned), uint32(s.Ring.Moving), uint32(s.Ring.Backed)
	resp.OwnedRecords = s.Ring.OwnedRecords
	resp.Replication = n.cfg.Replication.String()
	resp.ReplicatedSends, resp.ReplicationFailures, resp.ReplicationLag = s.ReplicatedSends, s.ReplicationFailures, s.ReplicationLag
	resp.AcquiredPartitions, resp.AcquiredRecords = n.ho.moves.Load(), n.ho.movedRecords.Load()
	resp.LongestPauseMs = time.Duration(n.ho.longestPause.Load()).Milliseconds()
	for _, d := range s.Domains {
		resp.Domains = append(resp.Domains, &pb.DomainStatus{Name: d.Name, Records: d.Records, Collisions: d.Collisions, HeapBytes: d.IndexBytes + d.SlabBytes})
	}
	return resp, nil
}
