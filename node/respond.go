package node

import (
	"sort"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/store"
)

// This file writes a check's response columns.

// newResponse returns an empty response with room for n items and four
// rules each. The columns of one element type share one array, each with
// its capacity capped, so that an append past it (a fifth rule) moves that
// column alone: 6 allocations instead of 11.
func newResponse(n int) *pb.CheckResponse {
	flags := make([]bool, 2*n)
	i64 := make([]int64, 6*n)
	u32 := make([]uint32, 9*n)
	return &pb.CheckResponse{
		Admitted:         flags[:n:n],
		Recorded:         flags[n:],
		DeniedBy:         make([]int32, n),
		RetryAfterMs:     i64[:n:n],
		DecidedAtMs:      i64[n : 2*n : 2*n],
		RuleRetryAfterMs: i64[2*n : 2*n],
		RuleCounts:       u32[:n:n],
		Used:             u32[n : n : 5*n],
		Remaining:        u32[5*n : 5*n],
		Domains:          make(map[string]*pb.Domain, 1),
	}
}

// setShadowDeniedBy sets item j's shadow_denied_by to rule, making the
// column (one entry per item, -1 for none) on the first item that has one.
func setShadowDeniedBy(resp *pb.CheckResponse, j int, rule int32) {
	if resp.ShadowDeniedBy == nil {
		resp.ShadowDeniedBy = make([]int32, len(resp.Admitted))
		for k := range resp.ShadowDeniedBy {
			resp.ShadowDeniedBy[k] = -1
		}
	}
	resp.ShadowDeniedBy[j] = rule
}

// sortErrors orders item errors by index.
func sortErrors(es []*pb.ItemError) {
	sort.Slice(es, func(a, b int) bool { return es[a].Index < es[b].Index })
}

// answer writes the store's decision of item x as answer j of resp: its
// domain, the decision's columns, one entry per rule, and its place among
// the duplicates or the refunded.
func answer(resp *pb.CheckResponse, j int, x *item, sb *store.BatchItem) {
	dec := &sb.Dec
	switch {
	case sb.Dup:
		resp.Duplicates = append(resp.Duplicates, uint32(j))
	case x.refund:
		resp.Refunded = append(resp.Refunded, uint32(j))
	}
	resp.Domains[x.dv.d.Name()] = x.dv.proto
	resp.Admitted[j] = dec.Admitted
	resp.Recorded[j] = dec.Recorded
	resp.DeniedBy[j] = int32(dec.DeniedBy)
	if dec.ShadowDeniedBy >= 0 && !x.dv.exempt {
		setShadowDeniedBy(resp, j, int32(dec.ShadowDeniedBy))
	}
	resp.RetryAfterMs[j] = dec.RetryAfter
	resp.DecidedAtMs[j] = dec.At
	resp.RuleCounts[j] = uint32(dec.NumRules)
	for _, r := range dec.Rules[:dec.NumRules] {
		resp.Used = append(resp.Used, uint32(r.Used))
		resp.Remaining = append(resp.Remaining, uint32(r.Remaining))
		resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, r.RetryAfter)
	}
}
