package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/freqring/freqring/metrics"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
	statsusage "github.com/freqring/freqring/usage"
	"github.com/freqring/freqring/wal"
)

// serve runs freqring serve: a node, until SIGINT or SIGTERM.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	p, err := f.setup(stderr)
	if err != nil {
		return err
	}
	n, err := node.New(p.nc)
	if err != nil {
		return err
	}
	if f.checkConfig {
		fmt.Fprintln(stdout, "configuration ok")
		return nil
	}
	return f.run(ctx, n, p)
}

// serveFlags holds the flags of freqring serve, as parsed (and completed by
// the --config file). The define methods name each field's flag and default.
type serveFlags struct {
	configPath, listen, rulesPath, logLevel string
	checkConfig                             bool
	rulesWatch, sweep                       time.Duration
	shards                                  int
	tls                                     *tlsFlags
	admin                                   *adminFlags
	http                                    *httpFlags
	auth                                    *authFlags

	// storage
	dataDir, syncPolicy, durability                 string
	syncInterval, snapInterval                      time.Duration
	snapBytes                                       int64
	snapRatio                                       float64
	plainFsync, heapSlabs, skipCorrupt, dropRemoved bool

	// cluster
	name, advertise, gossipBind, gossipAdv, join, replication string
	asyncBound                                                int
	rejoin, maxClockSkew                                      time.Duration

	// resources
	maxMem, statsZone string
	grace             time.Duration
	lim               node.Limits // MaxStreams comes from maxStreams
	maxStreams        uint
	statsDays         int
}

