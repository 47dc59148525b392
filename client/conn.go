package client

import (
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// peer is one member address: its connection, its idle CheckStreams for
// CheckBatch and, once a single Check needs it, its batcher.
type peer struct {
	addr    string
	conn    *grpc.ClientConn
	cli     pb.LimiterClient
	b       *batcher // nil until first used; guarded by Client.mu
	streams batchStreams
	// noStream is the unix ns until which requests go as unary Checks: the
	// node answered CheckStream UNIMPLEMENTED (an older version).
	noStream atomic.Int64
}

// close stops the peer's batcher (its queued items fail as retryable),
// closes its idle streams and its connection (its RPCs in flight end with
// Canceled).
func (p *peer) close() {
	if p.b != nil {
		p.b.close()
	}
	p.streams.drop(true)
	p.conn.Close()
}

// peer returns the peer at addr, connecting on first use (grpc.NewClient
// does not dial until an RPC needs it).
func (c *Client) peer(addr string) (*peer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if p := c.peers[addr]; p != nil {
		return p, nil
	}
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes)),
		grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow)}, c.cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("client: connecting to %s: %w", addr, err)
	}
	p := &peer{addr: addr, conn: conn, cli: pb.NewLimiterClient(conn)}
	c.peers[addr] = p
	return p, nil
}
