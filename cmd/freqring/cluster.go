package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
	f, err := parseClusterFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return usagef("log level %q is not one of debug, info, warn, error", f.logLevel)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	rs := rules.Default()
	if f.rulesPath != "" {
		if rs, err = rules.Load(f.rulesPath); err != nil {
			return err
		}
	}
	cn, err := f.clusterNodes(logger)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	lc, err := nodetest.Start(ctx, nodetest.Config{
		Size: f.size, Rules: rs, DataDir: f.dataDir, Logger: logger, BasePort: f.port,
		DialOptions: cn.nt.dial, Node: cn.configure,
		Gossip: &gossip.Config{BindAddr: "127.0.0.1"},
	})
	if err != nil {
		return err
	}
	stopAdmins, err := cn.startAdmins(lc, stdout)
	defer stopAdmins()
	if err != nil {
		lc.Close()
		return err
	}
	fmt.Fprintf(stdout, "\n%d nodes running; try:\n  freqring status --addr 127.0.0.1:%d\n  freqring check --addr 127.0.0.1:%d +8613800000000\nCtrl-C stops them.\n", f.size, f.port, f.port)
	<-ctx.Done()
	return lc.Close()
}

// clusterFlags holds the flags of freqring cluster, as parsed.
type clusterFlags struct {
	size, port                   int
	rulesPath, dataDir, logLevel string
	tls                          *tlsFlags
	admin                        *adminFlags
	auth                         *authFlags
}

// parseClusterFlags defines cluster's flags, parses args into them (usage
// to stderr on -h) and checks -n.
func parseClusterFlags(args []string, stderr io.Writer) (*clusterFlags, error) {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	f := &clusterFlags{}
	fs.IntVar(&f.size, "n", 3, "number of nodes")
	fs.IntVar(&f.port, "port", 7070, "gRPC port of node 0; node i uses port+i, and gossips on port+100+i")
	fs.StringVar(&f.rulesPath, "rules", "", "rules file (default: the embedded default rules)")
	fs.StringVar(&f.dataDir, "data-dir", "", "if set, node i keeps its WAL and snapshots in DIR/node-i")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.tls = addTLSFlags(fs, true)
	f.admin = addAdminFlags(fs, true)
	f.auth = addAuthFlags(fs, true)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring cluster [flags]\n\nRuns a local cluster on 127.0.0.1 until SIGINT or SIGTERM.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return nil, err
	}
	if f.size < 1 || f.size > 50 {
		return nil, usagef("-n %d out of range [1, 50]", f.size)
	}
	return f, nil
}

// clusterNodes configures the nodes of a local cluster (TLS, admin tokens,
// an observer each, Envoy's rate limit service) and starts their admin
// listeners. configure is safe for concurrent use.
type clusterNodes struct {
	nt            nodeTLS
	tokens        *tokenFile // nil without --admin-token-file
	insecureAdmin bool
	logger        *slog.Logger
	adminAddrs    []string // node i's admin address; nil when the admin listeners are off
	adminTLS      *tls.Config
	pprof         bool
	console       bool // serve the console on each admin listener

	mu        sync.Mutex                   // guards observers
	observers map[string]*metrics.Observer // by node name: a restarted node keeps its histograms
}

// clusterNodes reads the TLS and token files the flags name and returns the
// nodes' settings.
func (f *clusterFlags) clusterNodes(logger *slog.Logger) (*clusterNodes, error) {
	nt, err := f.tls.nodeTLS(true, logger)
	if err != nil {
		return nil, err
	}
	cn := &clusterNodes{nt: nt, insecureAdmin: *f.auth.insecureAdmin, logger: logger, pprof: *f.admin.pprof,
		observers: map[string]*metrics.Observer{}}
	if f.admin.enabled() {
		if cn.console, err = f.admin.consoleOn(*f.admin.listen); err != nil {
			return nil, err
		}
	}
	if cn.adminTLS, err = f.admin.serverTLS(f.tls, logger); err != nil {
		return nil, err
	}
	if f.admin.enabled() {
		for i := range f.size {
			a, err := f.admin.addr(i)
			if err != nil {
				return nil, err
			}
			cn.adminAddrs = append(cn.adminAddrs, a)
		}
	}
	if *f.auth.adminTokens != "" {
		if cn.tokens, err = loadTokenFile(*f.auth.adminTokens); err != nil {
			return nil, err
		}
	}
	return cn, nil
}

// configure completes cfg, the configuration of a node the cluster starts
// or restarts.
func (cn *clusterNodes) configure(cfg *node.Config) {
	cn.nt.apply(cfg)
	if cn.tokens != nil {
		cfg.AdminTokens = cn.tokens
	} else {
		cfg.InsecureAdmin = cn.insecureAdmin
	}
	cfg.Observer = cn.observer(cfg.Name)
	cfg.Services = append(cfg.Services, registerRLS(cn.logger)) // Envoy's rate limit service, as serve
}

// observer returns the observer of the node called name, made on first use.
func (cn *clusterNodes) observer(name string) *metrics.Observer {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.observers[name] == nil {
		cn.observers[name] = metrics.NewObserver()
	}
	return cn.observers[name]
}

// startAdmins starts the admin listener of each member of lc, if they are
// on, and prints a line per member: its addresses. The returned func stops
// the listeners started, the last first; it is not nil, even with an error.
func (cn *clusterNodes) startAdmins(lc *nodetest.Cluster, stdout io.Writer) (stop func(), err error) {
	var admins []*adminServer
	var consoles []func()
	stop = func() {
		for i := len(admins) - 1; i >= 0; i-- {
			admins[i].stop()
		}
		for _, c := range consoles {
			c()
		}
	}
	for i, m := range lc.Members() {
		admin := ""
		if cn.adminAddrs != nil {
			var con http.Handler
			if cn.console {
				h, closeConsole, err := newConsole(m.Node, m.Name, cn.nt.dial, cn.logger)
				if err != nil {
					return stop, err
				}
				con = h
				consoles = append(consoles, closeConsole) // stop closes it, also after an error
			}
			a, err := startAdmin(cn.adminAddrs[i], adminHandler(metrics.NewRegistry(m.Node, cn.observer(m.Name)), m.Node.Serving, cn.pprof, con), cn.adminTLS, cn.logger)
			if err != nil {
				return stop, err
			}
			admins = append(admins, a)
			admin = "  admin " + a.Addr()
		}
		fmt.Fprintf(stdout, "%s  grpc %s  gossip %s%s\n", m.Name, m.Addr, m.GossipAddr, admin)
	}
	return stop, nil
}
