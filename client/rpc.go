package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// encode builds the request for n items, whose caller waits until dl (zero:
// no deadline); a column whose entries are all the default is left empty,
// one whose entries are all equal has one entry.
func encode(n int, at func(int) *prepared, epoch uint64, dl time.Time) *pb.CheckRequest {
	req := &pb.CheckRequest{RingEpoch: epoch, Recipients: make([]string, n), RequestIds: make([]uint64, n)}
	if !dl.IsZero() {
		req.NotAfterMs = dl.UnixMilli() // a node that reads it later decides nothing
	}
	first := at(0)
	sameDomain, hashes, costs, modes := true, false, false, false
	for j := range n {
		p := at(j)
		req.Recipients[j], req.RequestIds[j] = p.recipient, p.id
		sameDomain = sameDomain && p.domain == first.domain
		hashes = hashes || p.hash != 0
		costs = costs || p.cost != 1
		modes = modes || p.mode != pb.Mode_MODE_CHECK_AND_RECORD
	}
	switch {
	case !sameDomain:
		req.Domains = make([]string, n)
	case first.domain != "":
		req.Domains = []string{first.domain}
	}
	if hashes {
		req.ContentHashes = make([]uint64, n)
	}
	if costs {
		req.Costs = make([]uint32, n)
	}
	if modes {
		req.Modes = make([]pb.Mode, n)
	}
	for j := range n {
		p := at(j)
		if len(req.Domains) == n {
			req.Domains[j] = p.domain
		}
		if hashes {
			req.ContentHashes[j] = p.hash
		}
		if costs {
			req.Costs[j] = p.cost
		}
		if modes {
			req.Modes[j] = p.mode
		}
	}
	return req
}

// outcome is what one attempt got for one item: a decision, the caller's
// error (ierr, with Index the item's position in the RPC), or a retryable
// failure (err).
type outcome struct {
	dec  Decision
	ierr *ItemError
	err  error
}

// callerFault reports whether an item failed with code because of the item
// itself, so that neither a retry nor the failure policy applies.
func callerFault(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange, codes.FailedPrecondition, codes.NotFound:
		return true
	}
	return false
}

// rpc sends n items to p in one Check RPC and emits each item's outcome.
// node names the member p is, for Decision.Node and errors. A response with
// another ring epoch than the client's asks for a refresh from p.
func (c *Client) rpc(ctx context.Context, p *peer, node string, n int, at func(int) *prepared, emit func(int, outcome)) {
	dl, _ := ctx.Deadline()
	req := encode(n, at, c.Ring().Epoch(), dl)
	c.st.rpcs.Add(1)
	resp, err := p.cli.Check(ctx, req)
	if err != nil {
		o := refused(status.Convert(err), node, fmt.Errorf("client: Check RPC to %s (%s): %w", node, p.addr, err))
		emitAll(n, emit, o)
		return
	}
	c.answered(p, node, resp, n, at, emit)
}

// answered emits the outcome of each of n items from resp, p's answer, and
// asks for a refresh from p if resp carries another ring epoch than the
// client's.
func (c *Client) answered(p *peer, node string, resp *pb.CheckResponse, n int, at func(int) *prepared, emit func(int, outcome)) {
	if resp.RingEpoch != 0 && resp.RingEpoch != c.Ring().Epoch() {
		c.requestRefresh(p.addr, resp.RingEpoch)
	}
	if len(resp.Duplicates) > 0 {
		c.st.duplicates.Add(int64(len(resp.Duplicates)))
	}
	decode(resp, n, at, node, emit)
}

// emitAll emits o as the outcome of each of n items.
func emitAll(n int, emit func(int, outcome), o outcome) {
	for j := range n {
		emit(j, o)
	}
}

// refused is the outcome of every item of a request that failed whole with
// st: the caller's error for INVALID_ARGUMENT (the request as a whole was
// refused: retrying it cannot help), else err, retryable.
func refused(st *status.Status, node string, err error) outcome {
	if st.Code() == codes.InvalidArgument {
		field, _ := wire.Violation(st)
		return outcome{ierr: &ItemError{Code: st.Code(), Message: fmt.Sprintf("node %s refused the request: %s", node, st.Message()), Field: field}}
	}
	return outcome{err: err}
}

// decode emits the outcome of each of n items from resp.
func decode(resp *pb.CheckResponse, n int, at func(int) *prepared, node string, emit func(int, outcome)) {
	r, err := wire.Read(resp, n)
	if err != nil {
		o := outcome{err: fmt.Errorf("client: malformed response from %s: %w", node, err)}
		emitAll(n, emit, o)
		return
	}
	var rules []RuleState
	if len(resp.Used) > 0 {
		rules = make([]RuleState, len(resp.Used)) // one array for the batch, sliced per item
	}
	var lastName string // the domain of the previous item, and its rules
	var dom *pb.Domain
	off := 0
	for j := range n {
		if e := r.Err(j); e != nil {
			off += int(resp.RuleCounts[j])
			emit(j, failure(e, node))
			continue
		}
		if d := at(j).domain; dom == nil || d != lastName {
			lastName = d
			if d == "" {
				d = defaultDomain
			}
			dom = resp.Domains[d]
		}
		k := int(resp.RuleCounts[j])
		emit(j, outcome{dec: decision(r, j, dom, rules[off:off+k:off+k], node)})
		off += k
	}
}

// failure is the outcome of an item that failed with e at node: the
// caller's error, or a retryable failure.
func failure(e *pb.ItemError, node string) outcome {
	code := codes.Code(e.Code)
	if callerFault(code) {
		return outcome{ierr: &ItemError{Index: int(e.Index), Code: code, Message: e.Message, Field: e.Field}}
	}
	return outcome{err: fmt.Errorf("client: node %s: %s (%v)", node, e.Message, code)}
}

// decision is item j's decision in r, under its domain dom (nil if the
// response lacks it), with its rules in rs.
func decision(r *wire.Response, j int, dom *pb.Domain, rs []RuleState, node string) Decision {
	dec := Decision{
		Admitted: r.Admitted[j], Recorded: r.Recorded[j], Duplicate: r.Duplicate(j), Refunded: r.Refunded(j),
		RetryAfter: time.Duration(r.RetryAfterMs[j]) * time.Millisecond,
		DecidedAt:  time.UnixMilli(r.DecidedAtMs[j]),
		Node:       node,
	}
	used, remaining, retry := r.Rules(j)
	for k := range rs {
		rs[k] = RuleState{Used: int(used[k]), Remaining: int(remaining[k]), RetryAfter: time.Duration(retry[k]) * time.Millisecond}
		if dom != nil && k < len(dom.Rules) {
			rule := dom.Rules[k]
			rs[k].Name, rs[k].Limit, rs[k].Window = rule.Name, int(rule.Limit), time.Duration(rule.WindowMs)*time.Millisecond
			rs[k].Shadow = rule.Shadow
		}
	}
	if len(rs) > 0 {
		dec.Rules = rs
	}
	if by := r.DeniedBy[j]; by >= 0 && dom != nil && int(by) < len(dom.Rules) {
		dec.DeniedBy = dom.Rules[by].Name
	}
	if by := r.ShadowDeniedBy(j); by >= 0 && dom != nil && int(by) < len(dom.Rules) {
		dec.ShadowDeniedBy = dom.Rules[by].Name
	}
	return dec
}
