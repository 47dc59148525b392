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

// Peer is what one node asks of another: the calls of the Peer service of
// api/freqring/v1 (its generated client's method set, so that a gRPC
// connection's clients are a Peer as they are: grpcPeer), the Admin
// service's ListOverrides and the Limiter's Status and Explain, over gRPC or in memory
// (localPeer). The receiving side of each is peerServer's method of the
// same name (peerrpc.go). Errors are gRPC statuses; call options apply to
// gRPC only.
type Peer interface {
	// Forward asks the peer to decide items it owns.
	Forward(ctx context.Context, req *pb.CheckRequest, opts ...grpc.CallOption) (*pb.CheckResponse, error)
	// Acquire takes partitions over from the peer (partition.go, rule 2).
	Acquire(ctx context.Context, req *pb.AcquireRequest, opts ...grpc.CallOption) (*pb.AcquireResponse, error)
	// Release lets the peer drop partitions taken over.
	Release(ctx context.Context, req *pb.ReleaseRequest, opts ...grpc.CallOption) (*pb.ReleaseResponse, error)
	// Replicate puts admitted sends on the peer, their backup.
	Replicate(ctx context.Context, req *pb.ReplicateRequest, opts ...grpc.CallOption) (*pb.ReplicateResponse, error)
	// Fill puts partition images on the peer, their backup.
	Fill(ctx context.Context, req *pb.FillRequest, opts ...grpc.CallOption) (*pb.FillResponse, error)
	// Handback tells the peer, their owner, of partitions this node
	// decided for under another ring (rule 7).
	Handback(ctx context.Context, req *pb.HandbackRequest, opts ...grpc.CallOption) (*pb.HandbackResponse, error)
	// ListOverrides lists the peer's overrides and tombstones (Node.ListOverrides, on the Admin service).
	ListOverrides(ctx context.Context, req *pb.OverrideListRequest, opts ...grpc.CallOption) (*pb.OverrideListResponse, error)
	// Status asks the peer who it is (Node.Status, on the Limiter service).
	Status(ctx context.Context, req *pb.StatusRequest, opts ...grpc.CallOption) (*pb.StatusResponse, error)
	// Explain asks the peer, a recipient's owner, to explain it
	// (Node.Explain, on the Limiter service).
	Explain(ctx context.Context, req *pb.ExplainRequest, opts ...grpc.CallOption) (*pb.ExplainResponse, error)
}

// MaxPeerResponseBytes bounds a peer's answer (an Acquire carries partition
// images).
const MaxPeerResponseBytes = 1 << 30

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
	opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxPeerResponseBytes), grpc.MaxCallSendMsgSize(MaxRequestBytes)),
		grpc.WithStaticStreamWindowSize(StreamWindow), grpc.WithStaticConnWindowSize(ConnWindow)) // limits.go
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
		return newGRPCPeer(conn), nil
	}
	conn, err := grpc.NewClient(m.Addr, g.opts...)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dialling %s (%s): %v", m.Name, m.Addr, err)
	}
	g.conns[m.Addr] = conn
	return newGRPCPeer(conn), nil
}

// grpcPeer is a Peer over one gRPC connection: the generated clients of its
// services, whose methods are the Peer interface's.
type grpcPeer struct {
	pb.PeerClient
	pb.AdminClient
	pb.LimiterClient
}

func newGRPCPeer(conn *grpc.ClientConn) grpcPeer {
	return grpcPeer{pb.NewPeerClient(conn), pb.NewAdminClient(conn), pb.NewLimiterClient(conn)}
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
	mu    sync.RWMutex     // guards nodes and carry
	nodes map[string]*Node // by advertised address
	carry Carrier
}

// A Carrier carries one call over a LocalNetwork, as a network with faults
// would: it calls deliver (which calls the method of the node at address
// to, with the context it is given) or fails the call, perhaps after
// delivering it (an answer lost). from is the caller's address (PeersFrom),
// or "" for a caller outside the cluster. A Carrier returns gRPC status
// errors, as a connection would, and nil only once deliver has returned
// nil.
type Carrier func(ctx context.Context, from, to string, deliver func(context.Context) error) error

// NewLocalNetwork returns an empty network.
func NewLocalNetwork() *LocalNetwork { return &LocalNetwork{nodes: map[string]*Node{}} }

