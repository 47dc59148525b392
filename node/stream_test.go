package node_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

// settableClock reads what the test set, unix ns.
type settableClock struct{ ns atomic.Int64 }

func (c *settableClock) Now() int64 { return c.ns.Load() }

// TestCheckStreamDecidesAsCheck is the oracle of CheckStream: two nodes of
// the same rules and clock get the same seeded random requests (bad items,
// retried request ids, peeks, record-only, malformed batches among them),
// one through Check, the other on one CheckStream, a request at a time; the
// answers must be equal, a malformed batch's failed status equal to Check's
// error.
func TestCheckStreamDecidesAsCheck(t *testing.T) {
	rs, err := rules.Parse("test", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	var clocks [2]*settableClock
	var clis [2]pb.LimiterClient
	for i := range clocks {
		clocks[i] = &settableClock{}
		n, err := node.New(node.Config{Rules: rs, Clock: clocks[i], Name: "oracle"})
		if err != nil {
			t.Fatal(err)
		}
		clis[i] = startServer(t, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := clis[1].CheckStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(13, 1))
	now := int64(1_790_000_000_000) * 1e6
	var ids []uint64
	decided, failed, dups, itemErrs := 0, 0, 0, 0
	for i := range 1500 {
		now += rng.Int64N(300e6) // up to 300 ms between requests: the fast domain's windows slide
		req := randomRequest(rng, &ids)
		req.StreamId = uint64(i)*7 + 1
		for _, c := range clocks {
			c.ns.Store(now)
		}
		want, werr := clis[0].Check(ctx, req)
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("request %d: stream: %v", i, err)
		}
		if got.StreamId != req.StreamId {
			t.Fatalf("request %d: answer has stream_id %d, want %d", i, got.StreamId, req.StreamId)
		}
		if werr != nil {
			st := status.Convert(werr)
			if got.Failed == nil || codes.Code(got.Failed.Code) != st.Code() || got.Failed.Message != st.Message() {
				t.Fatalf("request %d: Check failed with %v; streamed answer %v", i, werr, got)
			}
			if len(got.Admitted) != 0 {
				t.Fatalf("request %d: a failed request's answer has items: %v", i, got)
			}
			failed++
			continue
		}
		got.StreamId = 0
		got.RingEpoch, want.RingEpoch = 0, 0 // a single node's epoch hashes its address
		dups += len(want.Duplicates)
		itemErrs += len(want.Errors)
		if !proto.Equal(got, want) {
			t.Fatalf("request %d %v:\nstreamed %v\nCheck    %v", i, req, got, want)
		}
		decided++
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v, want io.EOF", err)
	}
	if failed == 0 || decided < 1000 || dups == 0 || itemErrs == 0 {
		t.Fatalf("%d requests decided, %d failed whole, %d duplicates, %d item errors: the mix tests too little", decided, failed, dups, itemErrs)
	}
	t.Logf("%d requests decided, %d failed whole, %d duplicates, %d item errors", decided, failed, dups, itemErrs)
}

// randomRequest returns a batch of 1 to 8 items over a few recipients and
// contents, in both domains, with costs, modes, request ids (some repeated
// from ids, some reused for other items) and bad items; one in 40 is
// malformed (no items, or a column of the wrong length).
func randomRequest(rng *rand.Rand, ids *[]uint64) *pb.CheckRequest {
	switch rng.IntN(80) {
	case 0:
		return &pb.CheckRequest{}
	case 1:
		return &pb.CheckRequest{Recipients: []string{"a", "b", "c"}, Costs: []uint32{1, 2}}
	}
	k := 1 + rng.IntN(8)
	req := &pb.CheckRequest{}
	for range k {
		rcp := fmt.Sprintf("+86138%08d", rng.IntN(6))
		switch rng.IntN(50) {
		case 0:
			rcp = ""
		case 1:
			rcp = strings.Repeat("9", 257)
		}
		dom := []string{"", "default", "fast", "fast", "nope"}[rng.IntN(5)]
		if dom == "nope" && rng.IntN(4) > 0 {
			dom = "fast"
		}
		var id uint64
		switch r := rng.IntN(10); {
		case r < 5:
			id = rng.Uint64() | 1
			*ids = append(*ids, id)
		case r < 7 && len(*ids) > 0:
			id = (*ids)[rng.IntN(len(*ids))] // a retry, or an id reused for another item
		}
		mode := pb.Mode_MODE_CHECK_AND_RECORD
		switch rng.IntN(10) {
		case 0:
			mode = pb.Mode_MODE_PEEK
		case 1:
			mode = pb.Mode_MODE_RECORD_ONLY
		}
		req.Recipients = append(req.Recipients, rcp)
		req.Domains = append(req.Domains, dom)
		req.ContentHashes = append(req.ContentHashes, uint64(rng.IntN(3)))
		req.Costs = append(req.Costs, uint32(rng.IntN(3)))
		req.Modes = append(req.Modes, mode)
		req.RequestIds = append(req.RequestIds, id)
	}
	return req
}

// TestMaxStreamRequestsValidated: the bound is checked, naming the field and
// the value.
func TestMaxStreamRequestsValidated(t *testing.T) {
	for _, v := range []int{-1, 4097} {
		_, err := node.New(node.Config{Limits: node.Limits{MaxStreamRequests: v}})
		if want := fmt.Sprintf("Limits.MaxStreamRequests %d out of range [1, 4096]", v); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("MaxStreamRequests %d: %v, want %q", v, err, want)
		}
	}
}
