package node

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/bits"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// Limits of one Check request.
const (
	MaxBatch          = 10_000   // items per request
	MaxRecipientBytes = 256      // bytes per recipient
	MaxContentBytes   = 64 << 10 // bytes per content
	MaxRequestBytes   = 16 << 20 // bytes per request message
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
	Rules         *RuleSet      // nil means the embedded default rules (DefaultRules)
	Shards        int           // lock shards per domain, a power of two in [1, 65536]; 0 means 256
	SweepInterval time.Duration // how often idle records are reclaimed; 0 means 1 minute, negative disables
	Clock         Clock         // nil means the system clock
	Logger        *slog.Logger  // nil means discard

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
	// SegmentBytes is the WAL segment size; 0 means 64 MiB.
	SegmentBytes int64
	// SnapshotInterval is the longest time between snapshots; 0 means 1
	// minute, negative means only on shutdown and by SnapshotWALBytes.
	SnapshotInterval time.Duration
	// SnapshotWALBytes takes a snapshot once the WAL has grown this much
	// since the last one; 0 means 64 MiB, negative disables. With
	// SnapshotInterval it bounds the WAL a restart replays.
	SnapshotWALBytes int64
	// RetentionMargin is kept beyond the longest rule window before WAL
	// segments are deleted; 0 means 10 minutes.
	RetentionMargin time.Duration
	// SkipCorrupt opens a WAL or snapshot with damaged sealed data by
	// skipping the damage (and logging how much) instead of refusing to start.
	SkipCorrupt bool

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
	// must use the same. The zero value means package ring's defaults.
	Placement ring.Config

	// IdempotencyWindow is how long the request id of a recorded item is
	// remembered, so that a retry is not recorded twice; 0 means 1 minute.
	IdempotencyWindow time.Duration
	// IdempotencyCapacity bounds the ids remembered per domain (about 40
	// bytes each); 0 means 1,048,576. Under a load of more than
	// capacity/window recorded ids a second, ids are kept for less.
	IdempotencyCapacity int
}

func (c *Config) fill() {
	if c.Rules == nil {
		c.Rules = DefaultRules()
	}
	if c.Shards == 0 {
		c.Shards = 256
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
	if c.SnapshotWALBytes == 0 {
		c.SnapshotWALBytes = 64 << 20
	}
	if c.RetentionMargin == 0 {
		c.RetentionMargin = 10 * time.Minute
	}
	if c.Name == "" {
		c.Name, _ = os.Hostname()
	}
	if c.IdempotencyWindow == 0 {
		c.IdempotencyWindow = time.Minute
	}
	if c.IdempotencyCapacity == 0 {
		c.IdempotencyCapacity = 1 << 20
	}
}

func (c *Config) validate() error {
	if c.Shards < 1 || c.Shards > 1<<16 || bits.OnesCount(uint(c.Shards)) != 1 {
		return fmt.Errorf("node: Shards %d is not a power of two in [1, 65536]", c.Shards)
	}
	return nil
}

// Node decides checks against its rules over in-memory records. It is safe
// for concurrent use.
type Node struct {
	cfg     Config
	log     *slog.Logger
	domains map[string]*domainState
	longest int64 // longest window of any domain, ms

	ready     atomic.Bool // Check decides; false until Open has recovered, and after Close
	opened    bool
	dur       *durable // nil without a DataDir
	recovery  RecoveryStats
	stopLoops context.CancelFunc
	loops     sync.WaitGroup // background loops started by Open
	encoders  sync.Pool      // *walEncoder

	clus    atomic.Pointer[cluster] // set by Open; RPCs may read it before
	started time.Time

	checks, admitted, denied, failed, snapshots atomic.Int64
	forwardedOut, forwardedIn                   atomic.Int64
}

// domainState is one domain's rules, records and API description.
type domainState struct {
	d     *window.Domain
	store *store
	proto *pb.Domain // shared by every response; never modified
}

// New returns a node serving cfg.Rules.
func New(cfg Config) (*Node, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), domains: make(map[string]*domainState), started: time.Now()}
	for _, name := range cfg.Rules.Names() {
		d := cfg.Rules.Domain(name)
		n.domains[name] = &domainState{d: d, store: n.newStore(d), proto: domainProto(d)}
		n.longest = max(n.longest, d.Longest())
	}
	return n, nil
}

