// Package node is one freqring node: it decodes each batch once, routes its
// items to their owners, decides the ones it owns against the rules over the
// in-memory store, makes what it recorded durable, and serves the
// freqring.v1 gRPC services. The parts it wires live in packages of their
// own: window (the rule engine), rules (rules files), store (records by ring
// partition), wal (the log on disk), ring and ring/gossip (who owns what).
//
// # Data flow
//
// A Check request is a batch of items in columns (see api/freqring/v1). The
// node validates its shape and decodes every item once (batch.go): domain,
// content hash, cost and mode are checked, and the recipient is hashed to its
// 64-bit key (xxhash64, which places it on the ring), its 16-bit tag
// (CRC-32C, which tells apart recipients whose keys collide) and its ring
// partition. Items another member owns are forwarded in one Peer.Forward per
// owner, in parallel (forward.go); the rest are decided in decide, at one
// clock reading, which is the one place an item meets its partition's state:
// store.ApplyBatch takes each partition's lock once, decides its items in
// request order with window.Apply and writes the records back, with the
// cache misses of later partitions in flight meanwhile. The sends it
// recorded go to the WAL in one append, in request order, before the reply
// (durable.go, walrec.go).
//
// # Rules
//
// The rule set in force and its bindings to the store (one store.Ref per
// domain) sit behind one atomic pointer (view), so that a reload can swap
// rules without moving records: records belong to a domain's name. A view
// is built (bind) from the rule set and the admin override layer
// (overrides.go): a domain with overrides carries a lookup from key to a
// variant of its rules over the same records (rules.Binding); decode picks
// an item's variant. Per-rule decision counters (observe.go) are kept by
// domain and rule name, outside the view, so a rebinding keeps them.
//
// # Exact through ring changes
//
// History moves with ownership and every admitted send is on two nodes
// before its reply: handoff.go states the five rules (a node decides only
// for partitions it has acquired under its current ring; acquiring closes
// the partition on every other member and merges their copies; a backup
// holds every admitted send; a leaving node hands over first; a node
// without a majority decides nothing) and carries them out; replica.go
// replicates each batch's sends to their backups (Config.Replication).
//
// # Peers
//
// A node reaches others through the Peers interface (peer.go): gRPC by
// default, or a LocalNetwork that calls nodes of the same process directly,
// for in-process clusters (package nodetest).
//
// # Files
//
//	node.go       Node, Config, New, the rules view, Stats, Sweep, Status
//	lifecycle.go  Open, Close, the sweep loop
//	batch.go      the single pass: decode, Check, Forward, decide
//	stream.go     CheckStream: Check for the requests of one stream, decided concurrently; serveStream, the loop of both stream handlers
//	forward.go    grouping by owner, forwarding, merging answers
//	peer.go       Peer, Peers, GRPCPeers, LocalNetwork
//	cluster.go    membership (gossip), Leave, the Ring and WatchRing RPCs
//	handoff.go    partition moves: reconcile, acquire, fill, release, drain, majority
//	replica.go    a backup per partition: Replicate, sync replication of a batch
//	replstream.go ReplicateStream: an owner's Replicate calls to one backup on one stream
//	durable.go    recovery, WAL appends, snapshots' schedule and fallback, retention
//	snapshot.go   the snapshot file: partition images, older formats read, verification
//	synth.go      synthetic state: a data directory of N recipients at steady state (freqring synth)
//	lock.go       one process per data directory (flock of DATA_DIR/LOCK)
//	removed.go    history of domains the rules lack: refuse, or drop when told
//	overrides.go  admin overrides: the Admin service, overrides.json, the pull from peers (SyncOverrides)
//	memlimit.go   the memory limit: the store's budget, refusals at it
//	observe.go    the Observer hooks (timings for metrics), decision counters by domain, rule and code, Serving
//	walrec.go     the WAL payload of one Check
//	usage.go      usage statistics: what decide counts, the Usage RPC, the DATA_DIR/usage file
//	server.go     the gRPC services, health (and its liveness service), reflection, Serve
//	security.go   who may call what: members' signed calls, operators' tokens, TLS
//	advertise.go  the address to advertise for a listener on every interface
//	throttle.go   a log line at most once per period
//
// # Who may call what
//
// The Limiter service is open to whoever reaches the listener. The Peer
// service takes only members' calls: each is signed with Config.PeerKeys
// (HMAC-SHA256 of the method, the caller's name and the time), or comes
// with a client certificate verified under Config.PeerMTLS; a signed
// request that names another member is refused. Admin's changes need an
// operator: a bearer token of Config.AdminTokens, or a verified client
// certificate. A cluster member needs PeerKeys, PeerMTLS or
// Config.InsecurePeers (security.go). Config.TLS puts the listener on TLS;
// the node never reads certificate or key files (cmd/freqring does, and
// reloads them). Peers dial each other through Config.Peers; a node whose
// Peers is nil signs its calls itself.
//
// # A failed disk
//
// A call whose WAL append fails takes its sends back (the store's
// Unrecord, and the inverse to the backups) before it fails, so that memory
// agrees with the log and a retry is decided afresh; a duplicate is
// answered as recorded only once the call that recorded it has ended
// (walFlight). While the WAL has failed the node records nothing and
// Serving is false; durableLoop brings the WAL back with backoff
// (wal.Log.Recover). Snapshots need room on the disk and back off after
// failures (durable.go).
//
// # Memory
//
// See package store: pointer-free slabs and a flat index per partition and
// domain, so that a garbage collection costs the same at 10 million
// recipients as at ten. A record whose newest send is older than its
// domain's longest window holds nothing any rule counts; Serve sweeps them
// every SweepInterval, one partition at a time and at most sweepBudget index
// entries per lock hold, drops from the other records the content logs no
// rule can count any more, and gives sparse slab chunks back as it goes
// (store.Store.Sweep). It acts as of SweepSlack ago, so that a decision
// timed a little before it, or on a node whose clock is a little behind,
// still finds every send it can count.
//
// Config.MaxMemory bounds the store at StoreBudget of it (memlimit.go): past
// that, the store refuses items that would create a record, which fail
// alone with RESOURCE_EXHAUSTED, counted and logged at most once a second,
// while known recipients are decided as always; replay, replication and
// partition moves are never refused. Setting the Go runtime's memory limit
// is left to the caller: it is one per process, and a process may run
// several nodes (package nodetest).
package node
