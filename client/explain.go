package client

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// Explain asks the recipient's owner what each rule of req's recipient
// counts now and whether its next send would be admitted (the Limiter
// service's Explain; api/wire.ExplanationOf gives its JSON form). It
// records nothing. When the owner cannot be reached it asks another member,
// which forwards the call. Errors are gRPC statuses (INVALID_ARGUMENT
// naming the field), or ErrClosed. Safe for concurrent use.
func (c *Client) Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	m := c.Ring().OwnerString(req.Recipient)
	if m.Addr == "" {
		return nil, errors.New("client: the ring is empty")
	}
	resp, err := c.explainAt(ctx, m.Addr, req)
	if status.Code(err) != codes.Unavailable {
		return resp, err
	}
	other := c.pickAddr(m.Addr)
	if other == "" || other == m.Addr {
		return nil, err
	}
	return c.explainAt(ctx, other, req)
}

func (c *Client) explainAt(ctx context.Context, addr string, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	p, err := c.peer(addr)
	if err != nil {
		return nil, err
	}
	return p.cli.Explain(ctx, req)
}