// newStore returns an empty store for d under the node's config.
func (n *Node) newStore(d *window.Domain) *store {
	return newStore(d, n.cfg.Shards, n.cfg.IdempotencyWindow.Milliseconds(), n.cfg.IdempotencyCapacity)
}

func domainProto(d *window.Domain) *pb.Domain {
	p := &pb.Domain{Name: d.Name()}
	for _, r := range d.Rules() {
		p.Rules = append(p.Rules, &pb.Rule{
			Name: r.Name, Scope: r.Scope.String(), Limit: uint32(r.Limit),
			WindowMs: r.WindowMillis(), Window: r.Window.String(),
		})
	}
	return p
}

// castagnoli is the CRC-32C table behind record tags.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// KeyOf returns the 64-bit key hash (xxhash64) of a recipient, which places it
// on the ring and in the store, and its 16-bit tag (CRC-32C), which tells
// apart two recipients whose key hashes collide.
func KeyOf(recipient string) (key uint64, tag uint16) {
	key = xxhash.Sum64String(recipient)
	tag = uint16(crc32.Checksum(unsafe.Slice(unsafe.StringData(recipient), len(recipient)), castagnoli))
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

// column returns entry i of a per-item column of 0, 1 or n entries.
func column[T any](c []T, i int, def T) T {
	switch len(c) {
	case 0:
		return def
	case 1:
		return c[0]
	}
	return c[i]
}

// checkShape validates a request's columns: it fails whole if they are not
// well formed.
func checkShape(req *pb.CheckRequest) error {
	n := len(req.Recipients)
	if n == 0 || n > MaxBatch {
		return status.Errorf(codes.InvalidArgument, "recipients: %d items, want 1 to %d", n, MaxBatch)
	}
	for _, c := range []struct {
		name string
		len  int
	}{
		{"domains", len(req.Domains)}, {"contents", len(req.Contents)},
		{"content_hashes", len(req.ContentHashes)}, {"costs", len(req.Costs)},
		{"modes", len(req.Modes)}, {"request_ids", len(req.RequestIds)},
	} {
		if c.len > 1 && c.len != n {
			return status.Errorf(codes.InvalidArgument, "%s: %d entries, want 0, 1 or %d (one per recipient)", c.name, c.len, n)
		}
	}
	if len(req.Contents) > 0 && len(req.ContentHashes) > 0 {
		return status.Error(codes.InvalidArgument, "contents and content_hashes: set at most one of them")
	}
	return nil
}

// itemError is one failed item: a gRPC code and a message naming the field.
type itemError struct {
	code codes.Code
	msg  string
}

func badItem(format string, args ...any) *itemError {
	return &itemError{codes.InvalidArgument, fmt.Sprintf(format, args...)}
}

// quote shows a recipient in an error, cut to 40 bytes.
func quote(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// item decodes and validates item i of req.
func (n *Node) item(req *pb.CheckRequest, i int) (*domainState, window.Item, *itemError) {
	var it window.Item
	rcp := req.Recipients[i]
	if rcp == "" {
		return nil, it, badItem("recipients[%d]: empty recipient", i)
	}
	if len(rcp) > MaxRecipientBytes {
		return nil, it, badItem("recipients[%d]: %d bytes, more than %d", i, len(rcp), MaxRecipientBytes)
	}
	name := column(req.Domains, i, "")
	if name == "" {
		name = DefaultDomain
	}
	ds := n.domains[name]
	if ds == nil {
		return nil, it, badItem("domains[%d]: unknown domain %s (this node serves %v)", i, quote(name), n.cfg.Rules.names)
	}
	if len(req.Contents) > 0 {
		c := column(req.Contents, i, nil)
		if len(c) > MaxContentBytes {
			return nil, it, badItem("contents[%d]: %d bytes, more than %d", i, len(c), MaxContentBytes)
		}
		it.Content = ContentHash(c)
	} else {
		it.Content = column(req.ContentHashes, i, 0)
	}
	cost := column(req.Costs, i, 1)
	if cost < 1 || cost > window.MaxCost {
		return nil, it, badItem("costs[%d]: cost %d out of range [1, %d]", i, cost, window.MaxCost)
	}
	it.Cost = int(cost)
	mode := column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD)
	switch mode {
	case pb.Mode_MODE_CHECK_AND_RECORD:
		it.Mode = window.CheckAndRecord
	case pb.Mode_MODE_PEEK:
		it.Mode = window.Peek
	case pb.Mode_MODE_RECORD_ONLY:
		it.Mode = window.RecordOnly
	default:
		return nil, it, badItem("modes[%d]: unknown mode %d", i, int32(mode))
	}
	return ds, it, nil
}

// Check answers Limiter.Check. The items this node owns are decided here,
// the others are forwarded in one call per owner, and the answers come back
// in request order. With a DataDir, the sends it records are in the WAL
// before it returns.
func (n *Node) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	t := n.announce()
	defer t.cancel()
	if err := n.admit(ctx, req); err != nil {
		return nil, err
	}
	r := n.clus.Load().ring()
	if r.Len() > 1 {
		if groups := n.route(req, r); groups != nil {
			return n.checkRouted(ctx, req, r, groups, t)
		}
	}
	return n.decide(ctx, req, r, false, t)
}

