package wire

import (
	"slices"
	"sort"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// NewResponse returns an empty response to n items, with room for four
// rules each, its denied_by entries at -1 ("none"). The columns of one
// element type share one array, each with its capacity capped, so that an
// append past it (a fifth rule) moves that column alone: 6 allocations
// instead of 11. Fill it with the Set and Append functions, item after item.
func NewResponse(n int) *pb.CheckResponse {
	flags := make([]bool, 2*n)
	i64 := make([]int64, 6*n)
	u32 := make([]uint32, 9*n)
	deniedBy := make([]int32, n)
	for j := range deniedBy {
		deniedBy[j] = -1
	}
	return &pb.CheckResponse{
		Admitted:         flags[:n:n],
		Recorded:         flags[n:],
		DeniedBy:         deniedBy,
		RetryAfterMs:     i64[:n:n],
		DecidedAtMs:      i64[n : 2*n : 2*n],
		RuleRetryAfterMs: i64[2*n : 2*n],
		RuleCounts:       u32[:n:n],
		Used:             u32[n : n : 5*n],
		Remaining:        u32[5*n : 5*n],
		Domains:          make(map[string]*pb.Domain, 1),
	}
}

// AppendRule appends item j's next rule entry to resp: item j must be the
// last item given rules so far.
func AppendRule(resp *pb.CheckResponse, j int, used, remaining uint32, retryAfterMs int64) {
	resp.RuleCounts[j]++
	resp.Used = append(resp.Used, used)
	resp.Remaining = append(resp.Remaining, remaining)
	resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, retryAfterMs)
}

// SetShadowDeniedBy sets item j's shadow_denied_by to rule, making the
// column (one entry per item, -1 for none) on the first item that has one.
func SetShadowDeniedBy(resp *pb.CheckResponse, j int, rule int32) {
	if resp.ShadowDeniedBy == nil {
		resp.ShadowDeniedBy = make([]int32, len(resp.Admitted))
		for k := range resp.ShadowDeniedBy {
			resp.ShadowDeniedBy[k] = -1
		}
	}
	resp.ShadowDeniedBy[j] = rule
}

// SortErrors orders a response's item errors by index.
func SortErrors(es []*pb.ItemError) {
	sort.Slice(es, func(a, b int) bool { return es[a].Index < es[b].Index })
}

// Response is a CheckResponse to n items whose shape Read checked, with
// each item's error and per-rule entries at hand. It does not change the
// message.
type Response struct {
	*pb.CheckResponse
	off           []int           // first per-rule entry of each item
	errs          []*pb.ItemError // by item; nil when none failed
	dup, refunded []bool          // by item; nil when none is
}

// Read checks that resp answers n items: every per-item column has n
// entries (shadow_denied_by 0 or n), the per-rule columns as many as
// rule_counts add up to, and errors, duplicates and refunded name items of
// the n. The error names the column.
func Read(resp *pb.CheckResponse, n int) (*Response, error) {
	for _, col := range []struct {
		name string
		len  int
	}{
		{"admitted", len(resp.Admitted)}, {"recorded", len(resp.Recorded)}, {"denied_by", len(resp.DeniedBy)},
		{"retry_after_ms", len(resp.RetryAfterMs)}, {"decided_at_ms", len(resp.DecidedAtMs)}, {"rule_counts", len(resp.RuleCounts)},
	} {
		if col.len != n {
			return nil, shapeErr(col.name, "%d entries for %d items", col.len, n)
		}
	}
	if k := len(resp.ShadowDeniedBy); k != 0 && k != n {
		return nil, shapeErr("shadow_denied_by", "%d entries for %d items, want 0 or %d", k, n, n)
	}
	r := &Response{CheckResponse: resp, off: make([]int, n)}
	total := 0
	for j, k := range resp.RuleCounts {
		r.off[j] = total
		total += int(k)
	}
	if len(resp.Used) != total || len(resp.Remaining) != total || len(resp.RuleRetryAfterMs) != total {
		return nil, shapeErr("used", "per-rule columns have %d, %d, %d entries, rule_counts add up to %d",
			len(resp.Used), len(resp.Remaining), len(resp.RuleRetryAfterMs), total)
	}
	if len(resp.Errors) > 0 {
		r.errs = make([]*pb.ItemError, n)
		for _, e := range resp.Errors {
			if e == nil || int(e.Index) >= n {
				return nil, shapeErr("errors", "an error for item %d of %d", e.GetIndex(), n)
			}
			r.errs[e.Index] = e
		}
	}
	var err error
	if r.dup, err = indexSet("duplicates", resp.Duplicates, n); err != nil {
		return nil, err
	}
	if r.refunded, err = indexSet("refunded", resp.Refunded, n); err != nil {
		return nil, err
	}
	return r, nil
}

