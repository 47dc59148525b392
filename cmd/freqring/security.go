package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/freqring/freqring/internal/tlsfiles"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
)

// tlsFlags are the TLS flags of every command that serves or dials nodes,
// defined once here so that they read the same everywhere.
type tlsFlags struct {
	serving    bool
	on         *bool // clients only: --tls
	cert, key  *string
	ca         *string
	serverName *string
	clientAuth *string // serving only
}

// addTLSFlags defines the TLS flags on fs: serving for serve and cluster,
// which run nodes, else for the commands that dial them.
func addTLSFlags(fs *flag.FlagSet, serving bool) *tlsFlags {
	f := &tlsFlags{serving: serving}
	if serving {
		f.cert = fs.String("tls-cert", "", "PEM certificate chain of this node: turns on TLS for gRPC; also its client certificate towards peers, so it needs both serverAuth and clientAuth key usage (or none). Reloaded when the file changes")
		f.key = fs.String("tls-key", "", "PEM private key of --tls-cert")
		f.ca = fs.String("tls-ca", "", "PEM CA bundle that verifies peers' (and clients') certificates and that peers are dialled against; required with --tls-cert in a cluster, which then uses mTLS between peers. Reloaded when the file changes")
		f.clientAuth = fs.String("tls-client-auth", "none", "client certificates on the Limiter service: none, verify-if-given, or require (verified against --tls-ca); the Peer service always requires one when --tls-ca is set")
		f.serverName = fs.String("tls-server-name", "", "name every node's certificate carries: peers are dialled expecting it, and the Peer service takes only client certificates valid for it (default: the host of a peer's advertised address, and any certificate --tls-ca verifies)")
		return f
	}
	f.on = fs.Bool("tls", false, "dial nodes over TLS, verified against the system roots unless --tls-ca is given (implied by any --tls-* flag)")
	f.cert = fs.String("tls-cert", "", "PEM client certificate, for nodes that ask for one (--tls-client-auth)")
	f.key = fs.String("tls-key", "", "PEM private key of --tls-cert")
	f.ca = fs.String("tls-ca", "", "PEM CA bundle that verifies the nodes' certificates (default: the system roots)")
	f.serverName = fs.String("tls-server-name", "", "name the nodes' certificates must carry (default: the host dialled)")
	return f
}

// enabled reports whether any TLS flag is set.
func (f *tlsFlags) enabled() bool {
	return (f.on != nil && *f.on) || *f.cert != "" || *f.key != "" || *f.ca != "" || *f.serverName != "" ||
		(f.clientAuth != nil && *f.clientAuth != "none")
}

// reloader reads the files the flags name; errors name the flag and file.
func (f *tlsFlags) reloader(log *slog.Logger) (*tlsfiles.Reloader, error) {
	if (*f.cert == "") != (*f.key == "") {
		return nil, usagef("--tls-cert %q and --tls-key %q: give both or neither", *f.cert, *f.key)
	}
	r, err := tlsfiles.New(tlsfiles.Files{Cert: *f.cert, Key: *f.key, CA: *f.ca}, tlsfiles.Options{Logger: log})
	var fe *tlsfiles.FileError
	if errors.As(err, &fe) {
		return nil, fmt.Errorf("--tls-%s %s: %w", fe.Which, fe.Path, fe.Err)
	}
	return r, err
}

// dialOptions returns the credentials of a command that dials nodes:
// plaintext unless a TLS flag is set.
func (f *tlsFlags) dialOptions(log *slog.Logger) ([]grpc.DialOption, error) {
	if !f.enabled() {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	r, err := f.reloader(log)
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(r.ClientCredentials(*f.serverName))}, nil
}

var clientAuths = map[string]tls.ClientAuthType{
	"none": tls.NoClientCert, "verify-if-given": tls.VerifyClientCertIfGiven, "require": tls.RequireAndVerifyClientCert,
}

// nodeTLS is what the serving flags turn into.
type nodeTLS struct {
	server   *tls.Config       // nil: plaintext
	peerMTLS bool              // the Peer service requires verified client certificates
	peerName string            // and, if set, valid for this name
	dial     []grpc.DialOption // how peers (and the command's own calls) dial nodes
}

