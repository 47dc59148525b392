package node

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// ShutdownGrace is the default of Config.ShutdownGrace.
const ShutdownGrace = 10 * time.Second

// limiterServer adapts a Node to the generated gRPC interface.
type limiterServer struct {
	pb.UnimplementedLimiterServer
	n *Node
}

// Check waits its turn at the node's item gate (memlimit.go), then checks.
func (s limiterServer) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	release, err := s.n.gate.acquire(ctx, s.n.stopping, len(req.Recipients))
	if err != nil {
		return nil, err
	}
	defer release()
	return s.n.Check(ctx, req)
}

func (s limiterServer) CheckStream(stream grpc.BidiStreamingServer[pb.CheckRequest, pb.CheckResponse]) error {
	return s.n.CheckStream(stream.Context(), stream.Recv, stream.Send)
}

func (s limiterServer) Rules(ctx context.Context, req *pb.RulesRequest) (*pb.RulesResponse, error) {
	return s.n.Rules(ctx, req)
}

func (s limiterServer) Ring(ctx context.Context, req *pb.RingRequest) (*pb.RingResponse, error) {
	return s.n.RingInfo(ctx, req)
}

func (s limiterServer) WatchRing(req *pb.RingRequest, stream grpc.ServerStreamingServer[pb.RingResponse]) error {
	return s.n.WatchRing(stream.Context(), stream.Send)
}

func (s limiterServer) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	return s.n.Status(ctx, req)
}

func (s limiterServer) Usage(ctx context.Context, req *pb.UsageRequest) (*pb.UsageResponse, error) {
	return s.n.Usage(ctx, req)
}

// peerServer adapts a Node to the Peer service.
type peerServer struct {
	pb.UnimplementedPeerServer
	n *Node
}

func (s peerServer) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return s.n.Forward(ctx, req)
}

func (s peerServer) Acquire(ctx context.Context, req *pb.AcquireRequest) (*pb.AcquireResponse, error) {
	return s.n.Acquire(ctx, req)
}

func (s peerServer) Release(ctx context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	return s.n.Release(ctx, req)
}

func (s peerServer) Replicate(ctx context.Context, req *pb.ReplicateRequest) (*pb.ReplicateResponse, error) {
	return s.n.Replicate(ctx, req)
}

func (s peerServer) ReplicateStream(stream grpc.BidiStreamingServer[pb.ReplicateRequest, pb.ReplicateAck]) error {
	return s.n.ReplicateStream(stream.Context(), stream.Recv, stream.Send)
}

func (s peerServer) Handback(ctx context.Context, req *pb.HandbackRequest) (*pb.HandbackResponse, error) {
	return s.n.Handback(ctx, req)
}

func (s peerServer) Fill(ctx context.Context, req *pb.FillRequest) (*pb.FillResponse, error) {
	return s.n.Fill(ctx, req)
}

// adminServer adapts a Node to the Admin service.
type adminServer struct {
	pb.UnimplementedAdminServer
	n *Node
}

func (s adminServer) SetOverride(ctx context.Context, req *pb.OverrideSetRequest) (*pb.OverrideSetResponse, error) {
	return s.n.SetOverride(ctx, req)
}

func (s adminServer) DeleteOverride(ctx context.Context, req *pb.OverrideDeleteRequest) (*pb.OverrideDeleteResponse, error) {
	return s.n.DeleteOverride(ctx, req)
}

func (s adminServer) ListOverrides(ctx context.Context, req *pb.OverrideListRequest) (*pb.OverrideListResponse, error) {
	return s.n.ListOverrides(ctx, req)
}

// NewGRPCServer returns a gRPC server with the node's Limiter, Peer and
// Admin services and Config.Services, gRPC health (NOT_SERVING until the caller sets it) and reflection registered,
// and the health server. It enforces Config.Limits; opts come after them.
func (n *Node) NewGRPCServer(opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	opts = append(append(n.cfg.Limits.serverOptions(), grpc.ForceServerCodecV2(newServerCodec())), opts...) // codec.go
	srv := grpc.NewServer(opts...)
	srv.RegisterService(decodeInvalid(&pb.Limiter_ServiceDesc), limiterServer{n: n}) // codec.go
	srv.RegisterService(decodeInvalid(&pb.Peer_ServiceDesc), peerServer{n: n})
	srv.RegisterService(decodeInvalid(&pb.Admin_ServiceDesc), adminServer{n: n})
	for _, register := range n.cfg.Services {
		register(srv, n)
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	setHealth(hs, healthpb.HealthCheckResponse_NOT_SERVING)
	reflection.Register(srv)
	return srv, hs
}

func setHealth(hs *health.Server, s healthpb.HealthCheckResponse_ServingStatus) {
	hs.SetServingStatus("", s)
	hs.SetServingStatus(pb.Limiter_ServiceDesc.ServiceName, s)
}

// Serve serves gRPC on lis until ctx is done. It listens at once, reporting
// NOT_SERVING while Open recovers, then SERVING. When ctx is done it hands
// its partitions over (Leave, at most half of Config.ShutdownGrace), reports
// NOT_SERVING, ends ring watchers, finishes in-flight calls (at most
// Config.ShutdownGrace), closes the node (a final snapshot with a DataDir)
// and returns nil.
func (n *Node) Serve(ctx context.Context, lis net.Listener) error {
	if n.cfg.AdvertiseAddr == "" {
		n.cfg.AdvertiseAddr = lis.Addr().String()
	}
	srv, hs := n.NewGRPCServer(n.serverOptions()...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	n.log.Info("listening", "addr", lis.Addr().String(), "tls", n.cfg.TLS != nil, "peer_mtls", n.cfg.PeerMTLS, "rules", n.view.Load().rules.Source(), "domains", n.view.Load().names, "partitions", n.store.Partitions(), "data_dir", n.cfg.DataDir)
	if err := n.Open(ctx); err != nil {
		srv.Stop()
		<-errc
		return err
	}
	setHealth(hs, healthpb.HealthCheckResponse_SERVING)
	n.log.Info("serving")
	select {
	case err := <-errc:
		n.Close()
		return err
	case <-ctx.Done():
	}
	n.shuttingDown.Store(true) // readiness goes false before the hand-over
	grace := n.cfg.ShutdownGrace
	n.log.Info("shutting down", "grace", grace)
	leaveCtx, cancel := context.WithTimeout(context.Background(), grace/2)
	n.Leave(leaveCtx) // partitions handed over, peers stop routing here before the server stops
	cancel()
	hs.Shutdown()
	n.stopWatchers() // GracefulStop waits for every stream: a ring watcher never ends by itself
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		n.log.Warn("in-flight calls cut off after the grace period")
		srv.Stop()
		<-stopped
	}
	cerr := n.Close()
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	if cerr != nil {
		return cerr
	}
	n.log.Info("stopped")
	return nil
}
