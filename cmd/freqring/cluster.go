package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"sync"
	"syscall"

	"github.com/freqring/freqring/metrics"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
)

// cluster runs a local cluster of n nodes in this process, for trying
// freqring out: node i serves gRPC on 127.0.0.1:port+i and gossips on
// 127.0.0.1:port+100+i, and every node joins node 0. With --admin-listen
// (default 127.0.0.1:9090), node i serves /metrics, /livez and /readyz on
// the admin port + i.
func cluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	size := fs.Int("n", 3, "number of nodes")
	port := fs.Int("port", 7070, "gRPC port of node 0; node i uses port+i, and gossips on port+100+i")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded default rules)")
	dataDir := fs.String("data-dir", "", "if set, node i keeps its WAL and snapshots in DIR/node-i")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	tf := addTLSFlags(fs, true)
	af := addAdminFlags(fs, true)
	auth := addAuthFlags(fs, true)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring cluster [flags]\n\nRuns a local cluster on 127.0.0.1 until SIGINT or SIGTERM.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *size < 1 || *size > 50 {
		return usagef("-n %d out of range [1, 50]", *size)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usagef("log level %q is not one of debug, info, warn, error", *logLevel)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	rs := rules.Default()
	if *rulesPath != "" {
		var err error
		if rs, err = rules.Load(*rulesPath); err != nil {
			return err
		}
	}
	nt, err := tf.nodeTLS(true, logger)
	if err != nil {
		return err
	}
	adminTLS, err := af.serverTLS(tf, logger)
	if err != nil {
		return err
	}
	var adminAddrs []string
	if af.enabled() {
		for i := range *size {
			a, err := af.addr(i)
			if err != nil {
				return err
			}
			adminAddrs = append(adminAddrs, a)
		}
	}
	var tokens *tokenFile
	if *auth.adminTokens != "" {
		if tokens, err = loadTokenFile(*auth.adminTokens); err != nil {
			return err
		}
	}
	var obsMu sync.Mutex
	observers := map[string]*metrics.Observer{} // by node name: a restarted node keeps its histograms
	observe := func(cfg *node.Config) {
		nt.apply(cfg)
		if tokens != nil {
			cfg.AdminTokens = tokens
		} else {
			cfg.InsecureAdmin = *auth.insecureAdmin
		}
		obsMu.Lock()
		defer obsMu.Unlock()
		if observers[cfg.Name] == nil {
			observers[cfg.Name] = metrics.NewObserver()
		}
		cfg.Observer = observers[cfg.Name]
		cfg.Services = append(cfg.Services, registerRLS(logger)) // Envoy's rate limit service, as serve
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	lc, err := nodetest.Start(ctx, nodetest.Config{
		Size: *size, Rules: rs, DataDir: *dataDir, Logger: logger, BasePort: *port,
		DialOptions: nt.dial, Node: observe,
		Gossip: &gossip.Config{BindAddr: "127.0.0.1"},
	})
	if err != nil {
		return err
	}
	for i, m := range lc.Members() {
		admin := ""
		if adminAddrs != nil {
			a, err := startAdmin(adminAddrs[i], adminHandler(metrics.NewRegistry(m.Node, observers[m.Name]), m.Node.Serving, *af.pprof), adminTLS, logger)
			if err != nil {
				lc.Close()
				return err
			}
			defer a.stop()
			admin = "  admin " + a.Addr()
		}
		fmt.Fprintf(stdout, "%s  grpc %s  gossip %s%s\n", m.Name, m.Addr, m.GossipAddr, admin)
	}
	fmt.Fprintf(stdout, "\n%d nodes running; try:\n  freqring status --addr 127.0.0.1:%d\n  freqring check --addr 127.0.0.1:%d +8613800000000\nCtrl-C stops them.\n", *size, *port, *port)
	<-ctx.Done()
	return lc.Close()
}
