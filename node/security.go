package node

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is transport security: TLS on the gRPC listener and the
// verified client certificate the Peer service asks for. The certificates
// come in as values (Config.TLS, and Config.Peers made by GRPCPeers with
// TLS credentials); the files
// behind them are read by the caller (cmd/freqring), never here.

// serverOptions returns the gRPC options of the node's listener: TLS
// credentials when Config.TLS is set, and the interceptors that keep the
// Peer service to verified peers (and Admin to verified clients) when
// Config.PeerMTLS is set.
func (n *Node) serverOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if n.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.cfg.TLS)))
	}
	if n.cfg.PeerMTLS {
		pa := peerAuth{name: n.cfg.PeerName}
		opts = append(opts, grpc.ChainUnaryInterceptor(pa.unary), grpc.ChainStreamInterceptor(pa.stream))
	}
	return opts
}

// peerAuth keeps the Peer service to callers with a verified client
// certificate, valid for name if name is set.
type peerAuth struct{ name string }

// peerService is the full name of the Peer service, the prefix of its
// methods' names.
var peerService = "/" + pb.Peer_ServiceDesc.ServiceName + "/"

// adminService is the prefix of the Admin service's methods, which also
// need a verified client certificate under PeerMTLS (any the CAs signed).
var adminService = "/" + pb.Admin_ServiceDesc.ServiceName + "/"

// unary refuses a call to the Peer service (Forward, Acquire, Release,
// Replicate, ReplicateStream, Fill, Handback) that did not come over TLS with a client certificate
// verified against the node's client CAs (and valid for pa.name):
// UNAUTHENTICATED. Other services pass.
func (pa peerAuth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := pa.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (pa peerAuth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := pa.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// check returns nil unless method belongs to the Peer service and the
// caller presented no verified client certificate valid for pa.name.
func (pa peerAuth) check(ctx context.Context, method string) error {
	admin := strings.HasPrefix(method, adminService)
	if !admin && !strings.HasPrefix(method, peerService) {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s: no peer information", method)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s from %s: the Peer service needs TLS with a client certificate", method, p.Addr)
	}
	if len(ti.State.VerifiedChains) == 0 {
		return status.Errorf(codes.Unauthenticated, "%s from %s: the Peer service needs a verified client certificate", method, p.Addr)
	}
	if pa.name != "" && !admin { // an operator's certificate need not be a peer's
		if err := ti.State.VerifiedChains[0][0].VerifyHostname(pa.name); err != nil {
			return status.Errorf(codes.Unauthenticated, "%s from %s: the client certificate is not a peer's: %v", method, p.Addr, err)
		}
	}
	return nil
}
