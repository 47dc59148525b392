package wire

import (
	"slices"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// TestMergeShadowColumn: a batch split across owners keeps each item's
// shadow_denied_by, and the column stays empty when no part has one.
func TestMergeShadowColumn(t *testing.T) {
	part := func(shadow []int32, k int) *Response {
		r := NewResponse(k)
		r.ShadowDeniedBy = shadow
		rr, err := Read(r, k)
		if err != nil {
			t.Fatal(err)
		}
		return rr
	}
	p1 := Part{Idx: []int{0, 2}, Resp: part(nil, 2)}
	p2 := Part{Idx: []int{1, 3}, Resp: part([]int32{-1, 4}, 2)}
	out := Merge(4, []Part{p1, p2}, 1)
	if want := []int32{-1, -1, -1, 4}; len(out.ShadowDeniedBy) != 4 || out.ShadowDeniedBy[3] != 4 || out.ShadowDeniedBy[1] != -1 || out.ShadowDeniedBy[0] != -1 {
		t.Fatalf("merged shadow_denied_by %v, want %v", out.ShadowDeniedBy, want)
	}
	p2.Resp = part(nil, 2)
	if out := Merge(4, []Part{p1, p2}, 1); out.ShadowDeniedBy != nil {
		t.Fatalf("merged shadow_denied_by %v, want empty", out.ShadowDeniedBy)
	}
}

// answers builds a response to items with the given rule counts, item j's
// rule k holding used 10*j+k, and the given errors and duplicates.
func answers(counts []int, errs map[int]*pb.ItemError, dups []uint32) *pb.CheckResponse {
	r := NewResponse(len(counts))
	for j, c := range counts {
		r.Admitted[j] = j%2 == 0
		r.DecidedAtMs[j] = int64(1000 + j)
		if e := errs[j]; e != nil {
			e.Index = uint32(j)
			r.Errors = append(r.Errors, e)
			continue
		}
		for k := range c {
			AppendRule(r, j, uint32(10*j+k), uint32(k), int64(k))
		}
	}
	r.Duplicates = dups
	return r
}

// TestMergeRemapsItems: Merge puts each part's answers, errors, rule
// entries and duplicates at their items' places in the request, and an item
// in two parts takes the last one's answer.
func TestMergeRemapsItems(t *testing.T) {
	a, err := Read(answers([]int{2, 0, 3}, map[int]*pb.ItemError{1: {Code: 3, Message: "bad", Field: Costs}}, []uint32{2}), 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Read(answers([]int{1}, nil, nil), 1)
	if err != nil {
		t.Fatal(err)
	}
	out := Merge(5, []Part{
		{Idx: []int{4, 0, 2}, Resp: a},
		{Idx: []int{1, 3}, Errors: []*pb.ItemError{{Code: 14, Message: "gone"}, {Code: 14, Message: "gone"}}},
		{Idx: []int{2}, Resp: b}, // answers item 2 again
	}, 7)
	r, err := Read(out, 5)
	if err != nil {
		t.Fatalf("merged response malformed: %v", err)
	}
	used := func(j int) []uint32 { u, _, _ := r.Rules(j); return u }
	if !slices.Equal(used(4), []uint32{0, 1}) || len(used(0)) != 0 || !slices.Equal(used(2), []uint32{0}) {
		t.Fatalf("rules: item 4 %v, item 0 %v, item 2 %v", used(4), used(0), used(2))
	}
	if e := r.Err(0); e == nil || e.Field != Costs || e.Index != 0 {
		t.Fatalf("item 0's error %v, want part a's error of its item 1, as item 0", e)
	}
	if r.Err(1).GetMessage() != "gone" || r.Err(3).GetMessage() != "gone" || r.Err(2) != nil || r.Err(4) != nil {
		t.Fatalf("errors %v", out.Errors)
	}
	if r.Duplicate(2) || len(out.Duplicates) != 0 {
		t.Fatalf("duplicates %v: item 2 is the last part's answer, not a duplicate", out.Duplicates)
	}
	if out.DecidedAtMs[4] != 1000 || out.DecidedAtMs[2] != 1000 || out.DeniedBy[1] != -1 || out.RingEpoch != 7 {
		t.Fatalf("decided at %v, denied by %v, epoch %d", out.DecidedAtMs, out.DeniedBy, out.RingEpoch)
	}
}

// TestReadRefusesMalformed: Read names the column of a response that does
// not answer its items.
func TestReadRefusesMalformed(t *testing.T) {
	ok := func() *pb.CheckResponse { return answers([]int{1, 2}, nil, nil) }
	for _, tc := range []struct {
		name   string
		mangle func(r *pb.CheckResponse)
		field  string
	}{
		{"short admitted", func(r *pb.CheckResponse) { r.Admitted = r.Admitted[:1] }, "admitted"},
		{"long decided_at", func(r *pb.CheckResponse) { r.DecidedAtMs = append(r.DecidedAtMs, 1) }, "decided_at_ms"},
		{"shadow of 1", func(r *pb.CheckResponse) { r.ShadowDeniedBy = []int32{1} }, "shadow_denied_by"},
		{"per-rule short", func(r *pb.CheckResponse) { r.Used = r.Used[:2] }, "used"},
		{"error past the end", func(r *pb.CheckResponse) { r.Errors = []*pb.ItemError{{Index: 2}} }, "errors"},
		{"nil error", func(r *pb.CheckResponse) { r.Errors = []*pb.ItemError{nil} }, "errors"},
		{"duplicate past the end", func(r *pb.CheckResponse) { r.Duplicates = []uint32{5} }, "duplicates"},
		{"refunded past the end", func(r *pb.CheckResponse) { r.Refunded = []uint32{2} }, "refunded"},
	} {
		r := ok()
		tc.mangle(r)
		_, err := Read(r, 2)
		if e, isShape := err.(*ShapeError); !isShape || e.Field != tc.field {
			t.Errorf("%s: %v, want a ShapeError of %s", tc.name, err, tc.field)
		}
	}
	if _, err := Read(ok(), 2); err != nil {
		t.Fatalf("a well-formed response: %v", err)
	}
}

// TestCheckRequest: the shape errors of a request name its column.
func TestCheckRequest(t *testing.T) {
	two := []string{"a", "b"}
	for _, tc := range []struct {
		req   *pb.CheckRequest
		field string
	}{
		{&pb.CheckRequest{}, Recipients},
		{&pb.CheckRequest{Recipients: make([]string, 11)}, Recipients},
		{&pb.CheckRequest{Recipients: two, Costs: []uint32{1, 2, 3}}, Costs},
		{&pb.CheckRequest{Recipients: two, Domains: []string{"a", "b", "c"}}, Domains},
		{&pb.CheckRequest{Recipients: two, RequestIds: []uint64{1}}, RequestIDs},
		{&pb.CheckRequest{Recipients: two, Contents: [][]byte{nil}, ContentHashes: []uint64{1}}, Contents},
		{&pb.CheckRequest{Recipients: two, Modes: []pb.Mode{1, 1, 1}}, Modes},
	} {
		err := CheckRequest(tc.req, 10)
		if e, ok := err.(*ShapeError); !ok || e.Field != tc.field {
			t.Errorf("%v: %v, want a ShapeError of %s", tc.req, err, tc.field)
		}
	}
	for _, req := range []*pb.CheckRequest{
		{Recipients: two}, {Recipients: two, Costs: []uint32{3}}, {Recipients: two, RequestIds: []uint64{1, 2}}, {Recipients: []string{"a"}, RequestIds: []uint64{1}},
	} {
		if err := CheckRequest(req, 10); err != nil {
			t.Errorf("%v: %v", req, err)
		}
	}
	if got := Pick(&pb.CheckRequest{Recipients: []string{"a", "b", "c"}, Costs: []uint32{1, 2, 3}, Domains: []string{"d"}}, []int{2, 0}, 9); !slices.Equal(got.Recipients, []string{"c", "a"}) ||
		!slices.Equal(got.Costs, []uint32{3, 1}) || !slices.Equal(got.Domains, []string{"d"}) || got.RingEpoch != 9 {
		t.Fatalf("Pick: %v", got)
	}
}

// FuzzRead: Read never panics on a response that does not answer its
// items, and what it accepts, Merge copies whole.
func FuzzRead(f *testing.F) {
	f.Add(uint8(2), []byte{1, 2}, []byte{0}, []byte{1})
	f.Add(uint8(0), []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, n uint8, counts, errIdx, dups []byte) {
		r := &pb.CheckResponse{}
		for range min(int(n), 64) {
			r.Admitted, r.Recorded = append(r.Admitted, true), append(r.Recorded, false)
			r.DeniedBy, r.RetryAfterMs, r.DecidedAtMs = append(r.DeniedBy, -1), append(r.RetryAfterMs, 0), append(r.DecidedAtMs, 1)
		}
		for _, c := range counts {
			r.RuleCounts = append(r.RuleCounts, uint32(c%5))
			for range c % 5 {
				r.Used, r.Remaining, r.RuleRetryAfterMs = append(r.Used, 1), append(r.Remaining, 2), append(r.RuleRetryAfterMs, 3)
			}
		}
		for _, e := range errIdx {
			r.Errors = append(r.Errors, &pb.ItemError{Index: uint32(e)})
		}
		for _, d := range dups {
			r.Duplicates = append(r.Duplicates, uint32(d))
		}
		k := int(n)
		resp, err := Read(r, k)
		if err != nil {
			return
		}
		idx := make([]int, k)
		for i := range idx {
			idx[i] = i
		}
		out := Merge(k, []Part{{Idx: idx, Resp: resp}}, 0)
		if _, err := Read(out, k); err != nil || len(out.Used) != len(r.Used) {
			t.Fatalf("Merge of an accepted response: %v, %d rule entries of %d", err, len(out.Used), len(r.Used))
		}
	})
}

// TestDetail: an item error's message loses the field its node named first,
// with or without an index, and only that.
func TestDetail(t *testing.T) {
	for _, tc := range []struct{ field, msg, want string }{
		{Costs, "costs[2]: cost 5000 out of range [1, 1000]", "cost 5000 out of range [1, 1000]"},
		{RequestIDs, `request_ids: recipient "a": reused`, `recipient "a": reused`},
		{"", "costs[2]: no field given", "costs[2]: no field given"},
		{Costs, "another message", "another message"},
		{Costs, "costs[2 unterminated", "costs[2 unterminated"},
	} {
		if got := Detail(&pb.ItemError{Field: tc.field, Message: tc.msg}); got != tc.want {
			t.Errorf("Detail(%q, %q) = %q, want %q", tc.field, tc.msg, got, tc.want)
		}
	}
}
