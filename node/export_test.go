package node

import (
	"context"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/usage"
)

// Test hooks of package node for its tests, and for its external tests
// (package node_test), which call the peer protocol directly.

// rpc returns n's Peer service, as a peer reaches it.
func (n *Node) rpc() peerServer { return peerServer{n: n} }

// PeerRPC is rpc for the external tests.
func (n *Node) PeerRPC() pb.PeerServer { return n.rpc() }

// ServeReplicateStream answers a ReplicateStream through recv and send.
func (n *Node) ServeReplicateStream(ctx context.Context, recv func() (*pb.ReplicateRequest, error), send func(*pb.ReplicateAck) error) error {
	return n.serveReplicateStream(ctx, recv, send)
}

// Image returns partition p's image and its record count; it changes
// nothing.
func (n *Node) Image(p int) ([]byte, int64) { return n.store.AppendImage(nil, p) }

// judgeAndDecide answers b as a forwarded call does: judged under r, then
// decided here.
func (n *Node) judgeAndDecide(ctx context.Context, b *batch, r *ring.Ring) (*pb.CheckResponse, error) {
	n.judge(b, r, true)
	return n.decide(ctx, b, nil, r, nil)
}

// SyncOverrides is syncOverrides for the external tests: one pull of the
// peers' admin overrides, without waiting for a ring change.
func (n *Node) SyncOverrides(ctx context.Context) { n.syncOverrides(ctx) }

// UsageDays returns n's usage statistics, every day of every zone: what it
// saves.
func (n *Node) UsageDays() []usage.DomainDay { return n.usage.All() }
