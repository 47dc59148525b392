package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
)

// cluster runs a local cluster of n nodes in this process, for trying
// freqring out: node i serves gRPC on 127.0.0.1:port+i and gossips on
// 127.0.0.1:port+100+i, and every node joins node 0.
func cluster(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	size := fs.Int("n", 3, "number of nodes")
	port := fs.Int("port", 7070, "gRPC port of node 0; node i uses port+i, and gossips on port+100+i")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded default rules)")
	dataDir := fs.String("data-dir", "", "if set, node i keeps its WAL and snapshots in DIR/node-i")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
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
	rules := node.DefaultRules()
	if *rulesPath != "" {
		var err error
		if rules, err = node.LoadRules(*rulesPath); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errs := make([]error, *size)
	for i := range *size {
		name := fmt.Sprintf("node-%d", i)
		addr := fmt.Sprintf("127.0.0.1:%d", *port+i)
		gc := &gossip.Config{BindAddr: "127.0.0.1", BindPort: *port + 100 + i}
		if i > 0 {
			gc.Join = []string{fmt.Sprintf("127.0.0.1:%d", *port+100)}
		}
		cfg := node.Config{Rules: rules, Name: name, AdvertiseAddr: addr, Cluster: gc, Logger: logger}
		if *dataDir != "" {
			cfg.DataDir = filepath.Join(*dataDir, name)
		}
		n, err := node.New(cfg)
		if err != nil {
			return err
		}
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		wg.Go(func() {
			if errs[i] = n.Serve(ctx, lis); errs[i] != nil {
				cancel()
			}
		})
		if i == 0 {
			// Let node 0 bind its gossip port before the others join it.
			if err := waitForRing(ctx, n, 1); err != nil {
				cancel()
				wg.Wait()
				return errors.Join(append(errs, err)...)
			}
		}
		fmt.Fprintf(stdout, "%s  grpc %s  gossip 127.0.0.1:%d\n", name, addr, *port+100+i)
	}
	fmt.Fprintf(stdout, "\n%d nodes running; try:\n  freqring status --addr 127.0.0.1:%d\n  freqring check --addr 127.0.0.1:%d +8613800000000\nCtrl-C stops them.\n", *size, *port, *port)
	wg.Wait()
	return errors.Join(errs...)
}

// waitForRing waits until n has a ring of at least want members.
func waitForRing(ctx context.Context, n *node.Node, want int) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if r := n.Ring(); r != nil && r.Len() >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
