package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/freqring/freqring/gateway"
	"github.com/freqring/freqring/node"
)

// httpFlags are serve's flags of the HTTP/JSON gateway.
type httpFlags struct {
	listen      *string
	legacy      *bool
	rls         *bool
	bodyTimeout *time.Duration
}

func addHTTPFlags(fs *flag.FlagSet) *httpFlags {
	return &httpFlags{
		listen:      fs.String("http-listen", "", "HTTP/JSON listen address of POST /v1/check (docs/api.md, HTTP); over TLS with the gRPC listener's --tls-cert, --tls-key and --tls-client-auth when --tls-cert is set (default: off)"),
		legacy:      fs.Bool("http-legacy-headers", false, "add X-RateLimit-Limit, -Remaining and -Reset to HTTP answers beside RateLimit-Policy and RateLimit"),
		rls:         fs.Bool("envoy-rls", true, "serve Envoy's rate limit service (envoy.service.ratelimit.v3) on the gRPC listener (docs/api.md, Envoy)"),
		bodyTimeout: fs.Duration("http-body-timeout", gateway.DefaultBodyTimeout, "longest time from the start of an HTTP request until its whole body has arrived; a slower one is answered 408 and its connection closed"),
	}
}

// serverTLS returns the HTTP listener's TLS configuration: nil without
// --tls-cert, else the gRPC listener's files (reloaded as they change) and
// client-certificate policy.
func (f *httpFlags) serverTLS(tf *tlsFlags, log *slog.Logger) (*tls.Config, error) {
	if *f.listen == "" || *tf.cert == "" {
		return nil, nil
	}
	auth, ok := clientAuths[*tf.clientAuth]
	if !ok {
		return nil, usagef("--tls-client-auth %q is not one of none, verify-if-given, require", *tf.clientAuth)
	}
	r, err := tf.reloader(log)
	if err != nil {
		return nil, err
	}
	return r.ServerConfig(auth)
}

// startHTTPGateway serves POST /v1/check for n on addr (over TLS when tc
// is set) in a goroutine of its own until stop; it answers 503 while n is
// not serving.
func startHTTPGateway(addr string, n *node.Node, hf *httpFlags, tc *tls.Config, log *slog.Logger) (*adminServer, error) {
	if *hf.bodyTimeout <= 0 {
		return nil, usagef("--http-body-timeout %v is not positive", *hf.bodyTimeout)
	}
	h, err := gateway.New(gateway.Config{Checker: n, Explainer: n, Caller: node.WithCaller, Serving: n.Serving, LegacyHeaders: *hf.legacy, BodyTimeout: *hf.bodyTimeout})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--http-listen %s: %w", addr, err)
	}
	if tc != nil {
		lis = tls.NewListener(lis, tc)
	}
	a := &adminServer{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		lis:  lis,
		done: make(chan error, 1),
	}
	go func() { a.done <- a.srv.Serve(lis) }()
	log.Info("HTTP gateway listening", "addr", lis.Addr().String(), "tls", tc != nil, "legacy_headers", *hf.legacy, "body_timeout", *hf.bodyTimeout)
	return a, nil
}

// registerRLS registers Envoy's rate limit service for n on r: a
// node.Config.Services entry.
func registerRLS(log *slog.Logger) func(grpc.ServiceRegistrar, *node.Node) {
	return func(r grpc.ServiceRegistrar, n *node.Node) {
		rls, err := gateway.NewRLS(gateway.RLSConfig{Checker: n, Rules: n.RuleSet, Serving: n.Serving, Log: log})
		if err != nil {
			panic("BUG: " + err.Error())
		}
		rls.Register(r)
	}
}
