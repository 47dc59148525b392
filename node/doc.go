// Package node is one freqring node: it decodes each batch once, routes its
// items to their owners, decides the ones it owns against the rules over the
// in-memory store, makes what it recorded durable, and serves the
// freqring.v1 gRPC services. The parts it wires live in packages of their
// own: window (the rule engine), rules (rules files), store (records by ring
// partition), wal (the log on disk), ring and ring/gossip (who owns what).
//
// # Data flow
//
// A Check request is a batch of items in columns (api/freqring/v1, read and
// written through api/wire), and takes these stages (check.go):
//
//	admit    the node serves and the batch's shape is whole (wire.CheckRequest)
//	decode   every item decoded once (decode.go): domain, content hash, cost
//	         and mode checked, the recipient hashed to its 64-bit key
//	         (xxhash64, its place on the ring), its 16-bit tag (CRC-32C, which
//	         tells apart recipients whose keys collide) and its partition
//	judge    each item's verdict under the ring, the one place a check judges
//	         ownership (partition.go): forwarded to its owner, or decided here
//	route    items another member owns go to it in one Peer.Forward per
//	         owner, in parallel, and the answers are merged (forward.go)
//	decide   the rest, at one clock reading, meet their partitions' state in
//	         store.ApplyBatch, which takes each partition's lock once and
//	         decides its items in request order with window.Apply, the cache
//	         misses of later partitions in flight meanwhile (decide.go); each
//	         answer is written (respond.go), counted, and what it recorded
//	         listed (record.go)
//	persist  that one list of sends feeds the WAL (one append, in request
//	         order) and each backup's frame before the reply (record.go,
//	         durable.go, walrec.go, replica.go)
//
// A Peer.Forward call takes the same stages but route (peerrpc.go).
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
// before its reply: partition.go states the rules (a node decides only for
// partitions it has acquired under its current ring; acquiring closes the
// partition on every other member and merges their copies; a backup holds
// every admitted send; a leaving node hands over first; a node without a
// majority decides nothing; a node hands back what it decided under another
// ring), and keeps each partition's state; mover.go, handback.go and
// majority.go carry them out, peerrpc.go answers the peer calls, and
// replica.go replicates each batch's sends to their backups
// (Config.Replication).
//
// # Peers
//
// A node reaches others through the Peers interface (peer.go): gRPC by
// default, or a LocalNetwork that calls nodes of the same process directly,
// for in-process clusters (package nodetest), through a Carrier that can
// freeze and cut the network like a real one. A Peer is the generated
// clients' method set; the receiving side is peerServer (peerrpc.go), never
// a method of Node, whose exported methods are an embedder's.
//
// # Files
//
//	node.go       Node, Config, New, the rules view, Stats, Sweep, Status
//	lifecycle.go  Open, Close, the sweep loop, every (the loop of the jobs that poll)
//	check.go      Check: the stages, in order
//	decode.go     stage 1: each item decoded, validated and hashed once
//	partition.go  the rules of moves; each partition's state; judge, the ownership verdict
//	forward.go    route: grouping by owner, forwarding, merging answers
//	decide.go     decide: the pass over the local items, the store's results taken and counted
//	respond.go    the answer columns of a decided item
//	record.go     what a call recorded, one list for the WAL and the backups; persist
//	stream.go     CheckStream: Check for the requests of one stream, decided concurrently; serveStream, the loop of both stream handlers
//	peer.go       Peer, Peers, GRPCPeers, LocalNetwork, Carrier
//	peerrpc.go    peerServer: the Peer service's handlers, the checks of a peer message
//	cluster.go    membership (gossip), a name taken, Leave, the Ring and WatchRing RPCs
//	mover.go      partition moves: reconcile, acquire, fill, release, drain
//	handback.go   rule 7, the sender: handing back what was decided under another ring
//	majority.go   rule 5: hasMajority, the electorate
//	replica.go    a backup per partition: sync replication of a batch, recording as a backup
//	replstream.go ReplicateStream: an owner's Replicate calls to one backup on one stream
//	recover.go    recovery at Open: the data directory, the newest intact snapshot, the WAL replayed
//	durable.go    WAL appends and their failure, snapshots' schedule and fallback, retention
//	snapshot.go   the snapshot file: format, writing
//	snapread.go   reading snapshots back: a reader per format, verification
//	synth.go      synthetic state: a data directory of N recipients at steady state (freqring synth)
//	lock.go       one process per data directory (flock of DATA_DIR/LOCK)
//	removed.go    history of domains the rules lack: refuse, or drop when told
//	overrides.go  admin overrides: the Admin service, overrides.json, the pull from peers (syncOverrides)
//	memlimit.go   the memory limit: the store's budget, refusals at it, the item gate
//	observe.go    the Observer hooks (timings for metrics), decision counters by domain, rule and code, Serving
//	stages.go     each call's stages timed for Observer.Stage: the timer a call carries, the gRPC hooks of arrival and respond
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
// Config.MaxMemory is the process's memory budget, which its resident set
// stays within (memlimit.go). The store may hold StoreBudget of it; past
// that, the store refuses an item that would take more memory: one that
// would create a record (a new recipient), or move a known recipient's
// record to a larger slot with none free (another send, a content to log).
// The item fails alone with RESOURCE_EXHAUSTED, counted
// (Stats.Memory.Refused, RefusedGrowth of them) and logged at most once a
// second. Denials, peeks and sends that fit the record's slot are decided
// as always, and recorded items' request ids are remembered in the id
// table's present size (the oldest forgotten sooner). So a node at its
// limit keeps every recipient's history, and its limits exact, and admits
// only what fits: a refused send never over-admits, where dropping history
// would. Room comes back as the sweep reclaims idle records and gives
// sparse chunks back.
//
// Replay, replication and partition moves are never refused: they carry
// sends already admitted, and losing one could over-admit. What they create
// or grow past the limit is counted (Stats.Memory.Overshoots), and bounded
// by what the sends' deciders admitted under their own limits: replay
// rebuilds what the node held before it stopped (within its limit then,
// unless the limit was lowered: Open logs a store past its limit), and a
// backup's copies grow only as their owners admit, each refusing past its
// own limit, which counts the backups it holds too.
// BenchmarkClusterMemoryBound measured stores at 100.3% (2 nodes) and
// 108.8% (3 nodes) of their limit: at most 2% of the budget.
//
// The rest of the budget is the Go runtime's: the caller keeps its memory
// limit at GoMemoryLimit, the budget less the store's mapped memory and the
// resident pages the runtime does not govern (ResidentOutsideGo, the
// binary's for the most part), so that the collector works harder before
// the resident set passes the budget. It holds the store's chunks and
// tables that are on the Go heap (all of them in a small store), snapshot
// buffers (direct I/O chunks of 1/256 of the budget, 1 to 8 MiB:
// snapshotChunk), requests in flight and gRPC's buffers, and the
// collector's headroom. Requests in flight are bounded with it: Limiter
// calls (Check, CheckStream) decide at most an eighth of the budget's worth
// of items at once, at 1 KiB an item (inflightItems: 16,384 at 128 MiB),
// and the others wait their turn in arrival order (itemGate,
// Stats.GateWaits); a stream reads no more requests meanwhile, so that
// HTTP/2 flow control holds its sender back. An overloaded node thus queues
// calls rather than holding them all decoded and answered: at the limit,
// where each refused item carries its message, 190 calls of 500 items at
// once had taken a node to 147% of its budget. Forwarded batches and
// backups' sends do not wait (their callers hold their own turn, and two
// nodes forwarding to each other could wait on each other), nor do calls
// made in process (Node.Check: the HTTP gateway, Envoy's RLS). Unary calls
// waiting their turn hold their decoded request: at most Limits.MaxStreams
// of Limits.MaxRequestBytes a connection.
//
// BenchmarkMemoryBound (128 MiB, a WAL, snapshots beside the checks)
// measured a resident set of at most 115 MiB, 90% of the budget, where
// before a store of 165 MiB took it to 268 MiB (209%). Setting the Go
// runtime's memory limit is left to the caller: it is one per process, and
// a process may run several nodes (package nodetest).
package node
