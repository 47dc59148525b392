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

// ShutdownGrace bounds how long Serve waits for in-flight calls once its
// context is done, before it cuts them off.
const ShutdownGrace = 10 * time.Second

// limiterServer adapts a Node to the generated gRPC interface.
type limiterServer struct {
	pb.UnimplementedLimiterServer
	n *Node
}

func (s limiterServer) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return s.n.Check(ctx, req)
}

func (s limiterServer) Rules(ctx context.Context, req *pb.RulesRequest) (*pb.RulesResponse, error) {
	return s.n.Rules(ctx, req)
}

// NewGRPCServer returns a gRPC server with the node's Limiter service, gRPC
// health (reporting SERVING) and reflection registered, and the health
// server to flip when shutting down.
func (n *Node) NewGRPCServer(opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	opts = append([]grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRequestBytes)}, opts...)
	srv := grpc.NewServer(opts...)
	pb.RegisterLimiterServer(srv, limiterServer{n: n})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(pb.Limiter_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(srv)
	return srv, hs
}

// Serve serves gRPC on lis and sweeps idle records until ctx is done, then
// reports NOT_SERVING, finishes in-flight calls (for at most ShutdownGrace)
// and returns. It returns nil after a shutdown through ctx.
func (n *Node) Serve(ctx context.Context, lis net.Listener) error {
	srv, hs := n.NewGRPCServer()
	var wg sync.WaitGroup
	defer wg.Wait()
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	if n.cfg.SweepInterval > 0 {
		wg.Go(func() { n.sweepLoop(sweepCtx) })
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	n.log.Info("serving", "addr", lis.Addr().String(), "rules", n.cfg.Rules.Source(), "domains", n.cfg.Rules.names, "shards", n.cfg.Shards)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	n.log.Info("shutting down", "grace", ShutdownGrace)
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(ShutdownGrace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		n.log.Warn("in-flight calls cut off after the grace period")
		srv.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	n.log.Info("stopped")
	return nil
}

// sweepLoop runs Sweep every SweepInterval until ctx is done.
func (n *Node) sweepLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		got, err := n.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			n.log.Error("sweep failed", "err", err)
		case got > 0:
			n.log.Debug("swept idle records", "reclaimed", got, "took", time.Since(start))
		}
	}
}
