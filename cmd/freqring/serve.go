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
	"strconv"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/wal"
)

// serveConfig is the config file of "freqring serve"; flags override it.
type serveConfig struct {
	Listen           string        `yaml:"listen"`             // gRPC address
	Rules            string        `yaml:"rules"`              // rules file; empty: embedded defaults
	Shards           int           `yaml:"shards"`             // per domain, a power of two
	SweepInterval    time.Duration `yaml:"sweep_interval"`     // idle-record reclaim period
	LogLevel         string        `yaml:"log_level"`          // debug, info, warn, error
	DataDir          string        `yaml:"data_dir"`           // WAL and snapshots; empty: memory only
	Sync             string        `yaml:"sync"`               // batch, interval, none
	SyncInterval     time.Duration `yaml:"sync_interval"`      // with sync: interval
	SnapshotInterval time.Duration `yaml:"snapshot_interval"`  // longest time between snapshots
	SnapshotWALBytes int64         `yaml:"snapshot_wal_bytes"` // WAL growth that triggers a snapshot
	SkipCorrupt      bool          `yaml:"skip_corrupt"`       // start past damaged WAL or snapshot data
	Name             string        `yaml:"name"`               // node name in the ring
	Advertise        string        `yaml:"advertise"`          // gRPC address peers and clients reach
	Gossip           string        `yaml:"gossip"`             // gossip bind host:port
	GossipAdvertise  string        `yaml:"gossip_advertise"`   // gossip address peers reach
	Join             []string      `yaml:"join"`               // seeds: host:port or DNS names
	RejoinInterval   time.Duration `yaml:"rejoin_interval"`    // periodic rejoin to heal partitions
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML config file with the flags' names as keys, dashes as underscores (listen, rules, data_dir, ...); flags override it")
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC listen address")
	rulesPath := fs.String("rules", "", "rules file (default: the embedded default rules)")
	shards := fs.Int("shards", 256, "lock shards per domain, a power of two")
	sweep := fs.Duration("sweep-interval", time.Minute, "how often idle records are reclaimed (negative disables)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	dataDir := fs.String("data-dir", "", "directory of the write-ahead log and snapshots (default: memory only, a restart forgets every send)")
	syncPolicy := fs.String("sync", "batch", "WAL fsync policy: batch (fsync before each reply), interval (every --sync-interval), none (leave it to the OS)")
	syncInterval := fs.Duration("sync-interval", 10*time.Millisecond, "fsync period with --sync interval")
	snapInterval := fs.Duration("snapshot-interval", time.Minute, "longest time between snapshots (negative: only on shutdown and by size)")
	snapBytes := fs.Int64("snapshot-wal-bytes", 64<<20, "take a snapshot once the WAL has grown this many bytes (negative disables)")
	skipCorrupt := fs.Bool("skip-corrupt", false, "start past damaged sealed WAL segments or a damaged snapshot, logging what is skipped, instead of refusing")
	name := fs.String("name", "", "node name in the ring, unique and stable across restarts (default: the host name)")
	advertise := fs.String("advertise", "", "gRPC host:port peers and clients reach this node at (default: the listen address)")
	gossipBind := fs.String("gossip", "", "gossip (memberlist, TCP and UDP) bind host:port; setting it or --join makes the node a cluster member")
	gossipAdv := fs.String("gossip-advertise", "", "gossip host:port peers reach this node at (default: the bind address)")
	join := fs.String("join", "", "comma-separated seeds to join: host:port of peers' gossip, or DNS names resolving to several")
	rejoin := fs.Duration("rejoin-interval", gossip.DefaultRejoinInterval, "how often to join the seeds again, to heal a split cluster (negative disables)")
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
	cfg := serveConfig{Listen: *listen, Rules: *rulesPath, Shards: *shards, SweepInterval: *sweep, LogLevel: *logLevel,
		DataDir: *dataDir, Sync: *syncPolicy, SyncInterval: *syncInterval, SnapshotInterval: *snapInterval,
		SnapshotWALBytes: *snapBytes, SkipCorrupt: *skipCorrupt, Name: *name, Advertise: *advertise,
		Gossip: *gossipBind, GossipAdvertise: *gossipAdv, RejoinInterval: *rejoin}
	if *join != "" {
		cfg.Join = strings.Split(*join, ",")
	}
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
		if !set["data-dir"] && fileCfg.DataDir != "" {
			cfg.DataDir = fileCfg.DataDir
		}
		if !set["sync"] && fileCfg.Sync != "" {
			cfg.Sync = fileCfg.Sync
		}
		if !set["sync-interval"] && fileCfg.SyncInterval != 0 {
			cfg.SyncInterval = fileCfg.SyncInterval
		}
		if !set["snapshot-interval"] && fileCfg.SnapshotInterval != 0 {
			cfg.SnapshotInterval = fileCfg.SnapshotInterval
		}
		if !set["snapshot-wal-bytes"] && fileCfg.SnapshotWALBytes != 0 {
			cfg.SnapshotWALBytes = fileCfg.SnapshotWALBytes
		}
		if !set["skip-corrupt"] && fileCfg.SkipCorrupt {
			cfg.SkipCorrupt = true
		}
		for flagName, pair := range map[string][2]*string{
			"name": {&cfg.Name, &fileCfg.Name}, "advertise": {&cfg.Advertise, &fileCfg.Advertise},
			"gossip": {&cfg.Gossip, &fileCfg.Gossip}, "gossip-advertise": {&cfg.GossipAdvertise, &fileCfg.GossipAdvertise},
		} {
			if !set[flagName] && *pair[1] != "" {
				*pair[0] = *pair[1]
			}
		}
		if !set["join"] && len(fileCfg.Join) > 0 {
			cfg.Join = fileCfg.Join
		}
		if !set["rejoin-interval"] && fileCfg.RejoinInterval != 0 {
			cfg.RejoinInterval = fileCfg.RejoinInterval
		}
	}
	policies := map[string]wal.SyncPolicy{"batch": wal.SyncBatch, "interval": wal.SyncInterval, "none": wal.SyncNone}
	policy, ok := policies[cfg.Sync]
	if !ok {
		return usagef("sync %q is not one of batch, interval, none", cfg.Sync)
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
	nc := node.Config{
		Rules: rules, Shards: cfg.Shards, SweepInterval: cfg.SweepInterval, Logger: logger,
		DataDir: cfg.DataDir, Sync: policy, SyncInterval: cfg.SyncInterval,
		SnapshotInterval: cfg.SnapshotInterval, SnapshotWALBytes: cfg.SnapshotWALBytes, SkipCorrupt: cfg.SkipCorrupt,
		Name: cfg.Name, AdvertiseAddr: cfg.Advertise,
	}
	if cfg.Gossip != "" || len(cfg.Join) > 0 {
		gc, err := gossipConfig(cfg.Gossip, cfg.GossipAdvertise, cfg.Join, cfg.RejoinInterval)
		if err != nil {
			return err
		}
		nc.Cluster = gc
	}
	n, err := node.New(nc)
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
