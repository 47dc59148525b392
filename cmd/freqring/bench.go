package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// benchCmd runs freqring bench: the message workload here, the api
// workload in benchAPI.
func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	fp := client.FailOpen
	switch f.policy {
	case "open":
	case "closed":
		fp = client.FailClosed
	default:
		return usagef("--fail %q is not one of open, closed", f.policy)
	}
	if f.workload == "api" {
		return benchAPI(ctx, f.apiOptions(fp), stdout, stderr)
	}
	if f.workload != "messages" {
		return usagef("--workload %q is not one of messages, api", f.workload)
	}
	rs := rules.Default()
	if f.rulesPath != "" {
		if rs, err = rules.Load(f.rulesPath); err != nil {
			return err
		}
	}
	d := rs.Domain(f.domain)
	if d == nil {
		return usagef("--domain %q is not in the rules (%v)", f.domain, rs.Names())
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reports, err := f.runMessages(ctx, rs, d, fp, stdout, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	if err := bench.WriteTable(stdout, reports); err != nil {
		return err
	}
	if f.jsonPath != "" {
		if err := bench.WriteJSON(f.jsonPath, reports); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", f.jsonPath)
	}
	return finishBench(stdout, f.svgPath, reports)
}

// benchTargetFlags are the bench flags that say where the targets are, or
// which to start, shared by both workloads.
type benchTargetFlags struct {
	targets, addr, redisAddr string
	startRedis               bool
	startCluster             int
	replication, rulesPath   string
	dataDir, durability      string
	tls                      *tlsFlags

	// stages, set when freqringSeeds started a cluster, is where its nodes
	// report each stage of their calls.
	stages *bench.Stages
}

// benchFlags holds the flags of freqring bench, as parsed. The define
// methods name each field's flag and default.
type benchFlags struct {
	benchTargetFlags
	domain string

	// the message workload (and the api workload's zipf and seed)
	recipients, templates int
	zipf                  float64
	seed                  uint64

	// the api workload
	workload, algorithm          string
	apps, ips, users, interfaces int
	refund                       bool

	// the run
	concurrency, batch int
	rate               float64
	warmup, duration   time.Duration
	maxOps             int64
	audit, quiet       bool
	jsonPath, svgPath  string

	// the freqring client
	policy   string
	maxDelay time.Duration
	unary    bool
}

// parseBenchFlags defines bench's flags and parses args into them (usage to
// stderr on -h).
func parseBenchFlags(args []string, stderr io.Writer) (*benchFlags, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	f := &benchFlags{}
	f.defineTargets(fs)
	f.defineWorkload(fs)
	f.defineRun(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring bench [flags]\n\nWith --workload api, runs an open-platform API workload (each call checks app+ip in domain\napi-ip, 10,000 an hour, and app+user+interface in api-user, 1,000 an hour; --zipf 0 means 1.1 there,\nnegative uniform) against freqring and/or Redis (--target freqring,redis).\nOtherwise, runs the message workload (recipients drawn over --recipients, --templates contents, the\ndefault rules) against freqring and/or Redis running the sorted-set design, and prints\ndecisions/s, latency percentiles, memory per recipient and the over-admission count.\nIt starts nothing unless --start-cluster or --start-redis asks.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q", fs.Arg(0))
	}
	return f, nil
}

// defineTargets defines the flags of the targets, the rules and the
// freqring client.
func (f *benchFlags) defineTargets(fs *flag.FlagSet) {
	fs.StringVar(&f.targets, "target", "freqring", "comma-separated targets, run one after the other on the same workload: freqring, redis (the four-key script), redis-per-rule (the original one-rule script, once per rule)")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7070", "comma-separated gRPC addresses of freqring nodes (the client learns the ring from them)")
	fs.StringVar(&f.redisAddr, "redis", "127.0.0.1:6379", "Redis address")
	fs.BoolVar(&f.startRedis, "start-redis", false, "start a local redis-server on 127.0.0.1 for the run (Debian's redis-server), instead of using --redis")
	fs.IntVar(&f.startCluster, "start-cluster", 0, "start a local freqring cluster of this many nodes in this process, instead of using --addr")
	fs.StringVar(&f.replication, "replication", "sync", "with --start-cluster: the cluster's replication, sync, async or off")
	fs.StringVar(&f.durability, "durability", "replicated", "with --start-cluster: the durability of its domains, fsync, replicated or async (docs/durability.md); without --data-dir, only whether a reply waits for the backup")
	fs.StringVar(&f.dataDir, "data-dir", "", "with --start-cluster: node NAME keeps its WAL and snapshots in DIR/NAME (default: memory-only nodes)")
	fs.StringVar(&f.rulesPath, "rules", "", "rules file (default: the embedded rules); its domain's rules drive Redis and the oracle")
	fs.StringVar(&f.domain, "domain", "default", "domain of every check")
	fs.StringVar(&f.policy, "fail", "open", "freqring client failure policy: open or closed")
	fs.DurationVar(&f.maxDelay, "max-delay", 0, "freqring client: how long each coalesced RPC waits for more single checks after its first (0 or negative: no wait, the client's default)")
	fs.BoolVar(&f.unary, "unary", false, "freqring client: send coalesced single checks and batches as unary Check RPCs instead of on CheckStreams (for comparison)")
	f.tls = addTLSFlags(fs, false)
}

// defineWorkload defines the flags of the message and api workloads.
func (f *benchFlags) defineWorkload(fs *flag.FlagSet) {
	fs.IntVar(&f.recipients, "recipients", 1_000_000, "recipient population")
	fs.Float64Var(&f.zipf, "zipf", 0, "recipient skew: 0 uniform, or Zipf's s > 1")
	fs.IntVar(&f.templates, "templates", 20, "distinct message contents")
	fs.Uint64Var(&f.seed, "seed", 1, "workload seed")
	fs.StringVar(&f.workload, "workload", "messages", "messages (recipients and message templates) or api (app+ip and app+user+interface keys, two checks a call)")
	fs.StringVar(&f.algorithm, "algorithm", "fixed-window", "--workload api: the rules' algorithm, fixed-window (--target redis runs a counter per key and hour in one Lua script), sliding-counter (--target redis runs a Redis hash of sixty one-minute counters), token-bucket, leaky-bucket or gcra (freqring only: no Redis design to compare); ignored with --rules")
	fs.IntVar(&f.apps, "apps", 100, "--workload api: apps")
	fs.IntVar(&f.ips, "ips", 10_000, "--workload api: client IPs")
	fs.IntVar(&f.users, "users", 100_000, "--workload api: users")
	fs.IntVar(&f.interfaces, "interfaces", 50, "--workload api: interfaces")
	fs.BoolVar(&f.refund, "refund", false, "--workload api, freqring: refund a key's admission when the call's other key denies it (so that it counts allowed calls only, as the Redis scripts do)")
}

// defineRun defines the flags of the load, its duration and the output.
func (f *benchFlags) defineRun(fs *flag.FlagSet) {
	fs.IntVar(&f.concurrency, "concurrency", 64, "calls in flight")
	fs.IntVar(&f.batch, "batch", 100, "items per call (1: single checks, which the freqring client coalesces)")
	fs.Float64Var(&f.rate, "rate", 0, "open loop at this many decisions/s, latency measured from each call's intended start; 0 is a closed loop")
	fs.DurationVar(&f.warmup, "warmup", 2*time.Second, "sent but not measured")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "measured time")
	fs.Int64Var(&f.maxOps, "max-ops", 0, "stop after this many measured decisions (0: no bound)")
	fs.BoolVar(&f.audit, "audit", true, "keep every admitted send and replay them against the rules (the over-admission oracle)")
	fs.StringVar(&f.jsonPath, "json", "", "write the reports as JSON to this file")
	fs.StringVar(&f.svgPath, "svg", "", "write a chart (throughput and p99 over time, latency distribution) to this SVG file")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress lines")
}

