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

	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
)

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	targets := fs.String("target", "freqring", "comma-separated targets, run one after the other on the same workload: freqring, redis (the four-key script), redis-per-rule (the original one-rule script, once per rule)")
	addr := fs.String("addr", "127.0.0.1:7070", "comma-separated gRPC addresses of freqring nodes (the client learns the ring from them)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	startRedis := fs.Bool("start-redis", false, "start a local redis-server on 127.0.0.1 for the run (Debian's redis-server), instead of using --redis")
	startCluster := fs.Int("start-cluster", 0, "start a local freqring cluster of this many nodes in this process, instead of using --addr")
	replication := fs.String("replication", "sync", "with --start-cluster: the cluster's replication, sync, async or off")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded rules); its domain's rules drive Redis and the oracle")
	domain := fs.String("domain", "default", "domain of every check")
	recipients := fs.Int("recipients", 1_000_000, "recipient population")
	zipf := fs.Float64("zipf", 0, "recipient skew: 0 uniform, or Zipf's s > 1")
	templates := fs.Int("templates", 20, "distinct message contents")
	seed := fs.Uint64("seed", 1, "workload seed")
	concurrency := fs.Int("concurrency", 64, "calls in flight")
	batch := fs.Int("batch", 100, "items per call (1: single checks, which the freqring client coalesces)")
	rate := fs.Float64("rate", 0, "open loop at this many decisions/s, latency measured from each call's intended start; 0 is a closed loop")
	warmup := fs.Duration("warmup", 2*time.Second, "sent but not measured")
	duration := fs.Duration("duration", 10*time.Second, "measured time")
	maxOps := fs.Int64("max-ops", 0, "stop after this many measured decisions (0: no bound)")
	audit := fs.Bool("audit", true, "keep every admitted send and replay them against the rules (the over-admission oracle)")
	jsonPath := fs.String("json", "", "write the reports as JSON to this file")
	svgPath := fs.String("svg", "", "write a chart (throughput and p99 over time, latency distribution) to this SVG file")
	policy := fs.String("fail", "open", "freqring client failure policy: open or closed")
	maxDelay := fs.Duration("max-delay", 0, "freqring client: how long each coalesced RPC waits for more single checks after its first (0 or negative: no wait, the client's default)")
	unary := fs.Bool("unary", false, "freqring client: send coalesced single checks and batches as unary Check RPCs instead of on CheckStreams (for comparison)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	workload := fs.String("workload", "messages", "messages (recipients and message templates) or api (app+ip and app+user+interface keys, two checks a call)")
	algorithm := fs.String("algorithm", "fixed-window", "--workload api: the rules' algorithm, fixed-window (--target redis runs a counter per key and hour in one Lua script), sliding-counter (--target redis runs a Redis hash of sixty one-minute counters), token-bucket, leaky-bucket or gcra (freqring only: no Redis design to compare); ignored with --rules")
	apps := fs.Int("apps", 100, "--workload api: apps")
	ips := fs.Int("ips", 10_000, "--workload api: client IPs")
	users := fs.Int("users", 100_000, "--workload api: users")
	interfaces := fs.Int("interfaces", 50, "--workload api: interfaces")
	refund := fs.Bool("refund", false, "--workload api, freqring: refund a key's admission when the call's other key denies it (so that it counts allowed calls only, as the Redis scripts do)")
	tf := addTLSFlags(fs, false)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring bench [flags]\n\nWith --workload api, runs an open-platform API workload (each call checks app+ip in domain\napi-ip, 10,000 an hour, and app+user+interface in api-user, 1,000 an hour; --zipf 0 means 1.1 there,\nnegative uniform) against freqring and/or Redis (--target freqring,redis).\nOtherwise, runs the message workload (recipients drawn over --recipients, --templates contents, the\ndefault rules) against freqring and/or Redis running the sorted-set design, and prints\ndecisions/s, latency percentiles, memory per recipient and the over-admission count.\nIt starts nothing unless --start-cluster or --start-redis asks.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	fp := client.FailOpen
	switch *policy {
	case "open":
	case "closed":
		fp = client.FailClosed
	default:
		return usagef("--fail %q is not one of open, closed", *policy)
	}
	if *workload == "api" {
		return benchAPI(ctx, apiBenchOptions{
			targets: *targets, addr: *addr, redisAddr: *redisAddr, startRedis: *startRedis, startCluster: *startCluster,
			replication: *replication, rulesPath: *rulesPath, algorithm: *algorithm, refund: *refund, policy: fp, tls: tf,
			workload: bench.APIWorkload{Apps: *apps, IPs: *ips, Users: *users, Interfaces: *interfaces, Zipf: *zipf, Seed: *seed},
			run:      bench.Config{Concurrency: *concurrency, Batch: *batch, Warmup: *warmup, Duration: *duration, MaxOps: *maxOps, Audit: *audit},
			rate:     *rate, maxDelay: *maxDelay, unary: *unary, quiet: *quiet, jsonPath: *jsonPath, svgPath: *svgPath,
		}, stdout, stderr)
	}
	if *workload != "messages" {
		return usagef("--workload %q is not one of messages, api", *workload)
	}
	rs := rules.Default()
	if *rulesPath != "" {
		var err error
		if rs, err = rules.Load(*rulesPath); err != nil {
			return err
		}
	}
	d := rs.Domain(*domain)
	if d == nil {
		return usagef("--domain %q is not in the rules (%v)", *domain, rs.Names())
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfg := bench.Config{
		Workload:    bench.Workload{Recipients: *recipients, Zipf: *zipf, Templates: *templates, Domain: *domain, Seed: *seed},
		Rules:       d.Rules(),
		Concurrency: *concurrency, Batch: *batch, Rate: *rate, Warmup: *warmup, Duration: *duration, MaxOps: *maxOps,
		Audit: *audit,
	}
	if !*quiet {
		cfg.Progress = stdout
	}
	var reports []*bench.Report
	for _, name := range strings.Split(*targets, ",") {
		var (
			t   bench.Target
			err error
			end func()
		)
		switch name {
		case "freqring":
			seeds := strings.Split(*addr, ",")
			dial, derr := tf.dialOptions(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if derr != nil {
				return derr
			}
			if *startCluster > 0 && tf.enabled() {
				return usagef("the --tls-* flags are for the nodes at --addr; --start-cluster starts plaintext nodes")
			}
			if *startCluster > 0 {
				if *startCluster > 50 {
					return usagef("--start-cluster %d out of range [1, 50]", *startCluster)
				}
				repl, err := node.ParseReplication(*replication)
				if err != nil {
					return usagef("--replication %q is not one of sync, async, off", *replication)
				}
				lc, err := nodetest.Start(ctx, nodetest.Config{Size: *startCluster, Rules: rs, NamePrefix: "bench-",
					Node:   func(cfg *node.Config) { cfg.Replication = repl },
					Gossip: &gossip.Config{BindAddr: "127.0.0.1"},
					Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
				if err != nil {
					return err
				}
				end = func() { lc.Close() }
				seeds = lc.Addrs()
				fmt.Fprintf(stdout, "started a local cluster of %d nodes: %s\n", *startCluster, strings.Join(seeds, ", "))
			}
			t, err = bench.NewFreqringTarget(ctx, seeds, *domain, *templates, client.Config{FailurePolicy: fp, MaxDelay: *maxDelay, UnaryChecks: *unary, DialOptions: dial})
		case "redis", "redis-per-rule":
			raddr := *redisAddr
			if *startRedis {
				lr, err := bench.StartRedis(ctx)
				if err != nil {
					return err
				}
				end = lr.Stop
				raddr = lr.Addr
				fmt.Fprintf(stdout, "started redis-server on %s\n", raddr)
			}
			mode := bench.RedisMerged
			if name == "redis-per-rule" {
				mode = bench.RedisPerRule
			}
			t, err = bench.NewRedisTarget(ctx, raddr, mode, d.Rules(), *templates)
		default:
			return usagef("--target %q is not one of freqring, redis, redis-per-rule", name)
		}
		if err != nil {
			if end != nil {
				end()
			}
			return err
		}
		r, err := bench.Run(ctx, t, cfg)
		t.Close()
		if end != nil {
			end()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		reports = append(reports, r)
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Fprintln(stdout)
	if err := bench.WriteTable(stdout, reports); err != nil {
		return err
	}
	if *jsonPath != "" {
		if err := bench.WriteJSON(*jsonPath, reports); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", *jsonPath)
	}
	if *svgPath != "" {
		if err := bench.WriteSVG(*svgPath, reports); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", *svgPath)
	}
	for _, r := range reports {
		if r.OverAdmissions > 0 {
			return fmt.Errorf("%s over-admitted %d sends", r.Target, r.OverAdmissions)
		}
	}
	return nil
}
