package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// refundCheck sends one item of domain default to rcp with content 1 and
// request id id in mode m.
func refundCheck(t *testing.T, n *Node, rcp string, id uint64, m pb.Mode) *pb.CheckResponse {
	t.Helper()
	resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{1},
		RequestIds: []uint64{id}, Modes: []pb.Mode{m}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestRefundFreesExactlyOneSend: a refund takes back one recorded send,
// durably (WAL replay after a crash, and a snapshot); a repeated refund
// frees nothing; refunds of an unknown id, of a denied check, of another
// content and without an id fail and change nothing.
func TestRefundFreesExactlyOneSend(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(1_790_000_000_000)
	n := openNode(t, durableConfig(t, dir, clk))
	const rcp = "+8613800000001"
	for id := uint64(1); id <= 2; id++ {
		if resp := refundCheck(t, n, rcp, id, pb.Mode_MODE_CHECK_AND_RECORD); !resp.Admitted[0] {
			t.Fatalf("send %d denied", id)
		}
	}
	if resp := refundCheck(t, n, rcp, 3, pb.Mode_MODE_CHECK_AND_RECORD); resp.Admitted[0] {
		t.Fatal("a third identical message within 59 s admitted")
	}
	used := func(n *Node) []uint32 {
		return refundCheck(t, n, rcp, 0, pb.Mode_MODE_PEEK).Used
	}
	resp := refundCheck(t, n, rcp, 2, pb.Mode_MODE_REFUND)
	if len(resp.Errors) > 0 || !slices.Equal(resp.Refunded, []uint32{0}) || resp.Recorded[0] || !slices.Equal(resp.Used, []uint32{1, 1, 1, 1}) {
		t.Fatalf("refund: %v", resp)
	}
	if resp := refundCheck(t, n, rcp, 2, pb.Mode_MODE_REFUND); len(resp.Refunded) != 0 || !slices.Equal(resp.Duplicates, []uint32{0}) || !slices.Equal(resp.Used, []uint32{1, 1, 1, 1}) {
		t.Fatalf("a repeated refund: %v; want a duplicate that frees nothing", resp)
	}
	for _, tc := range []struct {
		name string
		req  *pb.CheckRequest
		code codes.Code
	}{
		{"unknown id", &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{1}, RequestIds: []uint64{99}, Modes: []pb.Mode{pb.Mode_MODE_REFUND}}, codes.NotFound},
		{"denied check", &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{1}, RequestIds: []uint64{3}, Modes: []pb.Mode{pb.Mode_MODE_REFUND}}, codes.NotFound},
		{"other content", &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{2}, RequestIds: []uint64{1}, Modes: []pb.Mode{pb.Mode_MODE_REFUND}}, codes.AlreadyExists},
		{"no id", &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{1}, Modes: []pb.Mode{pb.Mode_MODE_REFUND}}, codes.InvalidArgument},
	} {
		resp, err := n.Check(context.Background(), tc.req)
		if err != nil || len(resp.Errors) != 1 || codes.Code(resp.Errors[0].Code) != tc.code {
			t.Fatalf("%s: %v %v; want item error %v", tc.name, resp.GetErrors(), err, tc.code)
		}
	}
	if got := used(n); !slices.Equal(got, []uint32{1, 1, 1, 1}) {
		t.Fatalf("after failed refunds: used %v, want 1 1 1 1", got)
	}
	if resp := refundCheck(t, n, rcp, 4, pb.Mode_MODE_CHECK_AND_RECORD); !resp.Admitted[0] {
		t.Fatal("the refunded send still counts: the next identical message is denied")
	}
	if s := n.Stats(); s.Refunds != 1 {
		t.Fatalf("Stats.Refunds %d, want 1", s.Refunds)
	}
	want := used(n)

	crash(t, n) // the refund comes back from the WAL
	n2 := openNode(t, durableConfig(t, dir, clk))
	if got := used(n2); !slices.Equal(got, want) {
		t.Fatalf("after a crash: used %v, want %v", got, want)
	}
	if resp := refundCheck(t, n2, rcp, 2, pb.Mode_MODE_REFUND); len(resp.Duplicates) != 1 {
		t.Fatalf("a refund after the crash of one before it: %v; want a duplicate", resp)
	}
	if err := n2.Close(); err != nil { // and from the snapshot
		t.Fatal(err)
	}
	clk.advance(time.Millisecond)
	n3 := openNode(t, durableConfig(t, dir, clk))
	defer n3.Close()
	if got := used(n3); !slices.Equal(got, want) {
		t.Fatalf("after a restart: used %v, want %v", got, want)
	}
}
