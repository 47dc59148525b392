package node

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what one client, call or connection can make a node hold.
// A zero field takes the default in its comment. Every gRPC listener of the
// node (NewGRPCServer, Serve) applies them.
type Limits struct {
	// MaxRequestBytes bounds one request message (a Check batch); 0 means
	// MaxRequestBytes (16 MiB), which is also the most it may be (a node
	// forwards batches of that size to peers). Larger messages fail with
	// RESOURCE_EXHAUSTED.
	MaxRequestBytes int
	// MaxContentBytes bounds one item's content; 0 means MaxContentBytes
	// (64 KiB). A larger content is a per-item INVALID_ARGUMENT.
	MaxContentBytes int
	// MaxStreams bounds the concurrent calls of one connection; 0 means 256.
	// Calls beyond it wait in the client for a free stream.
	MaxStreams uint32
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings; a client that pings more often is disconnected
	// (GOAWAY "too_many_pings"). 0 means 10 seconds. Pings without a call in
	// flight are allowed.
	KeepaliveMinTime time.Duration
	// IdleTimeout closes a connection (with GOAWAY) that has had no call for
	// this long; 0 means 15 minutes, negative never. A client's ring watch is
	// a call, so a client's connections never idle out.
	IdleTimeout time.Duration
	// PingInterval is how long a connection may be silent before the node
	// pings it, closing it if the ping goes unanswered for PingTimeout: a
	// vanished client's connection and calls are freed. 0 means 1 minute and
	// 20 seconds.
	PingInterval, PingTimeout time.Duration
	// MaxWatchers bounds the concurrent WatchRing calls of the node; 0 means
	// 4096. More fail with RESOURCE_EXHAUSTED.
	MaxWatchers int
	// MaxStreamRequests bounds the requests of one CheckStream call that the
	// node decides at once, and those of one ReplicateStream it has read and
	// not answered (waiting for the WAL): it reads no more from the stream
	// until one is answered (HTTP/2 flow control then holds the sender back).
	// 0 means 64; [1, 4096]. A stream counts as one of MaxStreams.
	MaxStreamRequests int
}

func (l *Limits) fill() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxRequestBytes, MaxRequestBytes)
	def(&l.MaxContentBytes, MaxContentBytes)
	def(&l.MaxWatchers, 4096)
	def(&l.MaxStreamRequests, 64)
	if l.MaxStreams == 0 {
		l.MaxStreams = 256
	}
	defDur(&l.KeepaliveMinTime, 10*time.Second)
	defDur(&l.IdleTimeout, 15*time.Minute)
	defDur(&l.PingInterval, time.Minute)
	defDur(&l.PingTimeout, 20*time.Second)
}

func (l *Limits) validate() error {
	switch {
	case l.MaxRequestBytes < 1<<10 || l.MaxRequestBytes > MaxRequestBytes:
		return fmt.Errorf("node: Limits.MaxRequestBytes %d out of range [1024, %d]", l.MaxRequestBytes, MaxRequestBytes)
	case l.MaxContentBytes < 1 || l.MaxContentBytes > l.MaxRequestBytes:
		return fmt.Errorf("node: Limits.MaxContentBytes %d out of range [1, MaxRequestBytes %d]", l.MaxContentBytes, l.MaxRequestBytes)
	case l.MaxStreamRequests < 1 || l.MaxStreamRequests > 4096:
		return fmt.Errorf("node: Limits.MaxStreamRequests %d out of range [1, 4096]", l.MaxStreamRequests)
	case l.MaxWatchers < 1:
		return fmt.Errorf("node: Limits.MaxWatchers %d is less than 1", l.MaxWatchers)
	case l.KeepaliveMinTime < 0:
		return fmt.Errorf("node: Limits.KeepaliveMinTime %v is negative", l.KeepaliveMinTime)
	case l.PingInterval < 0 || l.PingTimeout < 0:
		return fmt.Errorf("node: Limits.PingInterval %v or PingTimeout %v is negative", l.PingInterval, l.PingTimeout)
	}
	return nil
}

// Flow-control windows of every gRPC connection a node serves or dials,
// bytes. They are static: grpc-go's default starts at 64 KiB and estimates
// the bandwidth-delay product with a PING after each DATA frame it receives
// while no PING is out, which for a cluster's small request-answer traffic
// adds a PING, its ack and a WINDOW_UPDATE to nearly every call (about a
// third of a single check's round trip on loopback). A stream window of
// 1 MiB holds a batch of thousands of items; a 16 MiB request still flows,
// in several windows.
const (
	StreamWindow = 1 << 20
	ConnWindow   = 4 << 20
)

// serverOptions are the gRPC server options that enforce l.
func (l *Limits) serverOptions() []grpc.ServerOption {
	params := keepalive.ServerParameters{Time: l.PingInterval, Timeout: l.PingTimeout}
	if l.IdleTimeout > 0 {
		params.MaxConnectionIdle = l.IdleTimeout
	}
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(StreamWindow), grpc.StaticConnWindowSize(ConnWindow),
		grpc.MaxRecvMsgSize(l.MaxRequestBytes),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(params),
	}
}
