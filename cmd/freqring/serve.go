package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/freqring/freqring/node"
)

// serveConfig is the config file of "freqring serve"; flags override it.
type serveConfig struct {
	Listen        string        `yaml:"listen"`         // gRPC address
	Rules         string        `yaml:"rules"`          // rules file; empty: embedded defaults
	Shards        int           `yaml:"shards"`         // per domain, a power of two
	SweepInterval time.Duration `yaml:"sweep_interval"` // idle-record reclaim period
	LogLevel      string        `yaml:"log_level"`      // debug, info, warn, error
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML config file (keys: listen, rules, shards, sweep_interval, log_level); flags override it")
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC listen address")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded default rules)")
	shards := fs.Int("shards", 256, "lock shards per domain, a power of two")
	sweep := fs.Duration("sweep-interval", time.Minute, "how often idle records are reclaimed (negative disables)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
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
	cfg := serveConfig{Listen: *listen, Rules: *rulesPath, Shards: *shards, SweepInterval: *sweep, LogLevel: *logLevel}
	if *configPath != "" {
		fileCfg, err := readServeConfig(*configPath)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["listen"] && fileCfg.Listen != "" {
			cfg.Listen = fileCfg.Listen
		}
		if !set["rules"] && fileCfg.Rules != "" {
			cfg.Rules = fileCfg.Rules
		}
		if !set["shards"] && fileCfg.Shards != 0 {
			cfg.Shards = fileCfg.Shards
		}
		if !set["sweep-interval"] && fileCfg.SweepInterval != 0 {
			cfg.SweepInterval = fileCfg.SweepInterval
		}
		if !set["log-level"] && fileCfg.LogLevel != "" {
			cfg.LogLevel = fileCfg.LogLevel
		}
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return usagef("log level %q is not one of debug, info, warn, error", cfg.LogLevel)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	rules := node.DefaultRules()
	if cfg.Rules != "" {
		var err error
		if rules, err = node.LoadRules(cfg.Rules); err != nil {
			return err
		}
	}
	n, err := node.New(node.Config{Rules: rules, Shards: cfg.Shards, SweepInterval: cfg.SweepInterval, Logger: logger})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return n.Serve(ctx, lis)
}

func readServeConfig(path string) (serveConfig, error) {
	var c serveConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && err != io.EOF {
		return c, fmt.Errorf("%s: %v", path, err)
	}
	return c, nil
}
