package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// This file is the admin HTTP listener of serve and cluster: /metrics
// (Prometheus), /livez, /readyz and, with --admin-pprof, /debug/pprof/.

// DefaultAdminListen is the default of --admin-listen.
const DefaultAdminListen = "127.0.0.1:9090"

// adminFlags are the admin listener's flags.
type adminFlags struct {
	listen  *string
	pprof   *bool
	tls     *bool
	console *string
}

// addAdminFlags defines the admin flags on fs; perNode says the address is
// node 0's and node i listens on its port + i (cluster).
func addAdminFlags(fs *flag.FlagSet, perNode bool) *adminFlags {
	listenHelp := `admin HTTP address: the console (/), /metrics (Prometheus), /livez, /readyz and, with --admin-pprof, /debug/pprof/; "" or "off" disables it`
	if perNode {
		listenHelp = `admin HTTP address of node 0 (the console at /, /metrics, /livez, /readyz); node i listens on its port + i; "" or "off" disables them`
	}
	return &adminFlags{
		listen:  fs.String("admin-listen", DefaultAdminListen, listenHelp),
		pprof:   fs.Bool("admin-pprof", false, "also serve /debug/pprof/ on the admin listener (CPU and heap profiles: keep the listener on a trusted network)"),
		console: fs.String("admin-console", "auto", "serve the web console at / on the admin listener (docs/console.md): auto (when --admin-listen is a loopback address: its pages show recipients' sends to whoever reaches them), on, or off; changing overrides from it needs an admin token (--admin-token-file)"),
		tls:     fs.Bool("admin-tls", false, "serve the admin listener over TLS with the gRPC listener's --tls-cert and --tls-key (reloaded as they change); no client certificate is asked for"),
	}
}

// consoleOn reports whether --admin-console asks for the console on an
// admin listener at addr: auto serves it on a loopback address only.
func (f *adminFlags) consoleOn(addr string) (bool, error) {
	switch *f.console {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "auto":
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return false, nil // addr's own check reports it
		}
		if host == "localhost" {
			return true, nil
		}
		ip := net.ParseIP(host)
		return ip != nil && ip.IsLoopback(), nil
	}
	return false, usagef("--admin-console %q is not one of auto, on, off", *f.console)
}

// enabled reports whether an admin listener is wanted.
func (f *adminFlags) enabled() bool { return *f.listen != "" && *f.listen != "off" }

// addr returns the admin address of node i: the flag's port plus i.
func (f *adminFlags) addr(i int) (string, error) {
	host, port, err := net.SplitHostPort(*f.listen)
	if err != nil {
		return "", usagef("--admin-listen %q: %v (want host:port, or \"off\")", *f.listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", usagef("--admin-listen %q: port %q is not a number in [0, 65535]", *f.listen, port)
	}
	if i > 0 && p == 0 {
		return net.JoinHostPort(host, "0"), nil
	}
	if p+i > 65535 {
		return "", usagef("--admin-listen %q: port %d + node %d is above 65535", *f.listen, p, i)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+i)), nil
}

// adminHandler serves g at /metrics, 200 at /livez while the process
// runs, 200 at /readyz while ready() (else 503, naming the causes), with
// withPprof /debug/pprof/, and the console (nil: none) at every other path.
func adminHandler(g prometheus.Gatherer, ready func() bool, withPprof bool, con http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not serving: recovering, joining, shutting down, or its write-ahead log failed (see the log and freqring_wal_failed)", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if withPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if con != nil {
		mux.Handle("/", con)
	}
	return mux
}

// adminServer is a running admin listener.
type adminServer struct {
	srv  *http.Server
	lis  net.Listener
	done chan error // Serve's result
}

// startAdmin listens on addr (over TLS when tc is set) and serves h in a
// goroutine of its own until stop.
func startAdmin(addr string, h http.Handler, tc *tls.Config, log *slog.Logger) (*adminServer, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--admin-listen %s: %w", addr, err)
	}
	if tc != nil {
		lis = tls.NewListener(lis, tc)
	}
	a := &adminServer{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		lis:  lis,
		done: make(chan error, 1),
	}
	go func() { a.done <- a.srv.Serve(lis) }()
	log.Info("admin listening", "addr", lis.Addr().String(), "tls", tc != nil)
	return a, nil
}

// Addr is the address the admin listener listens on.
func (a *adminServer) Addr() string { return a.lis.Addr().String() }

// stop closes the listener and waits at most a second for requests in
// flight (a scrape), then for Serve to return.
func (a *adminServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		a.srv.Close()
	}
	if err := <-a.done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// serverTLS returns the admin listener's TLS configuration: nil without
// --admin-tls, else the gRPC listener's certificate and key files (tf),
// reloaded as they change, asking for no client certificate.
func (f *adminFlags) serverTLS(tf *tlsFlags, log *slog.Logger) (*tls.Config, error) {
	if !*f.tls {
		return nil, nil
	}
	if *tf.cert == "" || *tf.key == "" {
		return nil, usagef("--admin-tls needs --tls-cert and --tls-key: the admin listener uses the gRPC listener's certificate")
	}
	r, err := tf.reloader(log)
	if err != nil {
		return nil, err
	}
	return r.ServerConfig(tls.NoClientCert)
}