// parseServeFlags defines serve's flags, parses args into them (usage to
// stderr on -h) and fills those the command line left unset from the
// --config file.
func parseServeFlags(args []string, stderr io.Writer) (*serveFlags, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	f := &serveFlags{}
	f.define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring serve [flags]\n\nRuns a node until SIGINT or SIGTERM, then finishes in-flight calls and exits.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q", fs.Arg(0))
	}
	if f.configPath != "" {
		if err := applyConfigFile(fs, f.configPath); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// define defines every flag of serve in fs, bound to the fields of f.
func (f *serveFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.configPath, "config", "", "YAML config file with the flags' names as keys, dashes as underscores (listen, rules, data_dir, ...); flags override it")
	fs.BoolVar(&f.checkConfig, "check-config", false, "check the flags, the --config file and the --rules file (and the TLS and gossip key files they name), print \"configuration ok\" and exit without listening or touching the data directory")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7070", "gRPC listen address")
	fs.StringVar(&f.rulesPath, "rules", "", "rules file (default: the embedded default rules); reloaded when it changes and on SIGHUP (docs/rules.md, Changing the rules live)")
	fs.DurationVar(&f.rulesWatch, "rules-watch-interval", rules.DefaultWatchInterval, "how often to read the --rules file for changes (negative: only on SIGHUP)")
	fs.IntVar(&f.shards, "shards", 0, "deprecated and ignored: the store has one lock per ring partition")
	fs.DurationVar(&f.sweep, "sweep-interval", time.Minute, "how often idle records are reclaimed and sparse slab chunks given back (negative disables)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.tls = addTLSFlags(fs, true)
	f.admin = addAdminFlags(fs, false)
	f.http = addHTTPFlags(fs)
	f.auth = addAuthFlags(fs, false)
	f.defineStorage(fs)
	f.defineCluster(fs)
	f.defineResources(fs)
}

// defineStorage defines the flags of the write-ahead log, the snapshots and
// the store's memory.
func (f *serveFlags) defineStorage(fs *flag.FlagSet) {
	fs.StringVar(&f.dataDir, "data-dir", "", "directory of the write-ahead log and snapshots (default: memory only, a restart forgets every send)")
	fs.StringVar(&f.syncPolicy, "sync", "batch", "WAL fsync policy: batch (a reply of a domain of durability fsync waits for its fsync), interval (no reply waits for an fsync), none (leave it to the OS)")
	fs.DurationVar(&f.syncInterval, "sync-interval", 10*time.Millisecond, "fsync period of what no reply waited for (--sync interval, and domains that are not of durability fsync)")
	fs.StringVar(&f.durability, "durability", "replicated", "durability of the domains whose rules name none: replicated (a reply waits for the WAL's write and the backup, each fsyncing within --sync-interval; for the WAL's fsync when there is no backup), fsync (for the WAL's fsync and the backup) or async (for the WAL's write; the backup follows within --async-bound); --sync and --replication can only lower it (docs/durability.md)")
	fs.BoolVar(&f.plainFsync, "plain-fsync", false, "fsync the WAL with fsync(2) instead of through an io_uring (used where the kernel allows one; it keeps the waiting goroutine off a CPU)")
	fs.BoolVar(&f.heapSlabs, "heap-slabs", false, "keep the store's records on the Go heap instead of memory the store maps for transparent huge pages (which decide 2-3x faster and restart faster with tens of millions of recipients where the kernel's mode is madvise)")
	fs.DurationVar(&f.snapInterval, "snapshot-interval", time.Minute, "longest time between snapshots (negative: only on shutdown and by size)")
	fs.Int64Var(&f.snapBytes, "snapshot-wal-bytes", 64<<20, "take a snapshot once the WAL has grown this many bytes (negative disables)")
	fs.Float64Var(&f.snapRatio, "snapshot-wal-ratio", 3, "write at most this many times the WAL's bytes in snapshots: a snapshot waits until the WAL has grown by the last one's size over this ratio (negative: no cap; a large store restarts faster, at many times the disk writes)")
	fs.BoolVar(&f.skipCorrupt, "skip-corrupt", false, "start past damaged WAL records (skipping only the damaged bytes, keeping the intact records after them) or, when no snapshot is intact, from the WAL alone, logging what is skipped, instead of refusing")
	fs.BoolVar(&f.dropRemoved, "drop-removed-domains", false, "drop for good the recovered history of domains the rules no longer have, instead of refusing to start")
}

// defineCluster defines the flags of the node's name, membership and
// replication.
func (f *serveFlags) defineCluster(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "name", "", "node name in the ring, unique and stable across restarts (default: the host name)")
	fs.StringVar(&f.advertise, "advertise", "", "gRPC host:port peers and clients reach this node at (default: the listen address)")
	fs.StringVar(&f.gossipBind, "gossip", "", "gossip (memberlist, TCP and UDP) bind host:port; setting it or --join makes the node a cluster member")
	fs.StringVar(&f.gossipAdv, "gossip-advertise", "", "gossip host:port peers reach this node at (default: the bind address)")
	fs.StringVar(&f.join, "join", "", "comma-separated seeds to join: host:port of peers' gossip, or DNS names resolving to several")
	fs.StringVar(&f.replication, "replication", "sync", "replication of admitted sends to their partition's backup: sync (on the backup before the reply; one crash over-admits nothing), async (replies while at most --async-bound sends of a partition are unacknowledged; a crash over-admits at most that many per partition) or off")
	fs.IntVar(&f.asyncBound, "async-bound", 64, "with --replication async, and for domains of durability async: sends of one partition that may be admitted before their backup has them")
	fs.DurationVar(&f.rejoin, "rejoin-interval", gossip.DefaultRejoinInterval, "how often to join the seeds again, to heal a split cluster (negative disables)")
	fs.DurationVar(&f.maxClockSkew, "max-clock-skew", gossip.DefaultMaxClockSkew, "how far this node's clock may be from most members' before it leaves the ring and owns nothing until it is back within (windows are exact to within it; negative: measure only)")
}

