package main

import (
	"context"
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
	"github.com/freqring/freqring/window"
)

// apiBenchOptions are the bench flags of --workload api.
type apiBenchOptions struct {
	targets, addr, redisAddr string
	startRedis               bool
	startCluster             int
	replication, rulesPath   string
	algorithm                string
	refund                   bool
	policy                   client.FailurePolicy
	tls                      *tlsFlags
	workload                 bench.APIWorkload
	run                      bench.Config
	rate                     float64
	maxDelay                 time.Duration
	unary, quiet             bool
	jsonPath, svgPath        string
}

// apiRules returns the two rules of the api workload: the first rule of
// domains api-ip and api-user of the rules file, or seed 004's limits with
// the algorithm.
func (o *apiBenchOptions) apiRules() (bench.APIRules, *rules.Set, error) {
	if o.rulesPath == "" {
		alg, err := window.ParseAlgorithm(o.algorithm)
		if err != nil || alg == window.SlidingLog {
			return bench.APIRules{}, nil, usagef("--algorithm %q is not one of fixed-window, sliding-counter, token-bucket, leaky-bucket, gcra", o.algorithm)
		}
		r := bench.DefaultAPIRules(alg)
		rs, err := r.RuleSet()
		return r, rs, err
	}
	rs, err := rules.Load(o.rulesPath)
	if err != nil {
		return bench.APIRules{}, nil, err
	}
	var r bench.APIRules
	for _, d := range []struct {
		name string
		dst  *window.Rule
	}{{bench.APIIPDomain, &r.IP}, {bench.APIUserDomain, &r.User}} {
		dom := rs.Domain(d.name)
		if dom == nil || len(dom.Rules()) != 1 {
			return r, nil, usagef("--workload api: the rules file needs domains %s and %s of one rule each", bench.APIIPDomain, bench.APIUserDomain)
		}
		*d.dst = dom.Rules()[0]
	}
	return r, rs, r.Validate()
}

func benchAPI(ctx context.Context, o apiBenchOptions, stdout, stderr io.Writer) error {
	if o.rate != 0 {
		return usagef("--workload api runs a closed loop: --rate is not supported")
	}
	apiRules, rs, err := o.apiRules()
	if err != nil {
		return err
	}
	if o.workload.Zipf == 0 {
		o.workload.Zipf = 1.1
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := bench.APIConfig{Workload: o.workload, Rules: apiRules, Run: o.run}
	if !o.quiet {
		cfg.Run.Progress = stdout
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var reports []*bench.APIReport
	for _, name := range strings.Split(o.targets, ",") {
		var (
			t   bench.APITarget
			end func()
		)
		switch name {
		case "freqring":
			seeds := strings.Split(o.addr, ",")
			dial, err := o.tls.dialOptions(logger)
			if err != nil {
				return err
			}
			if o.startCluster > 0 && o.tls.enabled() {
				return usagef("the --tls-* flags are for the nodes at --addr; --start-cluster starts plaintext nodes")
			}
			if o.startCluster > 0 {
				if o.startCluster > 50 {
					return usagef("--start-cluster %d out of range [1, 50]", o.startCluster)
				}
				repl, err := node.ParseReplication(o.replication)
				if err != nil {
					return usagef("--replication %q is not one of sync, async, off", o.replication)
				}
				lc, err := nodetest.Start(ctx, nodetest.Config{Size: o.startCluster, Rules: rs, NamePrefix: "bench-",
					Node:   func(cfg *node.Config) { cfg.Replication = repl },
					Gossip: &gossip.Config{BindAddr: "127.0.0.1"}, Logger: logger})
				if err != nil {
					return err
				}
				end = func() { lc.Close() }
				seeds = lc.Addrs()
				fmt.Fprintf(stdout, "started a local cluster of %d nodes: %s\n", o.startCluster, strings.Join(seeds, ", "))
			}
			ft, err := bench.NewAPIFreqringTarget(ctx, seeds, client.Config{FailurePolicy: o.policy, MaxDelay: o.maxDelay, UnaryChecks: o.unary, DialOptions: dial})
			if err != nil {
				if end != nil {
					end()
				}
				return err
			}
			ft.Refund = o.refund
			t = ft
		case "redis":
			if a := apiRules.IP.Algorithm; a != window.FixedWindow && a != window.SlidingCounter {
				return usagef("--target redis runs fixed-window (a counter per key and hour) or sliding-counter (a hash of sub-window counters); %v has no Redis design to compare", a)
			}
			if apiRules.IP.Borrow > 0 || apiRules.User.Borrow > 0 {
				return usagef("--target redis: the rules borrow (borrow %d, %d); the seeds' Redis designs do not", apiRules.IP.Borrow, apiRules.User.Borrow)
			}
			raddr := o.redisAddr
			if o.startRedis {
				lr, err := bench.StartRedis(ctx)
				if err != nil {
					return err
				}
				end = lr.Stop
				raddr = lr.Addr
				fmt.Fprintf(stdout, "started redis-server on %s\n", raddr)
			}
			rt, err := bench.NewAPIRedisTarget(ctx, raddr, apiRules)
			if err != nil {
				if end != nil {
					end()
				}
				return err
			}
			t = rt
		default:
			return usagef("--target %q is not one of freqring, redis (with --workload api)", name)
		}
		r, err := bench.RunAPI(ctx, t, cfg)
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
	fmt.Fprintf(stdout, "\napi workload: %d apps, %d ips, %d users, %d interfaces, zipf %g; rules (%s) %d/%v per (app, ip), %d/%v per (app, user, interface); a decision is a call of two checks\n",
		cfg.Workload.Apps, cfg.Workload.IPs, cfg.Workload.Users, cfg.Workload.Interfaces, cfg.Workload.Zipf,
		apiRules.IP.Algorithm, apiRules.IP.Limit, apiRules.IP.Window, apiRules.User.Limit, apiRules.User.Window)
	if err := bench.WriteAPITable(stdout, reports); err != nil {
		return err
	}
	if o.jsonPath != "" {
		if err := bench.WriteAPIJSON(o.jsonPath, reports); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", o.jsonPath)
	}
	if o.svgPath != "" {
		rs := make([]*bench.Report, len(reports))
		for i, r := range reports {
			rs[i] = r.Report
		}
		if err := bench.WriteSVG(o.svgPath, rs); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", o.svgPath)
	}
	for _, r := range reports {
		if r.OverAdmissions > 0 {
			return fmt.Errorf("%s over-admitted %d sends", r.Target, r.OverAdmissions)
		}
	}
	return nil
}
