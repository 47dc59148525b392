package node

import (
	"context"
	"errors"
	"net"
	"sync"
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
	if rt := timingOf(ctx); rt != nil {
		defer rt.handled()
	}
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

func (s limiterServer) Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	return s.n.Explain(ctx, req)
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
// and the health server. It enforces Config.Limits and who may call the
// Peer and Admin services (security.go); opts come after them.
func (n *Node) NewGRPCServer(opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	opts = append(append(n.cfg.Limits.serverOptions(), grpc.ForceServerCodecV2(newServerCodec()), // codec.go
		grpc.ChainUnaryInterceptor(n.guard.unary), grpc.ChainStreamInterceptor(n.guard.stream)), opts...) // security.go
	if n.cfg.Observer != nil {
		opts = append(opts, grpc.InTapHandle(tapArrival), grpc.StatsHandler(respondTimer{n.cfg.Observer})) // stages.go
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(decodeInvalid(&pb.Limiter_ServiceDesc, n.guard.bind), limiterServer{n: n}) // codec.go
	srv.RegisterService(decodeInvalid(&pb.Peer_ServiceDesc, n.guard.bind), peerServer{n: n})
	srv.RegisterService(decodeInvalid(&pb.Admin_ServiceDesc, n.guard.bind), adminServer{n: n})
	for _, register := range n.cfg.Services {
		register(srv, n)
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	setHealth(hs, healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(srv)
	return srv, hs
}

// LivenessService is the gRPC health service name that answers SERVING from
// the moment the server exists until it shuts down: a liveness probe asks
// it, so that a node whose WAL has failed (not ready, "" NOT_SERVING) is not
// restarted but waits for its WAL to recover.
const LivenessService = "liveness"

// healthLoop keeps the readiness statuses of hs ("" and the Limiter
// service) in line with Serving, waking on servingKick, until ctx is done.
func (n *Node) healthLoop(ctx context.Context, hs *health.Server) {
	serving := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.servingKick:
		}
		if s := n.Serving(); s != serving {
			serving = s
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if s {
				st = healthpb.HealthCheckResponse_SERVING
			}
			setHealth(hs, st)
		}
	}
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
	if err := n.advertiseListener(lis); err != nil {
		lis.Close()
		return err
	}
	srv, hs := n.NewGRPCServer(n.serverOptions()...)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	n.log.Info("listening", "addr", lis.Addr().String(), "tls", n.cfg.TLS != nil, "peer_mtls", n.cfg.PeerMTLS, "peer_keys", n.cfg.PeerKeys != nil, "insecure_peers", n.cfg.InsecurePeers, "rules", n.view.Load().rules.Source(), "domains", n.view.Load().names, "partitions", n.store.Partitions(), "data_dir", n.cfg.DataDir)
	if err := n.Open(ctx); err != nil {
		srv.Stop()
		<-errc
		return err
	}
	setHealth(hs, healthpb.HealthCheckResponse_SERVING)
	n.log.Info("serving")
	var health sync.WaitGroup
	hctx, stopHealth := context.WithCancel(ctx)
	health.Go(func() { n.healthLoop(hctx, hs) })
	n.servingChanged() // the WAL may have failed since Open
	select {
	case err := <-errc:
		stopHealth()
		health.Wait()
		n.Close()
		return err
	case <-ctx.Done():
	}
	stopHealth()
	health.Wait()
	return n.shutdown(srv, hs, errc)
}

// advertiseListener sets Config.AdvertiseAddr, when empty, to lis's address,
// or this host's routable one for a listener on every interface.
func (n *Node) advertiseListener(lis net.Listener) error {
	if n.cfg.AdvertiseAddr != "" {
		return nil
	}
	addr, err := advertiseFor(lis.Addr().String())
	if err != nil {
		return err
	}
	if addr != lis.Addr().String() {
		n.log.Info("advertising this host's routable address: the listener is on every interface; --advertise chooses another",
			"listen", lis.Addr().String(), "advertise", addr)
	}
	n.cfg.AdvertiseAddr = addr
	return nil
}

// shutdown stops a serving node: readiness false, partitions handed over
// (at most half of Config.ShutdownGrace), health NOT_SERVING, watchers
// ended, in-flight calls finished (at most Config.ShutdownGrace, then cut
// off), the node closed. errc delivers srv.Serve's result.
func (n *Node) shutdown(srv *grpc.Server, hs *health.Server, errc <-chan error) error {
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