// defineResources defines the flags that bound memory, connections and
// calls, the shutdown grace and the usage statistics.
func (f *serveFlags) defineResources(fs *flag.FlagSet) {
	fs.StringVar(&f.maxMem, "max-memory", "auto", "the process's memory budget, which its resident set stays within: a size such as 12GiB or 800MiB, 0 for no limit, or auto: 90% of the container's cgroup memory limit or, without one, 90% of the machine's memory (MemTotal in /proc/meminfo; no limit if that cannot be read). The store may hold 3/4 of it (at most all but 96MiB); past that, items that would create a record (a new recipient) or grow one (a known recipient's record that needs a larger slot) fail with RESOURCE_EXHAUSTED, while denials, peeks and sends that fit a record's slot are decided as always. Also the Go runtime's memory limit, less the store's mapped memory and the binary's resident pages, unless GOMEMLIMIT is set")
	fs.DurationVar(&f.grace, "shutdown-grace", node.ShutdownGrace, "on SIGTERM: the longest wait for in-flight calls (and half of it for handing partitions over); the node stops as soon as they are done")
	lim := &f.lim
	fs.IntVar(&lim.MaxRequestBytes, "max-request-bytes", node.MaxRequestBytes, "largest request message, bytes (at most the default); larger calls fail with RESOURCE_EXHAUSTED")
	fs.IntVar(&lim.MaxContentBytes, "max-content-bytes", node.MaxContentBytes, "largest content of one item, bytes; larger items fail with INVALID_ARGUMENT")
	fs.UintVar(&f.maxStreams, "max-streams", 256, "concurrent calls per client connection; more wait in the client")
	fs.DurationVar(&lim.KeepaliveMinTime, "keepalive-min-time", 10*time.Second, "shortest interval between a client's keepalive pings; a client pinging more often is disconnected")
	fs.DurationVar(&lim.IdleTimeout, "idle-timeout", 15*time.Minute, "close a connection with no call for this long (negative: never)")
	fs.DurationVar(&lim.PingInterval, "ping-interval", time.Minute, "ping a connection silent for this long, and close it if the ping is not answered within --ping-timeout")
	fs.DurationVar(&lim.PingTimeout, "ping-timeout", 20*time.Second, "see --ping-interval")
	fs.StringVar(&f.statsZone, "stats-timezone", "", "IANA time zone (e.g. Asia/Shanghai) whose calendar days usage statistics are kept in besides UTC's (default: UTC only)")
	fs.IntVar(&f.statsDays, "stats-days", statsusage.DefaultDays, "calendar days of usage statistics kept per zone, today included; older days are dropped whole")
	fs.IntVar(&lim.MaxWatchers, "max-watchers", 4096, "concurrent ring watches (one per client); more fail with RESOURCE_EXHAUSTED")
}

// serveSetup is what serve builds from its flags before it creates the
// node: the node's configuration and what the listeners and watchers need.
type serveSetup struct {
	nc          node.Config
	rs          *rules.Set // the rules the node starts with
	logger      *slog.Logger
	budget      int64 // the memory budget, bytes; 0 means no limit
	followLimit bool  // serve sets the Go runtime's memory limit and follows the store's mapped memory
	sec         secrets
	obs         *metrics.Observer
	adminAddr   string      // "" when the admin listener is off
	adminTLS    *tls.Config // nil for plain HTTP
	httpTLS     *tls.Config // nil for plain HTTP
}

// setup checks the flags, reads the files they name (rules, TLS, keys) and
// builds the node's configuration, logging to stderr. Unless --check-config,
// it also sets the Go runtime's memory limit from the memory budget.
func (f *serveFlags) setup(stderr io.Writer) (*serveSetup, error) {
	policies := map[string]wal.SyncPolicy{"batch": wal.SyncBatch, "interval": wal.SyncInterval, "none": wal.SyncNone}
	policy, ok := policies[f.syncPolicy]
	if !ok {
		return nil, usagef("sync %q is not one of batch, interval, none", f.syncPolicy)
	}
	budget, budgetFrom, err := maxMemory(f.maxMem, os.DirFS("/"))
	if err != nil {
		return nil, err
	}
	logger, err := f.newLogger(stderr)
	if err != nil {
		return nil, err
	}
	p := &serveSetup{logger: logger, budget: budget}
	p.followLimit = f.applyMemoryBudget(budget, budgetFrom, logger)
	if p.nc, p.rs, err = f.nodeConfig(policy, budget, logger); err != nil {
		return nil, err
	}
	if p.sec, err = serveSecurity(&p.nc, f.tls, f.auth, logger); err != nil {
		return nil, err
	}
	p.obs = metrics.NewObserver()
	p.nc.Observer = p.obs
	if p.adminTLS, err = f.admin.serverTLS(f.tls, logger); err != nil {
		return nil, err
	}
	if p.httpTLS, err = f.http.serverTLS(f.tls, logger); err != nil {
		return nil, err
	}
	if f.admin.enabled() {
		if p.adminAddr, err = f.admin.addr(0); err != nil {
			return nil, err
		}
	}
	if _, err := f.admin.consoleOn(p.adminAddr); err != nil {
		return nil, err
	}
	if *f.http.rls {
		p.nc.Services = append(p.nc.Services, registerRLS(logger))
	}
	return p, nil
}

