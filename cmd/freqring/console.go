package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/console"
	"github.com/freqring/freqring/node"
)

// consoleBackend is the console's way to its node (in process) and to the
// other members (over gRPC, dialled with dial and kept open). It is safe
// for concurrent use.
type consoleBackend struct {
	n       *node.Node
	dial    []grpc.DialOption
	timeout time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by member address
}

// newConsole returns the console of n, whose members it dials with dial
// (nil: plaintext).
func newConsole(n *node.Node, name string, dial []grpc.DialOption, log *slog.Logger) (*console.Handler, func(), error) {
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	dial = append(slices.Clone(dial), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(statsRecvBytes)))
	b := &consoleBackend{n: n, dial: dial, timeout: 5 * time.Second, conns: map[string]*grpc.ClientConn{}}
	h, err := console.New(console.Config{Backend: b, Node: name, Log: log})
	if err != nil {
		return nil, nil, err
	}
	return h, func() { h.Close(); b.close() }, nil
}

func (b *consoleBackend) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for addr, c := range b.conns {
		c.Close()
		delete(b.conns, addr)
	}
}

// conn returns the connection to addr, dialling it on first use.
func (b *consoleBackend) conn(addr string) (*grpc.ClientConn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, b.dial...)
	if err != nil {
		return nil, err
	}
	b.conns[addr] = c
	return c, nil
}

func (b *consoleBackend) self(m *pb.Member) bool { return m.Name == b.n.Name() }

func (b *consoleBackend) Explain(ctx context.Context, who string, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	return b.n.Explain(node.WithCaller(ctx, who), req)
}

func (b *consoleBackend) Ring(ctx context.Context) (*pb.RingResponse, error) {
	return b.n.RingInfo(ctx, &pb.RingRequest{})
}

func (b *consoleBackend) Status(ctx context.Context, m *pb.Member) (*pb.StatusResponse, error) {
	if b.self(m) {
		return b.n.Status(ctx, &pb.StatusRequest{})
	}
	c, err := b.conn(m.Addr)
	if err != nil {
		return nil, err
	}
	return pb.NewLimiterClient(c).Status(ctx, &pb.StatusRequest{})
}

func (b *consoleBackend) Rules(ctx context.Context) (*pb.RulesResponse, error) {
	return b.n.Rules(ctx, &pb.RulesRequest{})
}

func (b *consoleBackend) Overrides(ctx context.Context) (*pb.OverrideListResponse, error) {
	return b.n.ListOverrides(ctx, &pb.OverrideListRequest{})
}

func (b *consoleBackend) AdminToken(tok string) bool { return b.n.AdminToken(tok) }

// members returns the ring's members, or the node alone.
func (b *consoleBackend) members(ctx context.Context) ([]*pb.Member, error) {
	rr, err := b.Ring(ctx)
	if err != nil {
		return nil, err
	}
	if len(rr.Members) == 0 {
		return []*pb.Member{{Name: rr.Node, Addr: b.n.Addr()}}, nil
	}
	return rr.Members, nil
}

// Usage asks every member for its statistics and sums them, as freqring
// stats does.
func (b *consoleBackend) Usage(ctx context.Context, days int) (console.Usage, error) {
	members, err := b.members(ctx)
	if err != nil {
		return console.Usage{}, err
	}
	req := &pb.UsageRequest{Days: uint32(days)}
	sum, _, missing := usageOf(members, func(m *pb.Member) (*pb.UsageResponse, error) {
		if b.self(m) {
			return b.n.Usage(ctx, req)
		}
		c, err := b.conn(m.Addr)
		if err != nil {
			return nil, err
		}
		return pb.NewLimiterClient(c).Usage(ctx, req)
	})
	u := console.Usage{Missing: missing}
	for i := range sum {
		r := statsRowOf(&sum[i], len(members)-len(missing))
		u.Days = append(u.Days, console.UsageDay{Date: r.Date, Domain: r.Domain, Admitted: r.Admitted, Denied: r.Denied,
			DeniedBy: r.DeniedBy, Recipients: r.Recipients})
	}
	return u, nil
}

// adminCall calls every member's Admin service with token, naming who in
// the call's metadata (node.CallerHeader) for the members' logs and the
// override's set_by.
func (b *consoleBackend) adminCall(ctx context.Context, who, token string, call func(context.Context, pb.AdminClient) error) []console.MemberResult {
	members, err := b.members(ctx)
	if err != nil {
		return []console.MemberResult{{Member: b.n.Name(), Err: err.Error()}}
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token, node.CallerHeader, who)
	out := make([]console.MemberResult, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		out[i].Member = m.Name
		wg.Go(func() {
			c, err := b.conn(m.Addr)
			if err == nil {
				err = call(ctx, pb.NewAdminClient(c))
			}
			if err != nil {
				out[i].Err = err.Error()
			}
		})
	}
	wg.Wait()
	return out
}

func (b *consoleBackend) SetOverride(ctx context.Context, who, token string, o *pb.Override) []console.MemberResult {
	o.Version = time.Now().UnixMilli() // one version on every member
	return b.adminCall(ctx, who, token, func(ctx context.Context, c pb.AdminClient) error {
		_, err := c.SetOverride(ctx, &pb.OverrideSetRequest{Override: o})
		return err
	})
}

func (b *consoleBackend) DeleteOverride(ctx context.Context, who, token, name string) []console.MemberResult {
	version := time.Now().UnixMilli()
	return b.adminCall(ctx, who, token, func(ctx context.Context, c pb.AdminClient) error {
		_, err := c.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: name, Version: version})
		return err
	})
}
