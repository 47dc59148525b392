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
	"strings"
	"sync"
	"sync/atomic"
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

// authFlags are serve's flags that say who may call the Peer and Admin
// services (besides the TLS flags).
type authFlags struct {
	clusterKeys, gossipKeys *string // one file; --gossip-keys is its old name
	insecurePeers           *bool
	adminTokens             *string
	insecureAdmin           *bool
}

// addAuthFlags defines the authentication flags on fs; serving in one
// process on loopback (freqring cluster) has no --insecure-peers: its nodes
// share a key they make.
func addAuthFlags(fs *flag.FlagSet, cluster bool) *authFlags {
	f := &authFlags{}
	f.adminTokens = fs.String("admin-token-file", "", "file of admin bearer tokens, one a line, at least 16 bytes each (head -c 32 /dev/urandom | base64): Admin calls that change overrides must carry one (freqring override --token-file); read again when the file changes")
	if cluster {
		f.insecureAdmin = fs.Bool("insecure-admin", true, "let any caller on 127.0.0.1 change overrides when no --admin-token-file is given")
		return f
	}
	f.clusterKeys = fs.String("cluster-keys", "", "file of the cluster's keys, one base64 key of 16, 24 or 32 bytes a line (head -c 32 /dev/urandom | base64), the primary first, the same file on every member: they encrypt and authenticate gossip and sign every call between members; required with --gossip or --join unless --insecure-peers or peer certificates (--tls-ca). Applied again when the file changes (key rotation: docs/security.md)")
	f.gossipKeys = fs.String("gossip-keys", "", "the old name of --cluster-keys")
	f.insecurePeers = fs.Bool("insecure-peers", false, "let anyone who reaches --listen call the Peer service (forward, move partitions, replicate) when the node has no cluster keys or peer certificates; only for a network nobody else can reach, or while a cluster moves to --cluster-keys")
	f.insecureAdmin = fs.Bool("insecure-admin", false, "let anyone who reaches --listen change overrides without a token (no --admin-token-file)")
	return f
}

// keysPath returns the cluster keys file and the name of the flag that
// gave it (--cluster-keys, or its old name --gossip-keys), for messages.
func (f *authFlags) keysPath() (path, flagName string, err error) {
	if f.clusterKeys == nil {
		return "", "", nil
	}
	if *f.gossipKeys != "" && *f.clusterKeys != "" && *f.gossipKeys != *f.clusterKeys {
		return "", "", usagef("--cluster-keys %q and --gossip-keys %q: give one (--gossip-keys is its old name)", *f.clusterKeys, *f.gossipKeys)
	}
	if *f.clusterKeys == "" && *f.gossipKeys != "" {
		return *f.gossipKeys, "--gossip-keys", nil
	}
	return *f.clusterKeys, "--cluster-keys", nil
}

// secrets are the files serveSecurity loaded, for their watchers.
type secrets struct {
	keysPath   string
	keyring    *gossip.Keyring // nil without cluster keys
	tokensPath string
	tokens     *tokenFile // nil without --admin-token-file
	// dial is how the node's own clients (the console's calls to members)
	// reach nodes: TLS when the node serves it.
	dial []grpc.DialOption
}

// serveSecurity applies the TLS flags, the cluster keys and the admin
// tokens to cfg, a cluster member if cfg.Cluster is set (cfg.Name set), and
// returns what the watchers reload. A cluster member with neither cluster
// keys nor peer certificates is refused unless --insecure-peers.
func serveSecurity(cfg *node.Config, tf *tlsFlags, af *authFlags, log *slog.Logger) (secrets, error) {
	var sec secrets
	var err error
	var flagName string
	if sec.keysPath, flagName, err = af.keysPath(); err != nil {
		return sec, err
	}
	if sec.keysPath != "" {
		if cfg.Cluster == nil {
			return sec, usagef("%s needs --gossip or --join: the keys are the cluster's", flagName)
		}
		keys, err := gossipKeys(sec.keysPath)
		if err != nil {
			return sec, fmt.Errorf("%s%s", flagName, strings.TrimPrefix(err.Error(), "--cluster-keys"))
		}
		if sec.keyring, err = gossip.NewKeyring(keys); err != nil {
			return sec, fmt.Errorf("%s %s: %w", flagName, sec.keysPath, err)
		}
		cfg.Cluster.Keyring = sec.keyring
		cfg.PeerKeys = sec.keyring
	}
	if af.insecurePeers != nil {
		cfg.InsecurePeers = *af.insecurePeers
	}
	cfg.InsecureAdmin = *af.insecureAdmin
	if sec.tokensPath = *af.adminTokens; sec.tokensPath != "" {
		if sec.tokens, err = loadTokenFile(sec.tokensPath); err != nil {
			return sec, err
		}
		cfg.AdminTokens = sec.tokens
		cfg.InsecureAdmin = false
	}
	nt, err := tf.nodeTLS(cfg.Cluster != nil, log)
	if err != nil {
		return sec, err
	}
	nt.apply(cfg)
	sec.dial = nt.dial
	if cfg.Cluster != nil && cfg.PeerKeys == nil && !cfg.PeerMTLS && !cfg.InsecurePeers {
		return sec, usagef("%s", strings.TrimPrefix(node.ErrNoPeerAuth.Error(), "node: "))
	}
	if cfg.PeerKeys != nil && cfg.Peers != nil {
		// Peers over TLS: they sign their calls too.
		cfg.Peers = node.GRPCPeers(append(nt.dial, grpc.WithPerRPCCredentials(node.PeerCallCredentials(cfg.Name, cfg.PeerKeys)))...)
	}
	if cfg.InsecurePeers {
		log.Warn("--insecure-peers: anyone who reaches the gRPC listener may call the Peer service (close partitions, forge sends); give every member --cluster-keys", "listen", cfg.AdvertiseAddr)
	}
	if cfg.InsecureAdmin {
		log.Warn("--insecure-admin: anyone who reaches the gRPC listener may change overrides; use --admin-token-file")
	}
	return sec, nil
}