// newLogger returns the text logger to w at --log-level (at least warn with
// --check-config, which prints its verdict, not the start-up log), and warns
// of a --shards flag.
func (f *serveFlags) newLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, usagef("log level %q is not one of debug, info, warn, error", f.logLevel)
	}
	if f.checkConfig {
		level = max(level, slog.LevelWarn)
	}
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	if f.shards != 0 {
		logger.Warn("--shards is deprecated and ignored: the store has one lock per ring partition (271 by default)", "shards", f.shards)
	}
	return logger, nil
}

// applyMemoryBudget logs how the store's memory is backed and the memory
// budget (bytes, 0 for none; from says where it came from), and, unless
// --check-config or GOMEMLIMIT is set, makes the budget the Go runtime's
// memory limit. It reports whether it did: serve then follows the store's
// mapped memory (see followMappedMemory).
func (f *serveFlags) applyMemoryBudget(budget int64, from string, logger *slog.Logger) bool {
	if mode := hugePageMode(os.DirFS("/")); mode == "never" || (f.heapSlabs && mode != "" && mode != "always") {
		logger.Info("the store's records get no transparent huge pages: with millions of recipients, decisions and restarts are slower (at 100M here, 2.7x per decision); see docs/configuration.md, Memory limit", "thp", mode, "heap_slabs", f.heapSlabs)
	}
	follow := false
	if budget > 0 && !f.checkConfig {
		if env := os.Getenv("GOMEMLIMIT"); env != "" {
			logger.Info("GOMEMLIMIT is set: the Go runtime's memory limit is left to it; it must leave room for the store's records, which are outside the Go heap (freqring_store_mapped_bytes) unless --heap-slabs", "GOMEMLIMIT", env)
		} else {
			debug.SetMemoryLimit(budget)
			follow = true
		}
	}
	logger.Info("memory budget", "max_memory", budget, "from", from, "store_limit", node.StoreBudget(budget))
	return follow
}

// nodeConfig loads the rules (the embedded defaults without --rules), checks
// the remaining flags and returns the node's configuration, without its
// security, observer and extra services (see setup), and the rules.
func (f *serveFlags) nodeConfig(policy wal.SyncPolicy, budget int64, logger *slog.Logger) (node.Config, *rules.Set, error) {
	rs := rules.Default()
	var err error
	if f.rulesPath != "" {
		if rs, err = rules.Load(f.rulesPath); err != nil {
			return node.Config{}, nil, err
		}
	}
	repl, err := node.ParseReplication(f.replication)
	if err != nil {
		return node.Config{}, nil, usagef("replication %q is not one of sync, async, off", f.replication)
	}
	dur, err := rules.ParseDurability(f.durability)
	if err != nil || dur == rules.DurabilityDefault {
		return node.Config{}, nil, usagef("--durability %q is not one of fsync, replicated, async", f.durability)
	}
	if f.maxStreams < 1 || f.maxStreams > 1<<20 {
		return node.Config{}, nil, usagef("--max-streams %d out of range [1, %d]", f.maxStreams, 1<<20)
	}
	lim := f.lim
	lim.MaxStreams = uint32(f.maxStreams)
	if f.grace <= 0 {
		return node.Config{}, nil, usagef("--shutdown-grace %v is not positive", f.grace)
	}
	nc := node.Config{
		Limits: lim, ShutdownGrace: f.grace,
		Replication: repl, AsyncBound: f.asyncBound, Durability: dur,
		Rules: rs, SweepInterval: f.sweep, Logger: logger,
		DataDir: f.dataDir, Sync: policy, SyncInterval: f.syncInterval, PlainFsync: f.plainFsync, HeapSlabs: f.heapSlabs,
		SnapshotInterval: f.snapInterval, SnapshotWALBytes: f.snapBytes, SnapshotWALRatio: f.snapRatio, SkipCorrupt: f.skipCorrupt,
		Name: f.name, AdvertiseAddr: f.advertise, MaxMemory: budget,
	}
	nc.DropRemovedDomains = f.dropRemoved
	if err := f.statsConfig(&nc); err != nil {
		return node.Config{}, nil, err
	}
	if err := f.clusterConfig(&nc); err != nil {
		return node.Config{}, nil, err
	}
	return nc, rs, nil
}

