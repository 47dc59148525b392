package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// encode builds the request for n items; a column whose entries are all the
// default is left empty, one whose entries are all equal has one entry.
func encode(n int, at func(int) *prepared, epoch uint64) *pb.CheckRequest {
	req := &pb.CheckRequest{RingEpoch: epoch, Recipients: make([]string, n), RequestIds: make([]uint64, n)}
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
	req := encode(n, at, c.Ring().Epoch())
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
		return outcome{ierr: &ItemError{Code: st.Code(), Message: fmt.Sprintf("node %s refused the request: %s", node, st.Message())}}
	}
	return outcome{err: err}
}

// decode emits the outcome of each of n items from resp.
func decode(resp *pb.CheckResponse, n int, at func(int) *prepared, node string, emit func(int, outcome)) {
	failed, dup, err := checkResponse(resp, n)
	var refunded []bool
	if err == nil {
		refunded, err = indexSet("refunded", resp.Refunded, n)
	}
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
		k := int(resp.RuleCounts[j])
		if failed != nil && failed[j] != nil {
			off += k
			e := failed[j]
			code := codes.Code(e.Code)
			if callerFault(code) {
				emit(j, outcome{ierr: &ItemError{Index: j, Code: code, Message: e.Message}})
			} else {
				emit(j, outcome{err: fmt.Errorf("client: node %s: %s (%v)", node, e.Message, code)})
			}
			continue
		}
		if d := at(j).domain; dom == nil || d != lastName {
			lastName = d
			if d == "" {
				d = defaultDomain
			}
			dom = resp.Domains[d]
		}
		dec := Decision{
			Admitted: resp.Admitted[j], Recorded: resp.Recorded[j], Duplicate: dup != nil && dup[j], Refunded: refunded != nil && refunded[j],
			RetryAfter: time.Duration(resp.RetryAfterMs[j]) * time.Millisecond,
			DecidedAt:  time.UnixMilli(resp.DecidedAtMs[j]),
			Node:       node,
		}
		if k > 0 {
			rs := rules[off : off+k : off+k]
			for r := range rs {
				rs[r] = RuleState{
					Used: int(resp.Used[off+r]), Remaining: int(resp.Remaining[off+r]),
					RetryAfter: time.Duration(resp.RuleRetryAfterMs[off+r]) * time.Millisecond,
				}
				if dom != nil && r < len(dom.Rules) {
					rule := dom.Rules[r]
					rs[r].Name, rs[r].Limit, rs[r].Window = rule.Name, int(rule.Limit), time.Duration(rule.WindowMs)*time.Millisecond
					rs[r].Shadow = rule.Shadow
				}
			}
			dec.Rules = rs
		}
		if by := resp.DeniedBy[j]; by >= 0 && dom != nil && int(by) < len(dom.Rules) {
			dec.DeniedBy = dom.Rules[by].Name
		}
		if len(resp.ShadowDeniedBy) > 0 {
			if by := resp.ShadowDeniedBy[j]; by >= 0 && dom != nil && int(by) < len(dom.Rules) {
				dec.ShadowDeniedBy = dom.Rules[by].Name
			}
		}
		off += k
		emit(j, outcome{dec: dec})
	}
}

// checkResponse checks the shape of a response to n items and returns its
// item errors by index (nil if none) and which items are duplicates (nil if
// none).
func checkResponse(resp *pb.CheckResponse, n int) (failed []*pb.ItemError, dup []bool, err error) {
	for _, col := range []struct {
		name string
		len  int
	}{
		{"admitted", len(resp.Admitted)}, {"recorded", len(resp.Recorded)}, {"denied_by", len(resp.DeniedBy)},
		{"retry_after_ms", len(resp.RetryAfterMs)}, {"decided_at_ms", len(resp.DecidedAtMs)}, {"rule_counts", len(resp.RuleCounts)},
	} {
		if col.len != n {
			return nil, nil, fmt.Errorf("%s has %d entries for %d items", col.name, col.len, n)
		}
	}
	if k := len(resp.ShadowDeniedBy); k != 0 && k != n {
		return nil, nil, fmt.Errorf("shadow_denied_by has %d entries for %d items, want 0 or %d", k, n, n)
	}
	total := 0
	for _, k := range resp.RuleCounts {
		total += int(k)
	}
	if len(resp.Used) != total || len(resp.Remaining) != total || len(resp.RuleRetryAfterMs) != total {
		return nil, nil, fmt.Errorf("per-rule columns have %d, %d, %d entries, rule_counts add up to %d",
			len(resp.Used), len(resp.Remaining), len(resp.RuleRetryAfterMs), total)
	}
	if len(resp.Errors) > 0 {
		failed = make([]*pb.ItemError, n)
		for _, e := range resp.Errors {
			if int(e.Index) >= n {
				return nil, nil, fmt.Errorf("error for item %d of %d", e.Index, n)
			}
			failed[e.Index] = e
		}
	}
	if dup, err = indexSet("duplicates", resp.Duplicates, n); err != nil {
		return nil, nil, err
	}
	return failed, dup, nil
}

// indexSet returns which of n items a response's list of item indices
// names, or nil if it names none.
func indexSet(name string, idx []uint32, n int) ([]bool, error) {
	if len(idx) == 0 {
		return nil, nil
	}
	set := make([]bool, n)
	for _, i := range idx {
		if int(i) >= n {
			return nil, fmt.Errorf("%s names item %d of %d", name, i, n)
		}
		set[i] = true
	}
	return set, nil
}