// apiOptions returns the options of benchAPI, with the client's failure
// policy fp.
func (f *benchFlags) apiOptions(fp client.FailurePolicy) apiBenchOptions {
	return apiBenchOptions{
		benchTargetFlags: f.benchTargetFlags, algorithm: f.algorithm, refund: f.refund, policy: fp,
		workload: bench.APIWorkload{Apps: f.apps, IPs: f.ips, Users: f.users, Interfaces: f.interfaces, Zipf: f.zipf, Seed: f.seed},
		run:      bench.Config{Concurrency: f.concurrency, Batch: f.batch, Warmup: f.warmup, Duration: f.duration, MaxOps: f.maxOps, Audit: f.audit},
		rate:     f.rate, maxDelay: f.maxDelay, unary: f.unary, quiet: f.quiet, jsonPath: f.jsonPath, svgPath: f.svgPath,
	}
}

// runMessages runs the message workload against each target in turn, on
// domain d of rs, until the last or until ctx ends, and returns their
// reports. It stops at the first target that fails.
func (f *benchFlags) runMessages(ctx context.Context, rs *rules.Set, d *window.Domain, fp client.FailurePolicy, stdout, stderr io.Writer) ([]*bench.Report, error) {
	cfg := bench.Config{
		Workload:    bench.Workload{Recipients: f.recipients, Zipf: f.zipf, Templates: f.templates, Domain: f.domain, Seed: f.seed},
		Rules:       d.Rules(),
		Concurrency: f.concurrency, Batch: f.batch, Rate: f.rate, Warmup: f.warmup, Duration: f.duration, MaxOps: f.maxOps,
		Audit: f.audit,
	}
	if !f.quiet {
		cfg.Progress = stdout
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var reports []*bench.Report
	for _, name := range strings.Split(f.targets, ",") {
		f.stages = nil
		t, end, err := f.messageTarget(ctx, name, rs, d, fp, logger, stdout)
		if err != nil {
			return nil, err
		}
		run := cfg
		run.Stages = f.stages
		r, err := bench.Run(ctx, t, run)
		t.Close()
		if end != nil {
			end()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		reports = append(reports, r)
		if ctx.Err() != nil {
			break
		}
	}
	return reports, nil
}

// messageTarget connects to the target called name for the message
// workload on domain d of rs, starting its cluster or Redis if the flags
// ask; end (nil when nothing was started) stops what it started, after the
// target is closed.
func (f *benchFlags) messageTarget(ctx context.Context, name string, rs *rules.Set, d *window.Domain, fp client.FailurePolicy, logger *slog.Logger, stdout io.Writer) (t bench.Target, end func(), err error) {
	switch name {
	case "freqring":
		seeds, dial, end, err := f.freqringSeeds(ctx, rs, logger, stdout)
		if err != nil {
			return nil, nil, err
		}
		ft, err := bench.NewFreqringTarget(ctx, seeds, f.domain, f.templates, client.Config{FailurePolicy: fp, MaxDelay: f.maxDelay, UnaryChecks: f.unary, DialOptions: dial})
		if err != nil {
			return nil, nil, endThen(end, err)
		}
		return ft, end, nil
	case "redis", "redis-per-rule":
		raddr, end, err := f.redisAddress(ctx, stdout)
		if err != nil {
			return nil, nil, err
		}
		mode := bench.RedisMerged
		if name == "redis-per-rule" {
			mode = bench.RedisPerRule
		}
		rt, err := bench.NewRedisTarget(ctx, raddr, mode, d.Rules(), f.templates)
		if err != nil {
			return nil, nil, endThen(end, err)
		}
		return rt, end, nil
	}
	return nil, nil, usagef("--target %q is not one of freqring, redis, redis-per-rule", name)
}

// endThen calls end, if not nil, and returns err: for a target that failed
// after what it needs was started.
func endThen(end func(), err error) error {
	if end != nil {
		end()
	}
	return err
}

// freqringSeeds returns the gRPC addresses of the freqring nodes to bench
// and the options to dial them: the nodes at --addr or, with
// --start-cluster, those of a local cluster of rs that it starts in this
// process, announced on stdout; end (nil when none) stops that cluster.
func (f *benchTargetFlags) freqringSeeds(ctx context.Context, rs *rules.Set, logger *slog.Logger, stdout io.Writer) (seeds []string, dial []grpc.DialOption, end func(), err error) {
	seeds = strings.Split(f.addr, ",")
	if dial, err = f.tls.dialOptions(logger); err != nil {
		return nil, nil, nil, err
	}
	if f.startCluster > 0 && f.tls.enabled() {
		return nil, nil, nil, usagef("the --tls-* flags are for the nodes at --addr; --start-cluster starts plaintext nodes")
	}
	if f.startCluster == 0 {
		return seeds, dial, nil, nil
	}
	if f.startCluster > 50 {
		return nil, nil, nil, usagef("--start-cluster %d out of range [1, 50]", f.startCluster)
	}
	repl, err := node.ParseReplication(f.replication)
	if err != nil {
		return nil, nil, nil, usagef("--replication %q is not one of sync, async, off", f.replication)
	}
	dur, err := rules.ParseDurability(f.durability)
	if err != nil || dur == rules.DurabilityDefault {
		return nil, nil, nil, usagef("--durability %q is not one of fsync, replicated, async", f.durability)
	}
	f.stages = new(bench.Stages)
	obs := newStageObserver(f.stages)
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: f.startCluster, Rules: rs, NamePrefix: "bench-", DataDir: f.dataDir,
		Node:   func(cfg *node.Config) { cfg.Replication, cfg.Durability, cfg.Observer = repl, dur, obs },
		Gossip: &gossip.Config{BindAddr: "127.0.0.1"}, Logger: logger})
	if err != nil {
		return nil, nil, nil, err
	}
	seeds = lc.Addrs()
	fmt.Fprintf(stdout, "started a local cluster of %d nodes: %s\n", f.startCluster, strings.Join(seeds, ", "))
	return seeds, dial, func() { lc.Close() }, nil
}