// indexSet returns which of n items a list of item indices names, or nil
// if it names none.
func indexSet(name string, idx []uint32, n int) ([]bool, error) {
	if len(idx) == 0 {
		return nil, nil
	}
	set := make([]bool, n)
	for _, i := range idx {
		if int(i) >= n {
			return nil, shapeErr(name, "item %d of %d", i, n)
		}
		set[i] = true
	}
	return set, nil
}

// Len returns the number of items.
func (r *Response) Len() int { return len(r.off) }

// Err returns item j's error, nil if it did not fail.
func (r *Response) Err(j int) *pb.ItemError {
	if r.errs == nil {
		return nil
	}
	return r.errs[j]
}

// Duplicate reports whether item j was answered from its request id.
func (r *Response) Duplicate(j int) bool { return r.dup != nil && r.dup[j] }

// Refunded reports whether item j, a refund, took its send back now.
func (r *Response) Refunded(j int) bool { return r.refunded != nil && r.refunded[j] }

// ShadowDeniedBy returns the index of the shadow rule that would have
// denied item j, -1 if none.
func (r *Response) ShadowDeniedBy(j int) int32 {
	if r.CheckResponse.ShadowDeniedBy == nil {
		return -1
	}
	return r.CheckResponse.ShadowDeniedBy[j]
}

// Rules returns item j's per-rule entries, one per rule of its domain in
// rule order (none if it failed): slices of the response's columns.
func (r *Response) Rules(j int) (used, remaining []uint32, retryAfterMs []int64) {
	lo, hi := r.off[j], r.off[j]+int(r.RuleCounts[j])
	return r.Used[lo:hi:hi], r.Remaining[lo:hi:hi], r.RuleRetryAfterMs[lo:hi:hi]
}

// Part is the answer to some items of a request: the response to them, in
// the order of Idx (their indices in the request), or, without one, an
// error for each (Errors[k] answers Idx[k]; its Index is ignored).
type Part struct {
	Idx    []int
	Resp   *Response
	Errors []*pb.ItemError
}

// Merge assembles the response to a request of n items from its parts, in
// request order, with ring epoch epoch. An item in several parts is
// answered by the last of them. Every item must be in some part.
func Merge(n int, parts []Part, epoch uint64) *pb.CheckResponse {
	out := NewResponse(n)
	out.RingEpoch = epoch
	type src struct{ p, k int } // part, and position in it
	where := make([]src, n)
	for p, pt := range parts {
		for k, i := range pt.Idx {
			where[i] = src{p, k}
		}
	}
	for p, pt := range parts {
		if pt.Resp == nil {
			continue
		}
		for name, d := range pt.Resp.Domains {
			out.Domains[name] = d
		}
		for k, i := range pt.Idx {
			if where[i] != (src{p, k}) {
				continue
			}
			if pt.Resp.Duplicate(k) {
				out.Duplicates = append(out.Duplicates, uint32(i))
			}
			if pt.Resp.Refunded(k) {
				out.Refunded = append(out.Refunded, uint32(i))
			}
		}
	}
	for i := range n {
		s := where[i]
		mergeItem(out, i, &parts[s.p], s.k)
	}
	SortErrors(out.Errors)
	slices.Sort(out.Duplicates)
	slices.Sort(out.Refunded)
	return out
}

// mergeItem writes answer k of part pt as item i of out.
func mergeItem(out *pb.CheckResponse, i int, pt *Part, k int) {
	if pt.Resp == nil {
		e := pt.Errors[k]
		out.Errors = append(out.Errors, &pb.ItemError{Index: uint32(i), Code: e.Code, Message: e.Message, Field: e.Field})
		return
	}
	r := pt.Resp
	if e := r.Err(k); e != nil {
		out.Errors = append(out.Errors, &pb.ItemError{Index: uint32(i), Code: e.Code, Message: e.Message, Field: e.Field})
	}
	out.Admitted[i], out.Recorded[i], out.DeniedBy[i] = r.Admitted[k], r.Recorded[k], r.DeniedBy[k]
	if s := r.ShadowDeniedBy(k); s >= 0 {
		SetShadowDeniedBy(out, i, s)
	}
	out.RetryAfterMs[i], out.DecidedAtMs[i] = r.RetryAfterMs[k], r.DecidedAtMs[k]
	used, remaining, retry := r.Rules(k)
	out.RuleCounts[i] = uint32(len(used))
	out.Used = append(out.Used, used...)
	out.Remaining = append(out.Remaining, remaining...)
	out.RuleRetryAfterMs = append(out.RuleRetryAfterMs, retry...)
}
