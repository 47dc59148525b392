package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
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

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML config file with the flags' names as keys, dashes as underscores (listen, rules, data_dir, ...); flags override it")
	checkConfig := fs.Bool("check-config", false, "check the flags, the --config file and the --rules file (and the TLS and gossip key files they name), print \"configuration ok\" and exit without listening or touching the data directory")
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC listen address")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded default rules); reloaded when it changes and on SIGHUP (docs/rules.md, Changing the rules live)")
	rulesWatch := fs.Duration("rules-watch-interval", rules.DefaultWatchInterval, "how often to read the --rules file for changes (negative: only on SIGHUP)")
	shards := fs.Int("shards", 0, "deprecated and ignored: the store has one lock per ring partition")
	sweep := fs.Duration("sweep-interval", time.Minute, "how often idle records are reclaimed and sparse slab chunks given back (negative disables)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	tf := addTLSFlags(fs, true)
	af := addAdminFlags(fs, false)
	hf := addHTTPFlags(fs)
	auth := addAuthFlags(fs, false)
	dataDir := fs.String("data-dir", "", "directory of the write-ahead log and snapshots (default: memory only, a restart forgets every send)")
	syncPolicy := fs.String("sync", "batch", "WAL fsync policy: batch (fsync before each reply), interval (every --sync-interval), none (leave it to the OS)")
	syncInterval := fs.Duration("sync-interval", 10*time.Millisecond, "fsync period with --sync interval")
	plainFsync := fs.Bool("plain-fsync", false, "fsync the WAL with fsync(2) instead of through an io_uring (used where the kernel allows one; it keeps the waiting goroutine off a CPU)")
	heapSlabs := fs.Bool("heap-slabs", false, "keep the store's records on the Go heap instead of memory the store maps for transparent huge pages (which decide 2-3x faster and restart faster with tens of millions of recipients where the kernel's mode is madvise)")
	snapInterval := fs.Duration("snapshot-interval", time.Minute, "longest time between snapshots (negative: only on shutdown and by size)")
	snapBytes := fs.Int64("snapshot-wal-bytes", 64<<20, "take a snapshot once the WAL has grown this many bytes (negative disables)")
	skipCorrupt := fs.Bool("skip-corrupt", false, "start past damaged WAL records (skipping only the damaged bytes, keeping the intact records after them) or, when no snapshot is intact, from the WAL alone, logging what is skipped, instead of refusing")
	dropRemoved := fs.Bool("drop-removed-domains", false, "drop for good the recovered history of domains the rules no longer have, instead of refusing to start")
	name := fs.String("name", "", "node name in the ring, unique and stable across restarts (default: the host name)")
	advertise := fs.String("advertise", "", "gRPC host:port peers and clients reach this node at (default: the listen address)")
	gossipBind := fs.String("gossip", "", "gossip (memberlist, TCP and UDP) bind host:port; setting it or --join makes the node a cluster member")
	gossipAdv := fs.String("gossip-advertise", "", "gossip host:port peers reach this node at (default: the bind address)")
	join := fs.String("join", "", "comma-separated seeds to join: host:port of peers' gossip, or DNS names resolving to several")
	replication := fs.String("replication", "sync", "replication of admitted sends to their partition's backup: sync (on the backup before the reply; one crash over-admits nothing), async (replies while at most --async-bound sends of a partition are unacknowledged; a crash over-admits at most that many per partition) or off")
	asyncBound := fs.Int("async-bound", 64, "with --replication async: sends of one partition that may be admitted before their backup has them")
	rejoin := fs.Duration("rejoin-interval", gossip.DefaultRejoinInterval, "how often to join the seeds again, to heal a split cluster (negative disables)")
	maxMem := fs.String("max-memory", "auto", "the process's memory budget, which its resident set stays within: a size such as 12GiB or 800MiB, 0 for no limit, or auto: 90% of the container's cgroup memory limit or, without one, 90% of the machine's memory (MemTotal in /proc/meminfo; no limit if that cannot be read). The store may hold 3/4 of it (at most all but 96MiB); past that, items that would create a record (a new recipient) or grow one (a known recipient's record that needs a larger slot) fail with RESOURCE_EXHAUSTED, while denials, peeks and sends that fit a record's slot are decided as always. Also the Go runtime's memory limit, less the store's mapped memory and the binary's resident pages, unless GOMEMLIMIT is set")
	grace := fs.Duration("shutdown-grace", node.ShutdownGrace, "on SIGTERM: the longest wait for in-flight calls (and half of it for handing partitions over); the node stops as soon as they are done")
	var lim node.Limits
	fs.IntVar(&lim.MaxRequestBytes, "max-request-bytes", node.MaxRequestBytes, "largest request message, bytes (at most the default); larger calls fail with RESOURCE_EXHAUSTED")
	fs.IntVar(&lim.MaxContentBytes, "max-content-bytes", node.MaxContentBytes, "largest content of one item, bytes; larger items fail with INVALID_ARGUMENT")
	maxStreams := fs.Uint("max-streams", 256, "concurrent calls per client connection; more wait in the client")
	fs.DurationVar(&lim.KeepaliveMinTime, "keepalive-min-time", 10*time.Second, "shortest interval between a client's keepalive pings; a client pinging more often is disconnected")
	fs.DurationVar(&lim.IdleTimeout, "idle-timeout", 15*time.Minute, "close a connection with no call for this long (negative: never)")
	fs.DurationVar(&lim.PingInterval, "ping-interval", time.Minute, "ping a connection silent for this long, and close it if the ping is not answered within --ping-timeout")
	fs.DurationVar(&lim.PingTimeout, "ping-timeout", 20*time.Second, "see --ping-interval")
	statsZone := fs.String("stats-timezone", "", "IANA time zone (e.g. Asia/Shanghai) whose calendar days usage statistics are kept in besides UTC's (default: UTC only)")
	statsDays := fs.Int("stats-days", statsusage.DefaultDays, "calendar days of usage statistics kept per zone, today included; older days are dropped whole")
	fs.IntVar(&lim.MaxWatchers, "max-watchers", 4096, "concurrent ring watches (one per client); more fail with RESOURCE_EXHAUSTED")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring serve [flags]\n\nRuns a node until SIGINT or SIGTERM, then finishes in-flight calls and exits.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *configPath != "" {
		if err := applyConfigFile(fs, *configPath); err != nil {
			return err
		}
	}
	var seeds []string
	if *join != "" {
		seeds = strings.Split(*join, ",")
	}
	policies := map[string]wal.SyncPolicy{"batch": wal.SyncBatch, "interval": wal.SyncInterval, "none": wal.SyncNone}
	policy, ok := policies[*syncPolicy]
	if !ok {
		return usagef("sync %q is not one of batch, interval, none", *syncPolicy)
	}

	budget, budgetFrom, err := maxMemory(*maxMem, os.DirFS("/"))
	if err != nil {
		return err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usagef("log level %q is not one of debug, info, warn, error", *logLevel)
	}
	if *checkConfig {
		level = max(level, slog.LevelWarn) // a check prints its verdict, not the start-up log
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *shards != 0 {
		logger.Warn("--shards is deprecated and ignored: the store has one lock per ring partition (271 by default)", "shards", *shards)
	}

	if mode := hugePageMode(os.DirFS("/")); mode == "never" || (*heapSlabs && mode != "" && mode != "always") {
		logger.Info("the store's records get no transparent huge pages: with millions of recipients, decisions and restarts are slower (at 100M here, 2.7x per decision); see docs/configuration.md, Memory limit", "thp", mode, "heap_slabs", *heapSlabs)
	}
	followLimit := false
	if budget > 0 && !*checkConfig {
		if env := os.Getenv("GOMEMLIMIT"); env != "" {
			logger.Info("GOMEMLIMIT is set: the Go runtime's memory limit is left to it; it must leave room for the store's records, which are outside the Go heap (freqring_store_mapped_bytes) unless --heap-slabs", "GOMEMLIMIT", env)
		} else {
			debug.SetMemoryLimit(budget)
			followLimit = true
		}
	}
	logger.Info("memory budget", "max_memory", budget, "from", budgetFrom, "store_limit", node.StoreBudget(budget))

	rs := rules.Default()
	if *rulesPath != "" {
		if rs, err = rules.Load(*rulesPath); err != nil {
			return err
		}
	}
	repl, err := node.ParseReplication(*replication)
	if err != nil {
		return usagef("replication %q is not one of sync, async, off", *replication)
	}
	if *maxStreams < 1 || *maxStreams > 1<<20 {
		return usagef("--max-streams %d out of range [1, %d]", *maxStreams, 1<<20)
	}
	lim.MaxStreams = uint32(*maxStreams)
	if *grace <= 0 {
		return usagef("--shutdown-grace %v is not positive", *grace)
	}
	nc := node.Config{
		Limits: lim, ShutdownGrace: *grace,
		Replication: repl, AsyncBound: *asyncBound,
		Rules: rs, SweepInterval: *sweep, Logger: logger,
		DataDir: *dataDir, Sync: policy, SyncInterval: *syncInterval, PlainFsync: *plainFsync, HeapSlabs: *heapSlabs,
		SnapshotInterval: *snapInterval, SnapshotWALBytes: *snapBytes, SkipCorrupt: *skipCorrupt,
		Name: *name, AdvertiseAddr: *advertise, MaxMemory: budget,
	}
	nc.DropRemovedDomains = *dropRemoved
	if *statsDays < 1 || *statsDays > statsusage.MaxDays {
		return usagef("--stats-days %d out of range [1, %d]", *statsDays, statsusage.MaxDays)
	}
	nc.StatsDays = *statsDays
	if *statsZone != "" {
		if nc.StatsZone, err = time.LoadLocation(*statsZone); err != nil {
			return usagef("--stats-timezone %q: %v", *statsZone, err)
		}
	}
	if *gossipBind != "" || len(seeds) > 0 {
		gc, err := gossipConfig(*gossipBind, *gossipAdv, seeds, *rejoin)
		if err != nil {
			return err
		}
		nc.Cluster = gc
	}
	if nc.Name == "" {
		// The default name, resolved here: the node signs its peer calls
		// with it.
		if nc.Name, err = os.Hostname(); err != nil {
			return fmt.Errorf("--name is not set and the host name is unknown: %w", err)
		}
	}
	sec, err := serveSecurity(&nc, tf, auth, logger)
	if err != nil {
		return err
	}
	obs := metrics.NewObserver()
	nc.Observer = obs
	adminTLS, err := af.serverTLS(tf, logger)
	if err != nil {
		return err
	}
	httpTLS, err := hf.serverTLS(tf, logger)
	if err != nil {
		return err
	}
	var adminAddr string
	if af.enabled() {
		if adminAddr, err = af.addr(0); err != nil {
			return err
		}
	}
	if *hf.rls {
		nc.Services = append(nc.Services, registerRLS(logger))
	}
	n, err := node.New(nc)
	if err != nil {
		return err
	}
	if *checkConfig {
		fmt.Fprintln(stdout, "configuration ok")
		return nil
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if adminAddr != "" {
		admin, err := startAdmin(adminAddr, adminHandler(metrics.NewRegistry(n, obs), n.Serving, *af.pprof), adminTLS, logger)
		if err != nil {
			lis.Close()
			return err
		}
		defer admin.stop()
	}
	if *hf.listen != "" {
		gw, err := startHTTPGateway(*hf.listen, n, hf, httpTLS, logger)
		if err != nil {
			lis.Close()
			return err
		}
		defer gw.stop()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if followLimit {
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
		defer follower.Wait()
		defer cancel()
	}
	var rulesWatcher sync.WaitGroup
	rctx, cancelRules := context.WithCancel(ctx)
	rulesWatcher.Go(func() { watchRules(rctx, *rulesPath, rs, *rulesWatch, n, logger) })
	defer rulesWatcher.Wait()
	defer cancelRules()
	var watchers sync.WaitGroup
	wctx, cancelWatch := context.WithCancel(ctx)
	sec.watch(wctx, &watchers, logger)
	defer watchers.Wait()
	defer cancelWatch()
	return n.Serve(ctx, lis)
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
