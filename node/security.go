package node

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is who may call what. The Limiter service, health and
// reflection are open to anyone who reaches the listener (TLS and client
// certificates, Config.TLS, decide who that is). The Peer service is for
// the cluster's members only, and the Admin service's changes for
// operators only:
//
//   - A member signs every call it makes with the cluster's keys
//     (Config.PeerKeys, the same file as the gossip keys): an HMAC-SHA256 of
//     the method, its name and the time, in the call's metadata
//     (peerAuthHeader). A node takes a Peer call only if it verifies under
//     one of its keys and is at most PeerCallSkew old or ahead; or, with
//     Config.PeerMTLS, if the caller's client certificate verified (and,
//     with PeerName, is valid for it); or with Config.InsecurePeers.
//   - A signed call names its caller: a Peer request whose node field names
//     another member is refused (PERMISSION_DENIED), so a member cannot act
//     as another. The handlers refuse what no member may ask: an Acquire or
//     Release that names the node itself.
//   - Admin.SetOverride and DeleteOverride need an operator: a bearer token
//     (authorization metadata) equal to one of Config.AdminTokens, or a
//     client certificate verified under PeerMTLS, or Config.InsecureAdmin.
//     Admin.ListOverrides also takes a member's signed call (members pull
//     each other's overrides).
//
// Refusals are UNAUTHENTICATED with a message that says what is missing,
// counted (Stats.RefusedPeerCalls, RefusedAdminCalls) and logged at most
// once per refusalLogEvery. The certificates and keys come in as values;
// files are read by the caller (cmd/freqring), never here.

// Keys is a set of secret keys, the first one primary, that may change
// while the node runs (a file reloaded by its caller): the cluster's keys
// (gossip.Keyring implements it) or an operator's tokens. Implementations
// are safe for concurrent use.
type Keys interface{ Keys() [][]byte }

// StaticKeys is a Keys that never changes.
type StaticKeys [][]byte

// Keys returns k.
func (k StaticKeys) Keys() [][]byte { return k }

// PeerCallSkew is how far a signed peer call's time may lie from the
// receiver's wall clock, either way, before the call is refused as stale.
const PeerCallSkew = 2 * time.Minute

// peerAuthHeader is the metadata key of a member's signature on a call:
// "v1.<name, base64url>.<unix ms>.<HMAC-SHA256, base64url>".
const peerAuthHeader = "freqring-peer-auth"

// refusalLogEvery bounds how often refused calls are logged.
const refusalLogEvery = 10 * time.Second

var (
	peerService   = "/" + pb.Peer_ServiceDesc.ServiceName + "/"
	adminService  = "/" + pb.Admin_ServiceDesc.ServiceName + "/"
	listOverrides = adminService + "ListOverrides"
)

// peerKey derives the HMAC key of peer calls from a cluster key, so that
// the gossip cipher's key is never used as-is for a second purpose.
func peerKey(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("freqring/peer-key/v1"))
	return m.Sum(nil)
}

// peerMAC returns the signature of a call of method by name at ms.
func peerMAC(derived []byte, method, name string, ms int64) []byte {
	m := hmac.New(sha256.New, derived)
	fmt.Fprintf(m, "freqring/peer-call/v1\x00%s\x00%s\x00%d", method, name, ms)
	return m.Sum(nil)
}

// derivedKeys caches the peer keys derived from the cluster keys last seen.
type derivedKeys struct {
	mu      sync.Mutex // guards src, derived
	src     [][]byte
	derived [][]byte
}

// of returns the derived keys of keys, primary first.
func (d *derivedKeys) of(keys [][]byte) [][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	same := len(keys) == len(d.src)
	for i := 0; same && i < len(keys); i++ {
		same = subtle.ConstantTimeCompare(keys[i], d.src[i]) == 1
	}
	if !same {
		d.src = make([][]byte, len(keys))
		d.derived = make([][]byte, len(keys))
		for i, k := range keys {
			d.src[i] = append([]byte(nil), k...)
			d.derived[i] = peerKey(k)
		}
	}
	return d.derived
}

// peerSigner signs the calls a member makes with the primary cluster key: a
// credentials.PerRPCCredentials for GRPCPeers.
type peerSigner struct {
	name string
	keys Keys
	d    derivedKeys
}

// PeerCallCredentials returns the per-call credentials with which node
// name signs its calls to peers under keys (Config.PeerKeys): pass
// grpc.WithPerRPCCredentials(PeerCallCredentials(...)) to GRPCPeers. A node
// whose Config.Peers is nil signs its calls by itself.
func PeerCallCredentials(name string, keys Keys) credentials.PerRPCCredentials {
	return &peerSigner{name: name, keys: keys}
}

// GetRequestMetadata signs the call named by ctx's request info.
func (s *peerSigner) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	keys := s.d.of(s.keys.Keys())
	if len(keys) == 0 {
		return nil, status.Error(codes.Unauthenticated, "node: no cluster key to sign a peer call with")
	}
	return map[string]string{peerAuthHeader: signPeerCall(keys[0], ri.Method, s.name, time.Now().UnixMilli())}, nil
}