// statsConfig checks --stats-days and --stats-timezone and sets them in nc.
func (f *serveFlags) statsConfig(nc *node.Config) error {
	if f.statsDays < 1 || f.statsDays > statsusage.MaxDays {
		return usagef("--stats-days %d out of range [1, %d]", f.statsDays, statsusage.MaxDays)
	}
	nc.StatsDays = f.statsDays
	if f.statsZone != "" {
		var err error
		if nc.StatsZone, err = time.LoadLocation(f.statsZone); err != nil {
			return usagef("--stats-timezone %q: %v", f.statsZone, err)
		}
	}
	return nil
}

// clusterConfig sets nc's membership (when --gossip or --join is set) and
// its name, the host name by default.
func (f *serveFlags) clusterConfig(nc *node.Config) error {
	var seeds []string
	if f.join != "" {
		seeds = strings.Split(f.join, ",")
	}
	if f.gossipBind != "" || len(seeds) > 0 {
		gc, err := gossipConfig(f.gossipBind, f.gossipAdv, seeds, f.rejoin)
		if err != nil {
			return err
		}
		if f.maxClockSkew == 0 {
			return fmt.Errorf("--max-clock-skew 0: want a bound above 0 (default %v), or negative to measure the clock without a bound", gossip.DefaultMaxClockSkew)
		}
		gc.MaxClockSkew = f.maxClockSkew
		nc.Cluster = gc
	}
	if nc.Name == "" {
		// The default name, resolved here: the node signs its peer calls
		// with it.
		var err error
		if nc.Name, err = os.Hostname(); err != nil {
			return fmt.Errorf("--name is not set and the host name is unknown: %w", err)
		}
	}
	return nil
}