// stageObserver is a node.Observer that gives each stage's time to its
// bench histogram; its other hooks do nothing. Safe for concurrent use.
type stageObserver [][]*bench.StageHistogram // by node.Call, then node.Stage

// newStageObserver returns a stageObserver of a histogram in s per stage
// of each call.
func newStageObserver(s *bench.Stages) stageObserver {
	var o stageObserver
	for _, c := range node.Calls() {
		hs := make([]*bench.StageHistogram, node.NumStages) // by stage
		for _, st := range node.StagesOf(c) {
			hs[st] = s.Add(c.String(), st.String())
		}
		o = append(o, hs)
	}
	return o
}

func (o stageObserver) Stage(c node.Call, s node.Stage, d time.Duration) {
	if int(c) < len(o) && int(s) < node.NumStages && o[c][s] != nil {
		o[c][s].Observe(d)
	}
}
func (o stageObserver) CheckDone(int, time.Duration) {}
func (o stageObserver) Fsync(time.Duration)          {}
func (o stageObserver) Snapshot(time.Duration)       {}
func (o stageObserver) Recovery(time.Duration)       {}

// redisAddress returns the address of the Redis to bench: --redis or, with
// --start-redis, that of a redis-server it starts, announced on stdout; end
// (nil when none) stops that server.
func (f *benchTargetFlags) redisAddress(ctx context.Context, stdout io.Writer) (addr string, end func(), err error) {
	if !f.startRedis {
		return f.redisAddr, nil, nil
	}
	lr, err := bench.StartRedis(ctx)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(stdout, "started redis-server on %s\n", lr.Addr)
	return lr.Addr, lr.Stop, nil
}

// finishBench writes the chart of reports to svgPath (none when empty),
// saying so on stdout, and fails when a target over-admitted.
func finishBench(stdout io.Writer, svgPath string, reports []*bench.Report) error {
	if svgPath != "" {
		if err := bench.WriteSVG(svgPath, reports); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", svgPath)
	}
	for _, r := range reports {
		if r.OverAdmissions > 0 {
			return fmt.Errorf("%s over-admitted %d sends", r.Target, r.OverAdmissions)
		}
	}
	return nil
}