// RequireTransportSecurity is false: signatures also serve plaintext
// clusters (they authenticate; TLS adds secrecy).
func (s *peerSigner) RequireTransportSecurity() bool { return false }

// signPeerCall returns the peerAuthHeader value of a call of method by name
// at ms under derived key k.
func signPeerCall(k []byte, method, name string, ms int64) string {
	return "v1." + base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + strconv.FormatInt(ms, 10) + "." +
		base64.RawURLEncoding.EncodeToString(peerMAC(k, method, name, ms))
}

// verifyPeerCall checks a peerAuthHeader value for a call of method at now
// (unix ms) against derived keys, and returns the caller's name.
func verifyPeerCall(v, method string, keys [][]byte, now int64) (string, error) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || parts[0] != "v1" {
		return "", fmt.Errorf("%s is not a v1 signature", peerAuthHeader)
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || len(name) == 0 {
		return "", fmt.Errorf("%s: bad caller name", peerAuthHeader)
	}
	ms, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%s: bad time %q", peerAuthHeader, parts[2])
	}
	if d := time.Duration(now-ms) * time.Millisecond; d > PeerCallSkew || d < -PeerCallSkew {
		return "", fmt.Errorf("signed by %q at %d ms, %v from this node's clock (at most %v): are the members' clocks in sync?",
			name, ms, d.Round(time.Millisecond), PeerCallSkew)
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil {
		return "", fmt.Errorf("%s: bad signature encoding", peerAuthHeader)
	}
	for _, k := range keys {
		if hmac.Equal(mac, peerMAC(k, method, string(name), ms)) {
			return string(name), nil
		}
	}
	return "", fmt.Errorf("the signature of %q verifies under none of this node's %d cluster keys: do the members share a key (--cluster-keys)?", name, len(keys))
}

// guard decides who may call the Peer and Admin services (see the top of
// this file). Its methods are safe for concurrent use.
type guard struct {
	self          string
	peerKeys      Keys // nil: calls are not verified by signature
	insecurePeers bool
	mtls          bool
	peerName      string
	adminTokens   Keys
	insecureAdmin bool
	log           *slog.Logger

	d                         derivedKeys
	refusedPeer, refusedAdmin atomic.Int64
	logs                      throttle // of refused calls
}

func newGuard(cfg *Config, log *slog.Logger) *guard {
	return &guard{self: cfg.Name, peerKeys: cfg.PeerKeys, insecurePeers: cfg.InsecurePeers, mtls: cfg.PeerMTLS,
		peerName: cfg.PeerName, adminTokens: cfg.AdminTokens, insecureAdmin: cfg.InsecureAdmin, log: log}
}

// callerKey is the context key of a verified member's name.
type callerKey struct{}

// callerOf returns the member name a verified signature gave the call, ""
// if it carried none (a client certificate, an insecure cluster, a direct
// call of the method).
func callerOf(ctx context.Context) string {
	name, _ := ctx.Value(callerKey{}).(string)
	return name
}

// unary is the guard as a unary interceptor.
func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := g.check(ctx, info.FullMethod)
	if err == nil {
		err = g.bind(ctx, info.FullMethod, req)
	}
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// stream is the guard as a stream interceptor. Every message received on a
// Peer stream is bound to the verified caller too, once decoded (codec.go's
// decodeInvalid calls bind).
func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := g.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, callerStream{ServerStream: ss, ctx: ctx})
}

// callerStream is a server stream whose context carries the verified
// caller.
type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s callerStream) Context() context.Context { return s.ctx }

// bind refuses a Peer request whose node field names another member than
// the one that signed it.
func (g *guard) bind(ctx context.Context, method string, req any) error {
	if !strings.HasPrefix(method, peerService) {
		return nil
	}
	caller := callerOf(ctx)
	named, ok := req.(interface{ GetNode() string })
	if caller == "" || !ok {
		return nil
	}
	if named.GetNode() != caller {
		g.refused(&g.refusedPeer, method, "", "the call names another member than its signer")
		return status.Errorf(codes.PermissionDenied, "%s: signed by member %q, but the request names %q", method, caller, named.GetNode())
	}
	return nil
}

// check lets a call through, with the verified caller in its context, or
// refuses it.
func (g *guard) check(ctx context.Context, method string) (context.Context, error) {
	admin := strings.HasPrefix(method, adminService)
	if !admin && !strings.HasPrefix(method, peerService) {
		return ctx, nil // Limiter, health, reflection, further services
	}
	var addr string
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr.String()
	}
	if admin {
		ok, why := g.operator(ctx)
		if !ok && method == listOverrides {
			var pctx context.Context
			if pctx, ok, _ = g.member(ctx, method); ok {
				ctx = pctx
			}
		}
		if !ok {
			g.refused(&g.refusedAdmin, method, addr, why)
			return ctx, status.Errorf(codes.Unauthenticated, "%s: %s", method, why)
		}
		return ctx, nil
	}
	ctx, ok, why := g.member(ctx, method)
	if !ok {
		g.refused(&g.refusedPeer, method, addr, why)
		return ctx, status.Errorf(codes.Unauthenticated, "%s: %s", method, why)
	}
	return ctx, nil
}