// run listens on --listen, starts the admin listener, the HTTP gateway and
// the background watchers, and serves n until ctx is done or SIGINT or
// SIGTERM arrives. It returns once everything it started has stopped.
func (f *serveFlags) run(ctx context.Context, n *node.Node, p *serveSetup) error {
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	stopListeners, err := f.startListeners(n, p)
	defer stopListeners()
	if err != nil {
		lis.Close()
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if p.followLimit {
		stopFollower := startMemoryFollower(ctx, n, p.budget)
		defer stopFollower()
	}
	stopRulesWatcher := startRulesWatcher(ctx, f, p, n)
	defer stopRulesWatcher()
	stopSecretWatchers := startSecretWatchers(ctx, p)
	defer stopSecretWatchers()
	return n.Serve(ctx, lis)
}

// startListeners starts the admin listener and the HTTP gateway, each when
// its flags ask for it. The returned func stops those started, the last
// first; it is not nil, even with an error.
func (f *serveFlags) startListeners(n *node.Node, p *serveSetup) (stop func(), err error) {
	var stops []func() error
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if p.adminAddr != "" {
		var con http.Handler
		on, _ := f.admin.consoleOn(p.adminAddr) // checked in setup
		if !on && *f.admin.console == "auto" {
			p.logger.Info("console off: the admin listener is not on a loopback address (--admin-console on serves it there too)", "addr", p.adminAddr)
		}
		if on {
			h, closeConsole, err := newConsole(n, n.Name(), p.sec.dial, p.logger)
			if err != nil {
				return stop, err
			}
			con = h
			stops = append(stops, func() error { closeConsole(); return nil })
		}
		admin, err := startAdmin(p.adminAddr, adminHandler(metrics.NewRegistry(n, p.obs), n.Serving, *f.admin.pprof, con), p.adminTLS, p.logger)
		if err != nil {
			return stop, err
		}
		stops = append(stops, admin.stop)
	}
	if *f.http.listen != "" {
		gw, err := startHTTPGateway(*f.http.listen, n, f.http, p.httpTLS, p.logger)
		if err != nil {
			return stop, err
		}
		stops = append(stops, gw.stop)
	}
	return stop, nil
}

// startMemoryFollower keeps the Go runtime's memory limit following the
// memory the store maps outside the heap (see followMappedMemory), reading
// it every second. The returned func stops the follower and waits for it.
func startMemoryFollower(ctx context.Context, n *node.Node, budget int64) (stop func()) {
	var follower sync.WaitGroup
	fctx, cancel := context.WithCancel(ctx)
	served := false // read only by the follower
	mapped := func() int64 {
		// Open may replace the store until the node serves.
		if !served && !n.Serving() {
			return 0
		}
		served = true
		return n.StoreMemory().MappedBytes
	}
	follower.Go(func() { followMappedMemory(fctx, budget, mapped, time.Second) })
	return func() {
		cancel()
		follower.Wait()
	}
}

// startRulesWatcher reloads the rules into n when the --rules file changes
// and on SIGHUP (see watchRules). The returned func stops the watcher and
// waits for it.
func startRulesWatcher(ctx context.Context, f *serveFlags, p *serveSetup, n *node.Node) (stop func()) {
	var rulesWatcher sync.WaitGroup
	rctx, cancelRules := context.WithCancel(ctx)
	rulesWatcher.Go(func() { watchRules(rctx, f.rulesPath, p.rs, f.rulesWatch, n, p.logger) })
	return func() {
		cancelRules()
		rulesWatcher.Wait()
	}
}

// startSecretWatchers reloads the TLS certificates, tokens and gossip keys
// when their files change (see secrets.watch). The returned func stops the
// watchers and waits for them.
func startSecretWatchers(ctx context.Context, p *serveSetup) (stop func()) {
	var watchers sync.WaitGroup
	wctx, cancelWatch := context.WithCancel(ctx)
	p.sec.watch(wctx, &watchers, p.logger)
	return func() {
		cancelWatch()
		watchers.Wait()
	}
}

// gossipConfig builds the membership settings from the command line.
func gossipConfig(bind, advertise string, join []string, rejoin time.Duration) (*gossip.Config, error) {
	if bind == "" {
		bind = "0.0.0.0:7946"
	}
	gc := &gossip.Config{Join: join, RejoinInterval: rejoin}
	var err error
	if gc.BindAddr, gc.BindPort, err = splitHostPort("gossip", bind); err != nil {
		return nil, err
	}
	if advertise != "" {
		if gc.AdvertiseAddr, gc.AdvertisePort, err = splitHostPort("gossip-advertise", advertise); err != nil {
			return nil, err
		}
	}
	return gc, nil
}

func splitHostPort(flagName, hp string) (string, int, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, usagef("--%s %q: %v", flagName, hp, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, usagef("--%s %q: port %q is not a number in [0, 65535]", flagName, hp, port)
	}
	return host, p, nil
}

// applyConfigFile sets from the YAML file at path every flag of fs that the
// command line did not set. Its keys are the flags' names with underscores
// for dashes (data_dir: for --data-dir); a list (join) is joined with commas.
// An unknown key or a bad value is an error naming the file and the key.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, key := range slices.Sorted(maps.Keys(m)) {
		name := strings.ReplaceAll(key, "_", "-")
		if name == "config" || name == "check-config" || fs.Lookup(name) == nil {
			return unknownConfigKey(path, key, fs)
		}
		if set[name] {
			continue // the command line wins
		}
		var v string
		switch x := m[key].(type) {
		case []any:
			parts := make([]string, len(x))
			for i, p := range x {
				parts[i] = fmt.Sprint(p)
			}
			v = strings.Join(parts, ",")
		case nil:
			continue
		default:
			v = fmt.Sprint(x)
		}
		if err := fs.Set(name, v); err != nil {
			return usagef("%s: key %s: value %q: want %s (flag --%s)", path, key, v, expectedForm(fs.Lookup(name), err), name)
		}
	}
	return nil
}
