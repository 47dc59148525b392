package node

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// Peer is what one node asks of another: the Peer service of
// api/freqring/v1, over gRPC or in memory. Errors are gRPC statuses.
type Peer interface {
	// Forward asks the peer to decide items it owns (Node.Forward).
	Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Peers reaches the members of a ring. Implementations are safe for
// concurrent use.
type Peers interface {
	// Peer returns the peer for member m, connecting on first use.
	Peer(m ring.Member) (Peer, error)
	// Prune forgets connections to members no longer in r.
	Prune(r *ring.Ring)
	// Close closes every connection.
	Close() error
}

// GRPCPeers reaches peers over gRPC, one connection per address, with the
// given dial options (nil: plaintext). It is a node's default Peers.
func GRPCPeers(opts ...grpc.DialOption) Peers {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxRequestBytes)))
	return &grpcPeers{opts: opts, conns: map[string]*grpc.ClientConn{}}
}

type grpcPeers struct {
	opts  []grpc.DialOption
	mu    sync.Mutex                  // guards conns
	conns map[string]*grpc.ClientConn // by gRPC address
}

func (g *grpcPeers) Peer(m ring.Member) (Peer, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if conn := g.conns[m.Addr]; conn != nil {
		return grpcPeer{pb.NewPeerClient(conn)}, nil
	}
	conn, err := grpc.NewClient(m.Addr, g.opts...)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dialling %s (%s): %v", m.Name, m.Addr, err)
	}
	g.conns[m.Addr] = conn
	return grpcPeer{pb.NewPeerClient(conn)}, nil
}

// grpcPeer is a Peer over one gRPC connection.
type grpcPeer struct{ c pb.PeerClient }

func (p grpcPeer) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return p.c.Forward(ctx, req)
}

func (g *grpcPeers) Prune(r *ring.Ring) {
	keep := map[string]bool{}
	for _, m := range r.Members() {
		keep[m.Addr] = true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for addr, conn := range g.conns {
		if !keep[addr] {
			conn.Close()
			delete(g.conns, addr)
		}
	}
}

func (g *grpcPeers) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for addr, conn := range g.conns {
		conn.Close()
		delete(g.conns, addr)
	}
	return nil
}

// LocalNetwork connects the nodes of one process without gRPC: a node
// registered at an address is reached by calling its methods, with each
// message cloned on the way in and out, as a wire would. A node not
// registered (stopped, killed, cut off) answers UNAVAILABLE. It is safe for
// concurrent use.
type LocalNetwork struct {
	mu    sync.RWMutex     // guards nodes
	nodes map[string]*Node // by advertised address
}

// NewLocalNetwork returns an empty network.
func NewLocalNetwork() *LocalNetwork { return &LocalNetwork{nodes: map[string]*Node{}} }

// Register makes n reachable at addr (its Config.AdvertiseAddr).
func (ln *LocalNetwork) Register(addr string, n *Node) {
	ln.mu.Lock()
	ln.nodes[addr] = n
	ln.mu.Unlock()
}

// Unregister makes addr unreachable.
func (ln *LocalNetwork) Unregister(addr string) {
	ln.mu.Lock()
	delete(ln.nodes, addr)
	ln.mu.Unlock()
}

// Peers returns a Peers over the network, for Config.Peers.
func (ln *LocalNetwork) Peers() Peers { return localPeers{ln} }

type localPeers struct{ ln *LocalNetwork }

func (lp localPeers) Peer(m ring.Member) (Peer, error) { return localPeer{lp.ln, m}, nil }
func (localPeers) Prune(*ring.Ring)                    {}
func (localPeers) Close() error                        { return nil }

type localPeer struct {
	ln *LocalNetwork
	m  ring.Member
}

func (p localPeer) node() (*Node, error) {
	p.ln.mu.RLock()
	n := p.ln.nodes[p.m.Addr]
	p.ln.mu.RUnlock()
	if n == nil {
		return nil, status.Errorf(codes.Unavailable, "peer %s (%s) is not reachable", p.m.Name, p.m.Addr)
	}
	return n, nil
}

func (p localPeer) Forward(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	n, err := p.node()
	if err != nil {
		return nil, err
	}
	resp, err := n.Forward(ctx, proto.Clone(req).(*pb.CheckRequest))
	if err != nil {
		return nil, err
	}
	return proto.Clone(resp).(*pb.CheckResponse), nil
}