// apply sets the node's TLS, PeerMTLS and Peers.
func (t nodeTLS) apply(cfg *node.Config) {
	cfg.TLS, cfg.PeerMTLS, cfg.PeerName = t.server, t.peerMTLS, t.peerName
	if t.server != nil {
		cfg.Peers = node.GRPCPeers(t.dial...)
	}
}

// nodeTLS builds the TLS of a node from the serving flags; clustered says
// whether it has peers.
func (f *tlsFlags) nodeTLS(clustered bool, log *slog.Logger) (nodeTLS, error) {
	auth, ok := clientAuths[*f.clientAuth]
	if !ok {
		return nodeTLS{}, usagef("--tls-client-auth %q is not one of none, verify-if-given, require", *f.clientAuth)
	}
	if *f.cert == "" {
		if f.enabled() {
			return nodeTLS{}, usagef("--tls-key, --tls-ca, --tls-client-auth and --tls-server-name need --tls-cert")
		}
		return nodeTLS{dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}, nil
	}
	if *f.ca == "" && (clustered || auth != tls.NoClientCert) {
		return nodeTLS{}, usagef("--tls-ca is required with --tls-cert in a cluster (mTLS between peers) and with --tls-client-auth %s", *f.clientAuth)
	}
	r, err := f.reloader(log)
	if err != nil {
		return nodeTLS{}, err
	}
	t := nodeTLS{peerMTLS: *f.ca != "", peerName: *f.serverName}
	if t.peerMTLS {
		auth = max(auth, tls.VerifyClientCertIfGiven) // peers present theirs
	}
	if t.server, err = r.ServerConfig(auth); err != nil {
		return nodeTLS{}, err
	}
	t.dial = []grpc.DialOption{grpc.WithTransportCredentials(r.ClientCredentials(*f.serverName))}
	return t, nil
}

// serveSecurity applies the TLS flags and the gossip keys file to cfg, a
// cluster member if cfg.Cluster is set, and returns the gossip keyring
// (nil without --gossip-keys) for watchGossipKeys.
func serveSecurity(cfg *node.Config, tf *tlsFlags, keysPath string, log *slog.Logger) (*gossip.Keyring, error) {
	var keyring *gossip.Keyring
	if keysPath != "" {
		if cfg.Cluster == nil {
			return nil, usagef("--gossip-keys needs --gossip or --join")
		}
		keys, err := gossipKeys(keysPath)
		if err != nil {
			return nil, err
		}
		if keyring, err = gossip.NewKeyring(keys); err != nil {
			return nil, fmt.Errorf("--gossip-keys %s: %w", keysPath, err)
		}
		cfg.Cluster.Keyring = keyring
	}
	nt, err := tf.nodeTLS(cfg.Cluster != nil, log)
	if err != nil {
		return nil, err
	}
	nt.apply(cfg)
	return keyring, nil
}

// gossipKeys reads the gossip keys file at path (see gossip.ParseKeys).
func gossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--gossip-keys %s: %w", path, err)
	}
	keys, err := gossip.ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("--gossip-keys %s: %w", path, err)
	}
	return keys, nil
}

// watchGossipKeys applies the keys file at path to kr at its first tick and
// whenever its modification time or size changes, checking every interval,
// until ctx is done. A file that does not parse is logged and changes
// nothing.
func watchGossipKeys(ctx context.Context, path string, kr *gossip.Keyring, interval time.Duration, log *slog.Logger) {
	stamp := func() (time.Time, int64) {
		fi, err := os.Stat(path)
		if err != nil {
			return time.Time{}, -1
		}
		return fi.ModTime(), fi.Size()
	}
	var mod time.Time
	size := int64(-2) // no stamp yet: the first tick reads the file
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m, s := stamp()
		if m.Equal(mod) && s == size {
			continue
		}
		mod, size = m, s
		keys, err := gossipKeys(path)
		if err != nil {
			log.Error("gossip keys not changed", "err", err)
			continue
		}
		if slices.EqualFunc(keys, kr.Keys(), bytes.Equal) {
			continue
		}
		if err := kr.Set(keys); err != nil {
			log.Error("gossip keys not changed", "err", err)
			continue
		}
		log.Info("gossip keys changed", "file", path, "keys", len(keys))
	}
}