// member reports whether the call comes from a cluster member, and if not,
// why not.
func (g *guard) member(ctx context.Context, method string) (context.Context, bool, string) {
	if v := metadata.ValueFromIncomingContext(ctx, peerAuthHeader); len(v) > 0 && g.peerKeys != nil {
		name, err := verifyPeerCall(v[0], method, g.d.of(g.peerKeys.Keys()), time.Now().UnixMilli())
		if err != nil {
			return ctx, false, err.Error()
		}
		return context.WithValue(ctx, callerKey{}, name), true, ""
	}
	certErr := ""
	if g.mtls {
		if certErr = g.verifiedCert(ctx, g.peerName); certErr == "" {
			return ctx, true, ""
		}
	}
	if g.insecurePeers {
		return ctx, true, ""
	}
	switch {
	case g.peerKeys == nil && !g.mtls:
		return ctx, false, fmt.Sprintf("the Peer service is for cluster members, and node %s takes calls from none: it is not started with cluster keys (--cluster-keys) or peer certificates (--tls-ca)", g.self)
	case g.mtls:
		return ctx, false, "the Peer service is for cluster members: " + certErr
	}
	return ctx, false, "the Peer service is for cluster members: the call is not signed with the cluster keys (--cluster-keys)"
}

// AdminToken reports whether tok is one of the node's admin tokens
// (Config.AdminTokens, compared in constant time): false when it has none,
// whatever Config.InsecureAdmin says. The console asks it before changing
// overrides. Safe for concurrent use.
func (n *Node) AdminToken(tok string) bool {
	return n.guard.adminTokens != nil && n.guard.tokenMatches(tok)
}

// tokenMatches reports whether tok is one of g's admin tokens.
func (g *guard) tokenMatches(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	ok := false
	for _, k := range g.adminTokens.Keys() {
		want := sha256.Sum256(k)
		ok = subtle.ConstantTimeCompare(sum[:], want[:]) == 1 || ok
	}
	return ok
}

// operator reports whether the call comes from an operator, and if not,
// why not.
func (g *guard) operator(ctx context.Context) (bool, string) {
	if g.insecureAdmin {
		return true, ""
	}
	if tok, ok := bearer(ctx); ok && g.adminTokens != nil {
		if g.tokenMatches(tok) {
			return true, ""
		}
		return false, "the bearer token is not one of this node's admin tokens (--admin-token-file)"
	}
	if g.mtls && g.verifiedCert(ctx, "") == "" {
		return true, ""
	}
	how := "a bearer token from the node's --admin-token-file (freqring override --token-file FILE)"
	if g.mtls {
		how += " or a client certificate that --tls-ca verifies"
	}
	if g.adminTokens == nil && !g.mtls {
		return false, fmt.Sprintf("the Admin service changes limits and needs an operator's credentials, and node %s takes none: start it with --admin-token-file FILE (or --tls-ca)", g.self)
	}
	return false, "the Admin service changes limits and needs an operator's credentials: " + how
}

// bearer returns the token of an "authorization: Bearer TOKEN" header.
func bearer(ctx context.Context) (string, bool) {
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			return strings.TrimSpace(tok), true
		}
	}
	return "", false
}

// verifiedCert returns "" if the call came over TLS with a client
// certificate verified against the node's client CAs (and valid for name,
// if set), else why not.
func (g *guard) verifiedCert(ctx context.Context, name string) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "no peer information"
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "the call came without TLS, so with no client certificate"
	}
	if len(ti.State.VerifiedChains) == 0 {
		return "the call came with no verified client certificate"
	}
	if name != "" {
		if err := ti.State.VerifiedChains[0][0].VerifyHostname(name); err != nil {
			return fmt.Sprintf("the client certificate is not a peer's: %v", err)
		}
	}
	return ""
}

// refused counts a refused call on c and logs it, at most once per
// refusalLogEvery with the number of refusals since the last line.
func (g *guard) refused(c *atomic.Int64, method, addr, why string) {
	c.Add(1)
	if ok, held := g.logs.allow(time.Now().UnixNano(), refusalLogEvery); ok {
		g.log.Warn("call refused", "method", method, "from", addr, "why", why, "refusals_not_logged", held)
	}
}

// serverOptions returns the gRPC options of the node's listener: TLS
// credentials when Config.TLS is set.
func (n *Node) serverOptions() []grpc.ServerOption {
	if n.cfg.TLS != nil {
		return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(n.cfg.TLS))}
	}
	return nil
}
