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
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// apiBenchOptions are the bench flags of --workload api.
type apiBenchOptions struct {
	benchTargetFlags
	algorithm         string
	refund            bool
	policy            client.FailurePolicy
	workload          bench.APIWorkload
	run               bench.Config
	rate              float64
	maxDelay          time.Duration
	unary, quiet      bool
	jsonPath, svgPath string
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

// benchAPI runs bench --workload api: the api workload against each target
// in turn, then prints and writes the reports.
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
	reports, err := o.runTargets(ctx, cfg, rs, stdout, stderr)
	if err != nil {
		return err
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
	rep := make([]*bench.Report, len(reports))
	for i, r := range reports {
		rep[i] = r.Report
	}
	return finishBench(stdout, o.svgPath, rep)
}

// runTargets runs cfg against each target in turn (rs is the rule set of
// cfg.Rules, for a local cluster), until the last or until ctx ends, and
// returns their reports. It stops at the first target that fails.
func (o *apiBenchOptions) runTargets(ctx context.Context, cfg bench.APIConfig, rs *rules.Set, stdout, stderr io.Writer) ([]*bench.APIReport, error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var reports []*bench.APIReport
	for _, name := range strings.Split(o.targets, ",") {
		t, end, err := o.target(ctx, name, cfg.Rules, rs, logger, stdout)
		if err != nil {
			return nil, err
		}
		r, err := bench.RunAPI(ctx, t, cfg)
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

// target connects to the target called name for the api workload with
// apiRules (rs, their rule set, for a local cluster), starting its cluster
// or Redis if the flags ask; end (nil when nothing was started) stops what
// it started, after the target is closed.
func (o *apiBenchOptions) target(ctx context.Context, name string, apiRules bench.APIRules, rs *rules.Set, logger *slog.Logger, stdout io.Writer) (t bench.APITarget, end func(), err error) {
	switch name {
	case "freqring":
		seeds, dial, end, err := o.freqringSeeds(ctx, rs, logger, stdout)
		if err != nil {
			return nil, nil, err
		}
		ft, err := bench.NewAPIFreqringTarget(ctx, seeds, client.Config{FailurePolicy: o.policy, MaxDelay: o.maxDelay, UnaryChecks: o.unary, DialOptions: dial})
		if err != nil {
			return nil, nil, endThen(end, err)
		}
		ft.Refund = o.refund
		return ft, end, nil
	case "redis":
		if a := apiRules.IP.Algorithm; a != window.FixedWindow && a != window.SlidingCounter {
			return nil, nil, usagef("--target redis runs fixed-window (a counter per key and hour) or sliding-counter (a hash of sub-window counters); %v has no Redis design to compare", a)
		}
		if apiRules.IP.Borrow > 0 || apiRules.User.Borrow > 0 {
			return nil, nil, usagef("--target redis: the rules borrow (borrow %d, %d); the seeds' Redis designs do not", apiRules.IP.Borrow, apiRules.User.Borrow)
		}
		raddr, end, err := o.redisAddress(ctx, stdout)
		if err != nil {
			return nil, nil, err
		}
		rt, err := bench.NewAPIRedisTarget(ctx, raddr, apiRules)
		if err != nil {
			return nil, nil, endThen(end, err)
		}
		return rt, end, nil
	}
	return nil, nil, usagef("--target %q is not one of freqring, redis (with --workload api)", name)
}