// Carry makes c carry every call from now on; nil delivers them directly.
func (ln *LocalNetwork) Carry(c Carrier) {
	ln.mu.Lock()
	ln.carry = c
	ln.mu.Unlock()
}

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

// Peers returns a Peers over the network, for Config.Peers, whose calls
// name no caller to the network's Carrier.
func (ln *LocalNetwork) Peers() Peers { return localPeers{ln, ""} }

// PeersFrom returns a Peers over the network for the node at address from
// (its Config.AdvertiseAddr), for Config.Peers: a Carrier sees its calls as
// from.
func (ln *LocalNetwork) PeersFrom(from string) Peers { return localPeers{ln, from} }

type localPeers struct {
	ln   *LocalNetwork
	from string
}

func (lp localPeers) Peer(m ring.Member) (Peer, error) { return localPeer{lp.ln, lp.from, m}, nil }
func (localPeers) Prune(*ring.Ring)                    {}
func (localPeers) Close() error                        { return nil }

type localPeer struct {
	ln   *LocalNetwork
	from string
	m    ring.Member
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

func (p localPeer) Forward(ctx context.Context, req *pb.CheckRequest, _ ...grpc.CallOption) (*pb.CheckResponse, error) {
	return localCall(p, ctx, req, peerServer.Forward)
}

func (p localPeer) Acquire(ctx context.Context, req *pb.AcquireRequest, _ ...grpc.CallOption) (*pb.AcquireResponse, error) {
	return localCall(p, ctx, req, peerServer.Acquire)
}

func (p localPeer) Release(ctx context.Context, req *pb.ReleaseRequest, _ ...grpc.CallOption) (*pb.ReleaseResponse, error) {
	return localCall(p, ctx, req, peerServer.Release)
}

func (p localPeer) Replicate(ctx context.Context, req *pb.ReplicateRequest, _ ...grpc.CallOption) (*pb.ReplicateResponse, error) {
	return localCall(p, ctx, req, peerServer.Replicate)
}

func (p localPeer) Handback(ctx context.Context, req *pb.HandbackRequest, _ ...grpc.CallOption) (*pb.HandbackResponse, error) {
	return localCall(p, ctx, req, peerServer.Handback)
}

func (p localPeer) Fill(ctx context.Context, req *pb.FillRequest, _ ...grpc.CallOption) (*pb.FillResponse, error) {
	return localCall(p, ctx, req, peerServer.Fill)
}

func (p localPeer) ListOverrides(ctx context.Context, req *pb.OverrideListRequest, _ ...grpc.CallOption) (*pb.OverrideListResponse, error) {
	return localCall(p, ctx, req, func(s peerServer, ctx context.Context, req *pb.OverrideListRequest) (*pb.OverrideListResponse, error) {
		return s.n.ListOverrides(ctx, req)
	})
}

func (p localPeer) Status(ctx context.Context, req *pb.StatusRequest, _ ...grpc.CallOption) (*pb.StatusResponse, error) {
	return localCall(p, ctx, req, func(s peerServer, ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
		return s.n.Status(ctx, req)
	})
}

// localCall calls method of the peer server of the node registered at p's
// address, cloning the request and the answer as a wire would, through the
// network's Carrier if it has one.
func localCall[Req, Resp proto.Message](p localPeer, ctx context.Context, req Req, method func(peerServer, context.Context, Req) (Resp, error)) (Resp, error) {
	var resp Resp // set by deliver, read only once it has returned
	deliver := func(ctx context.Context) error {
		n, err := p.node()
		if err != nil {
			return err
		}
		r, err := method(peerServer{n: n}, ctx, proto.Clone(req).(Req))
		if err != nil {
			return err
		}
		resp = proto.Clone(r).(Resp)
		return nil
	}
	p.ln.mu.RLock()
	carry := p.ln.carry
	p.ln.mu.RUnlock()
	var err error
	if carry != nil {
		err = carry(ctx, p.from, p.m.Addr, deliver)
	} else {
		err = deliver(ctx)
	}
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp, nil
}

func (p localPeer) Explain(ctx context.Context, req *pb.ExplainRequest, _ ...grpc.CallOption) (*pb.ExplainResponse, error) {
	return localCall(p, ctx, req, func(s peerServer, ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
		return s.n.Explain(ctx, req)
	})
}
