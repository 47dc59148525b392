package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// Explain answers the Limiter service's Explain: what the rules of a
// recipient count now and whether its next send would be admitted. It is
// routed as a one-item peek is (decode, judge): a node that does not own
// the recipient forwards the call to its owner, which reads the record
// under its partition's lock. It records nothing and counts nothing. Safe
// for concurrent use.
func (n *Node) Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	if !n.ready.Load() {
		return nil, status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	if !req.Forwarded {
		// A lookup of a person's sends: logged with its caller, and counted.
		n.explains.Add(1)
		n.log.Info("explain", "recipient", req.Recipient, "domain", req.Domain, "caller", CallerOf(ctx))
	}
	creq := explainCheck(req)
	r := n.clus.Load().ring()
	b := decode(creq, n.view.Load(), r)
	defer b.put()
	n.judge(b, r, req.Forwarded)
	x := &b.items[0]
	switch {
	case x.err != nil:
		return nil, explainError(x.err)
	case x.where == forwardedTo:
		cli, err := n.peers.Peer(x.owner)
		if err != nil {
			return nil, err
		}
		fwd := proto.Clone(req).(*pb.ExplainRequest)
		fwd.Forwarded = true
		resp, err := cli.Explain(ctx, fwd)
		if err != nil {
			return nil, explainPeerError(x.owner.Name, err)
		}
		return resp, nil
	}
	ex, err := n.store.Explain(x.part, x.dv.ref, x.key, x.tag, n.nowMs(), x.it)
	if err != nil {
		if errors.Is(err, store.ErrClosed) || errors.Is(err, window.ErrInvalid) {
			return nil, explainError(n.applyError(req.Recipient, x.part, r, err))
		}
		return nil, status.Errorf(codes.Internal, "explain %s: %v", quote(req.Recipient), err)
	}
	return n.explainResponse(req, x, ex), nil
}

// explainCheck is the one-item peek Explain routes and decodes.
func explainCheck(req *pb.ExplainRequest) *pb.CheckRequest {
	c := &pb.CheckRequest{Recipients: []string{req.Recipient}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}, Costs: []uint32{req.Cost}}
	if req.Domain != "" {
		c.Domains = []string{req.Domain}
	}
	switch {
	case len(req.Content) > 0:
		c.Contents = [][]byte{req.Content}
	case req.ContentHash != 0:
		c.ContentHashes = []uint64{req.ContentHash}
	}
	return c
}

// explainFields names ExplainRequest's field for each column of the
// one-item CheckRequest an Explain is decoded as.
var explainFields = map[string]string{
	wire.Recipients: "recipient", wire.Domains: "domain", wire.Contents: "content",
	wire.ContentHashes: "content_hash", wire.Costs: "cost",
}

// explainError turns the error of an Explain's item into a status whose
// message names the ExplainRequest's field, not the CheckRequest column.
func explainError(e *itemError) error {
	msg := e.msg
	if f, ok := explainFields[e.field]; ok {
		if _, rest, cut := strings.Cut(msg, ": "); cut {
			msg = f + ": " + rest
		}
	}
	return status.Error(e.code, msg)
}

// explainResponse puts ex, the owner's explanation of item x, in the
// response to req.
func (n *Node) explainResponse(req *pb.ExplainRequest, x *item, ex window.Explanation) *pb.ExplainResponse {
	dv, dec := x.dv, &ex.Decision
	rules := dv.d.Rules()
	resp := &pb.ExplainResponse{
		Recipient: req.Recipient, Domain: dv.d.Name(), Node: n.cfg.Name, NowMs: dec.At,
		Admitted: dec.Admitted, Override: dv.override, Exempt: dv.exempt,
	}
	if x.it.Content != 0 {
		resp.ContentFingerprint = window.ContentFingerprint(x.it.Content)
	}
	switch {
	case dv.exempt: // an exempt recipient's rules are all shadows: never denied
		resp.Admitted, resp.NextAdmittedMs = true, dec.At
	case dec.Admitted:
		resp.NextAdmittedMs = dec.At
	case dec.RetryAfter >= 0:
		resp.DeniedBy = rules[dec.DeniedBy].Name
		resp.NextAdmittedMs = dec.At + dec.RetryAfter
	}
	for i, rl := range rules {
		res := dec.Rules[i]
		v := ex.Rules[i]
		er := &pb.ExplainRule{
			Name: rl.Name, Scope: rl.Scope.String(), Algorithm: rl.Algorithm.String(), Limit: uint32(rl.Limit),
			WindowMs: rl.WindowMillis(), Shadow: rl.Shadow, Judged: rl.Scope != window.ScopeContent || x.it.Content != 0,
			Used: uint32(res.Used), Remaining: uint32(res.Remaining), RetryAfterMs: res.RetryAfter,
		}
		for _, s := range v.Sends {
			er.Sends = append(er.Sends, &pb.ExplainSend{AtMs: s.At, ContentFingerprint: s.Content})
		}
		for _, s := range v.State {
			er.State = append(er.State, &pb.ExplainValue{Name: s.Name, Value: s.Value})
		}
		resp.Rules = append(resp.Rules, er)
	}
	return resp
}

// explainPeerError wraps an owner's failure to explain.
func explainPeerError(owner string, err error) error {
	if s, ok := status.FromError(err); ok {
		return status.Errorf(s.Code(), "owner %s: %s", owner, s.Message())
	}
	return fmt.Errorf("owner %s: %w", owner, err)
}

type whoKey struct{}

// WithCaller returns ctx naming who makes the calls made with it (a user
// of the console, an HTTP client's address), for the log of recipient
// lookups (Explain).
func WithCaller(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, whoKey{}, who)
}

// CallerHeader is the gRPC metadata key in which a front end that calls
// the cluster on a user's behalf (the console) names that user; CallerOf
// reports it beside the call's own address.
const CallerHeader = "freqring-caller"

// CallerOf returns who makes a call, for logs: the name the call carries
// (namedCaller), after the CallerHeader's name the gRPC peer's address
// too, or that address alone ("in-process" for none).
func CallerOf(ctx context.Context) string {
	name, viaHeader := namedCaller(ctx)
	addr := cmp.Or(peerAddr(ctx), "in-process")
	switch {
	case name == "":
		return addr
	case viaHeader:
		return name + " via " + addr
	}
	return name
}

// setterOf returns who sets an admin override in a call, the same on every
// member that one change reaches: the name the call carries
// (namedCaller), else the client's host without its port (which differs
// per connection), else "in-process".
func setterOf(ctx context.Context) string {
	if name, _ := namedCaller(ctx); name != "" {
		return name
	}
	addr := peerAddr(ctx)
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return cmp.Or(addr, "in-process")
}

// namedCaller returns the name a call carries for its caller: WithCaller's,
// the CallerHeader's (viaHeader: the client's own claim), or "member NAME"
// for a call a member signed; "" for none.
func namedCaller(ctx context.Context) (name string, viaHeader bool) {
	if who, ok := ctx.Value(whoKey{}).(string); ok {
		return who, false
	}
	if v := metadata.ValueFromIncomingContext(ctx, CallerHeader); len(v) > 0 {
		return v[0], true
	}
	if member := callerOf(ctx); member != "" {
		return "member " + member, false
	}
	return "", false
}

// peerAddr returns the gRPC peer's address of a call, "" for none.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