// walTicket is a WAL append that a call announced as soon as it arrived (wal
// Expect), so that the group commit in progress waits for it; the call makes
// it or withdraws it, once. A nil ticket (no WAL) does nothing.
type walTicket struct {
	log  *wal.Log
	used bool
}

// announce returns a ticket for this call's WAL append, or nil without a WAL.
func (n *Node) announce() *walTicket {
	if n.dur == nil {
		return nil
	}
	n.dur.log.Expect()
	return &walTicket{log: n.dur.log}
}

// cancel withdraws the announcement unless the append was made.
func (t *walTicket) cancel() {
	if t != nil && !t.used {
		t.used = true
		t.log.Unexpect()
	}
}

// admit refuses calls the node cannot take: before Open, after Close, and
// malformed batches.
func (n *Node) admit(ctx context.Context, req *pb.CheckRequest) error {
	if !n.ready.Load() {
		return status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	if err := checkShape(req); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// newResponse returns an empty response with room for n items.
func newResponse(n int) *pb.CheckResponse {
	return &pb.CheckResponse{
		Admitted:         make([]bool, n),
		Recorded:         make([]bool, n),
		DeniedBy:         make([]int32, n),
		RetryAfterMs:     make([]int64, n),
		DecidedAtMs:      make([]int64, n),
		Used:             make([]uint32, 0, n*4),
		Remaining:        make([]uint32, 0, n*4),
		RuleRetryAfterMs: make([]int64, 0, n*4),
		RuleCounts:       make([]uint32, n),
		Domains:          make(map[string]*pb.Domain, 1),
	}
}

// decide decides every item of req here, in order, at one clock reading.
// With mustOwn, an item this node does not own under r fails with
// UNAVAILABLE: the caller routed by a stale ring.
func (n *Node) decide(ctx context.Context, req *pb.CheckRequest, r *ring.Ring, mustOwn bool, t *walTicket) (*pb.CheckResponse, error) {
	cnt := len(req.Recipients)
	resp := newResponse(cnt)
	resp.RingEpoch = r.Epoch()
	now := n.nowMs()
	var dec window.Decision
	var admitted, denied, failed int64
	var enc *walEncoder
	if t != nil {
		enc, _ = n.encoders.Get().(*walEncoder)
		if enc == nil {
			enc = new(walEncoder)
		}
		enc.reset()
		defer n.encoders.Put(enc)
	}
	for i := range cnt {
		resp.DeniedBy[i] = -1
		ds, it, ierr := n.item(req, i)
		if ierr == nil {
			key, tag := KeyOf(req.Recipients[i])
			id := column(req.RequestIds, i, 0)
			if owner := r.PartitionOwner(r.PartitionHash(key)); mustOwn && owner.Name != n.cfg.Name {
				ierr = &itemError{codes.Unavailable, fmt.Sprintf("recipient %s: node %s does not own it under ring epoch %d (owner %s); retry with the new ring",
					quote(req.Recipients[i]), n.cfg.Name, r.Epoch(), owner.Name)}
			} else if seq, dup, err := ds.store.apply(key, tag, now, it, id, &dec); err != nil {
				ierr = n.applyError(req, i, err)
			} else if dup {
				resp.Duplicates = append(resp.Duplicates, uint32(i))
			} else if dec.Recorded && enc != nil {
				enc.add(walSend{domain: ds.d.Name(), key: key, tag: tag, seq: seq, at: dec.At, content: it.Content, cost: it.Cost, id: id})
			}
		}
		if ierr != nil {
			failed++
			resp.DecidedAtMs[i] = now
			resp.Errors = append(resp.Errors, &pb.ItemError{Index: uint32(i), Code: uint32(ierr.code), Message: ierr.msg})
			continue
		}
		resp.Domains[ds.d.Name()] = ds.proto
		if dec.Admitted {
			admitted++
		} else {
			denied++
		}
		resp.Admitted[i] = dec.Admitted
		resp.Recorded[i] = dec.Recorded
		resp.DeniedBy[i] = int32(dec.DeniedBy)
		resp.RetryAfterMs[i] = dec.RetryAfter
		resp.DecidedAtMs[i] = dec.At
		resp.RuleCounts[i] = uint32(dec.NumRules)
		for _, r := range dec.Rules[:dec.NumRules] {
			resp.Used = append(resp.Used, uint32(r.Used))
			resp.Remaining = append(resp.Remaining, uint32(r.Remaining))
			resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, r.RetryAfter)
		}
	}
	n.checks.Add(int64(cnt))
	n.admitted.Add(admitted)
	n.denied.Add(denied)
	n.failed.Add(failed)
	if enc != nil {
		if err := n.appendWAL(ctx, enc, t); err != nil {
			n.log.Error("WAL append failed: the batch was decided in memory but is not durable", "err", err)
			return nil, status.Errorf(codes.Unavailable, "write-ahead log: %v", err)
		}
	}
	return resp, nil
}

// sortErrors orders item errors by index.
func sortErrors(es []*pb.ItemError) {
	sort.Slice(es, func(a, b int) bool { return es[a].Index < es[b].Index })
}

// windowItem is the item a WAL send records.
func windowItem(s walSend) window.Item {
	return window.Item{Content: s.content, Cost: s.cost, Mode: window.RecordOnly}
}

// applyError turns a store error into an item error. Its message names the
// recipient, not the item's index: a forwarded item's index is its place in
// the forwarded batch, not in the caller's.
func (n *Node) applyError(req *pb.CheckRequest, i int, err error) *itemError {
	switch {
	case errors.Is(err, window.ErrInvalid):
		return badItem("recipient %s: %s", quote(req.Recipients[i]), trimPrefix(err))
	case errors.Is(err, window.ErrFull):
		return &itemError{codes.ResourceExhausted, fmt.Sprintf("recipient %s: %s", quote(req.Recipients[i]), trimPrefix(err))}
	}
	n.log.Error("check failed", "recipient", quote(req.Recipients[i]), "err", err)
	return &itemError{codes.Internal, fmt.Sprintf("recipient %s: %v", quote(req.Recipients[i]), err)}
}

// trimPrefix drops the "window: invalid item: " style prefix of a window error.
func trimPrefix(err error) string {
	s := err.Error()
	for _, p := range []string{window.ErrInvalid.Error() + ": ", window.ErrFull.Error() + ": "} {
		if len(s) > len(p) && s[:len(p)] == p {
			return s[len(p):]
		}
	}
	return s
}

// Rules answers the Rules RPC.
func (n *Node) Rules(context.Context, *pb.RulesRequest) (*pb.RulesResponse, error) {
	resp := &pb.RulesResponse{}
	for _, name := range n.cfg.Rules.names {
		resp.Domains = append(resp.Domains, n.domains[name].proto)
	}
	return resp, nil
}

// Stats are a node's counters at one moment.
type Stats struct {
	Checks, Admitted, Denied, Failed int64 // items decided here since start
	ForwardedOut, ForwardedIn        int64 // items sent to their owners; items peers sent here
	Snapshots                        int64 // snapshots written since start
	WAL                              wal.Stats
	Domains                          []DomainStats
}

// DomainStats describes one domain's store.
type DomainStats struct {
	Name       string
	Records    int64 // recipients with a record
	Collisions int64 // records created beside another recipient's with the same 64-bit key hash
	Expired    int64 // idle records reclaimed
	IndexBytes int64 // heap held by the index
	SlabBytes  int64 // heap held by record slabs
	LiveBytes  int64 // bytes of record slots in use
}

// Stats returns the node's counters. It takes each shard lock briefly.
func (n *Node) Stats() Stats {
	s := Stats{Checks: n.checks.Load(), Admitted: n.admitted.Load(), Denied: n.denied.Load(), Failed: n.failed.Load(),
		ForwardedOut: n.forwardedOut.Load(), ForwardedIn: n.forwardedIn.Load(), Snapshots: n.snapshots.Load()}
	if n.dur != nil {
		s.WAL = n.dur.log.Stats()
	}
	for _, name := range n.cfg.Rules.names {
		st := n.domains[name].store.stats()
		s.Domains = append(s.Domains, DomainStats{
			Name: name, Records: st.Records, Collisions: st.Collisions, Expired: st.Expired,
			IndexBytes: st.IndexBytes, SlabBytes: st.SlabBytes, LiveBytes: st.LiveBytes,
		})
	}
	sort.Slice(s.Domains, func(i, j int) bool { return s.Domains[i].Name < s.Domains[j].Name })
	return s
}

// Sweep reclaims, in every domain, the records whose newest send is older
// than the domain's longest window, and returns how many it reclaimed. It
// locks one shard at a time for at most sweepBudget entries.
func (n *Node) Sweep(ctx context.Context) (int, error) {
	total := 0
	for _, name := range n.cfg.Rules.names {
		ds := n.domains[name]
		for i := range ds.store.shards {
			for pos := 0; pos >= 0; {
				if err := ctx.Err(); err != nil {
					return total, err
				}
				cutoff := n.cfg.Clock.Now()/int64(time.Millisecond) - ds.d.Longest()
				var got int
				var err error
				pos, got, err = ds.store.sweep(i, pos, cutoff, sweepBudget)
				total += got
				if err != nil {
					return total, err
				}
			}
		}
	}
	return total, nil
}

// sweepBudget bounds the index entries one sweep step visits under a shard
// lock: about 100 µs.
const sweepBudget = 2048

// Status answers the Status RPC.
func (n *Node) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	s := n.Stats()
	resp := &pb.StatusResponse{
		Node: n.cfg.Name, Addr: n.cfg.AdvertiseAddr, Serving: n.ready.Load(),
		Checks: s.Checks, Admitted: s.Admitted, Denied: s.Denied, Failed: s.Failed,
		ForwardedOut: s.ForwardedOut, ForwardedIn: s.ForwardedIn, StartedUnixMs: n.started.UnixMilli(),
	}
	if r := n.Ring(); r != nil {
		resp.RingEpoch = r.Epoch()
	}
	for _, d := range s.Domains {
		resp.Domains = append(resp.Domains, &pb.DomainStatus{Name: d.Name, Records: d.Records, Collisions: d.Collisions, HeapBytes: d.IndexBytes + d.SlabBytes})
	}
	return resp, nil
}