// watch reloads the cluster keys and the admin tokens when their files
// change, until ctx is done.
func (sec secrets) watch(ctx context.Context, wg *sync.WaitGroup, log *slog.Logger) {
	if sec.keyring != nil {
		wg.Go(func() { watchGossipKeys(ctx, sec.keysPath, sec.keyring, time.Second, log) })
	}
	if sec.tokens != nil {
		wg.Go(func() { watchFile(ctx, sec.tokensPath, time.Second, func() { sec.tokens.reload(log) }) })
	}
}

// tokenFile is an admin token file, read again by its watcher: a node.Keys.
type tokenFile struct {
	path   string
	tokens atomic.Pointer[[][]byte]
}

// minTokenBytes is the shortest admin token taken.
const minTokenBytes = 16

// loadTokenFile reads the admin tokens file at path.
func loadTokenFile(path string) (*tokenFile, error) {
	t := &tokenFile{path: path}
	toks, err := readTokens(path)
	if err != nil {
		return nil, err
	}
	t.tokens.Store(&toks)
	return t, nil
}

// Keys returns the tokens, the first line's first.
func (t *tokenFile) Keys() [][]byte { return *t.tokens.Load() }

// reload reads the file again; a file that does not parse is logged and
// changes nothing.
func (t *tokenFile) reload(log *slog.Logger) {
	toks, err := readTokens(t.path)
	if err != nil {
		log.Error("admin tokens not changed", "err", err)
		return
	}
	if slices.EqualFunc(toks, t.Keys(), bytes.Equal) {
		return
	}
	t.tokens.Store(&toks)
	log.Info("admin tokens changed", "file", t.path, "tokens", len(toks))
}

// readTokens reads a token file: one token a line, blank lines and lines
// starting with # skipped.
func readTokens(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	var toks [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < minTokenBytes {
			return nil, fmt.Errorf("--admin-token-file %s: line %d: a token of %d bytes; use at least %d (head -c 32 /dev/urandom | base64)", path, i+1, len(line), minTokenBytes)
		}
		toks = append(toks, []byte(line))
	}
	if len(toks) == 0 {
		return nil, fmt.Errorf("--admin-token-file %s: no token in the file", path)
	}
	return toks, nil
}

// bearerToken is the per-call credentials of a command that calls the Admin
// service with an operator's token.
type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false: a node on loopback or a private
// network takes tokens over plaintext (docs/security.md says what that
// exposes).
func (bearerToken) RequireTransportSecurity() bool { return false }

// tokenDialOption returns the dial option that sends the first token of
// the file at path with every call; none for "".
func tokenDialOption(path string) ([]grpc.DialOption, error) {
	if path == "" {
		return nil, nil
	}
	toks, err := readTokens(path)
	if err != nil {
		return nil, usagef("%s", strings.Replace(err.Error(), "--admin-token-file", "--token-file", 1))
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(bearerToken(toks[0]))}, nil
}

// gossipKeys reads the gossip keys file at path (see gossip.ParseKeys).
func gossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--cluster-keys %s: %w", path, err)
	}
	keys, err := gossip.ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("--cluster-keys %s: %w", path, err)
	}
	return keys, nil
}

// watchGossipKeys applies the keys file at path to kr at its first tick and
// whenever its modification time or size changes, checking every interval,
// until ctx is done. A file that does not parse is logged and changes
// nothing.
func watchGossipKeys(ctx context.Context, path string, kr *gossip.Keyring, interval time.Duration, log *slog.Logger) {
	watchFile(ctx, path, interval, func() {
		keys, err := gossipKeys(path)
		if err != nil {
			log.Error("gossip keys not changed", "err", err)
			return
		}
		if slices.EqualFunc(keys, kr.Keys(), bytes.Equal) {
			return
		}
		if err := kr.Set(keys); err != nil {
			log.Error("gossip keys not changed", "err", err)
			return
		}
		log.Info("gossip keys changed", "file", path, "keys", len(keys))
	})
}

// watchFile calls changed at its first tick and whenever the modification
// time or size of the file at path changes, checking every interval, until
// ctx is done.
func watchFile(ctx context.Context, path string, interval time.Duration, changed func()) {
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
		changed()
	}
}
