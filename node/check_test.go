package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

const t0 = int64(1_790_000_000_000) // unix ms

// fixedClock is a Clock stuck at one instant, in unix ns.
type fixedClock struct{ ns int64 }

func (c *fixedClock) Now() int64 { return c.ns }

func newTestNode(t testing.TB) (*Node, *fixedClock) {
	t.Helper()
	clk := &fixedClock{ns: t0 * 1e6}
	n, err := New(Config{Clock: clk, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, clk
}

func TestCheckRejectsMalformedBatches(t *testing.T) {
	n, _ := newTestNode(t)
	three := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name string
		req  *pb.CheckRequest
		want string
	}{
		{"no items", &pb.CheckRequest{}, "recipients: 0 items, want 1 to 10000"},
		{"too many", &pb.CheckRequest{Recipients: make([]string, MaxBatch+1)}, "recipients: 10001 items, want 1 to 10000"},
		{"short column", &pb.CheckRequest{Recipients: three, Costs: []uint32{1, 2}}, "costs: 2 entries, want 0, 1 or 3 (one per recipient)"},
		{"long column", &pb.CheckRequest{Recipients: three, Domains: []string{"a", "b", "c", "d"}}, "domains: 4 entries"},
		{"both contents", &pb.CheckRequest{Recipients: three, Contents: [][]byte{{1}}, ContentHashes: []uint64{1}}, "contents and content_hashes: set at most one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Check(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
	if s := n.Stats(); s.Checks != 0 || s.Domains[0].Records != 0 {
		t.Fatalf("a malformed batch changed the node: %+v", s)
	}
}

func TestCheckReportsBadItemsAndDecidesTheRest(t *testing.T) {
	n, _ := newTestNode(t)
	long := strings.Repeat("9", MaxRecipientBytes+1)
	req := &pb.CheckRequest{
		Recipients: []string{"ok-1", "", long, "ok-2", "ok-3", "ok-4", "ok-5", "ok-6"},
		Domains:    []string{"", "", "", "nope", "", "", "", "default"},
		Costs:      []uint32{1, 1, 1, 1, 0, 1001, 16, 1},
		Modes:      []pb.Mode{0, 0, 0, 0, 0, 0, 0, 7},
	}
	resp, err := n.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]string{
		1: "recipients[1]: empty recipient",
		2: "recipients[2]: 257 bytes, more than 256",
		3: `domains[3]: unknown domain "nope" (this node serves [default])`,
		5: "costs[5]: cost 1001 out of range [1, 1000] (0 means 1)",
		6: `recipient "ok-5": cost 16 exceeds limit 15 of rule "recipient-1m"`,
		7: "modes[7]: unknown mode 7",
	}
	if len(resp.Errors) != len(want) {
		t.Fatalf("errors %v, want %d", resp.Errors, len(want))
	}
	for _, e := range resp.Errors {
		if e.Code != uint32(codes.InvalidArgument) || e.Message != want[e.Index] {
			t.Errorf("item %d: code %d %q, want InvalidArgument %q", e.Index, e.Code, e.Message, want[e.Index])
		}
		if resp.Admitted[e.Index] || resp.Recorded[e.Index] || resp.DeniedBy[e.Index] != -1 {
			t.Errorf("failed item %d reported admitted=%v recorded=%v", e.Index, resp.Admitted[e.Index], resp.Recorded[e.Index])
		}
	}
	if !resp.Admitted[0] || !resp.Recorded[0] || len(resp.Used) != 8 || resp.Used[0] != 1 {
		t.Fatalf("good item: admitted=%v used=%v", resp.Admitted[0], resp.Used)
	}
	if !resp.Recorded[4] || resp.Used[4] != 1 { // cost 0 means 1, as in the client and the CLI
		t.Fatalf("item of cost 0: recorded=%v used=%v", resp.Recorded[4], resp.Used[4:])
	}
	// Only the two good items were recorded.
	if s := n.Stats(); s.Domains[0].Records != 2 || s.Checks != 8 || s.Failed != 6 || s.Admitted != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCheckColumnsBroadcast(t *testing.T) {
	n, _ := newTestNode(t)
	req := &pb.CheckRequest{
		Recipients: []string{"r", "r", "r"},
		Contents:   [][]byte{[]byte("your code is 1234")}, // one entry: every item
		Costs:      []uint32{1},
	}
	resp, err := n.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// content-59s allows 2 identical messages: the third is denied by it.
	if !resp.Admitted[0] || !resp.Admitted[1] || resp.Admitted[2] || resp.DeniedBy[2] != 2 {
		t.Fatalf("admitted %v denied_by %v", resp.Admitted, resp.DeniedBy)
	}
	if resp.RetryAfterMs[2] != 59_000 || resp.DecidedAtMs[2] != t0 {
		t.Fatalf("retry %d at %d, want 59000 at %d", resp.RetryAfterMs[2], resp.DecidedAtMs[2], t0)
	}
	if d := resp.Domains["default"]; d == nil || len(d.Rules) != 4 || d.Rules[2].Name != "content-59s" || d.Rules[2].WindowMs != 59_000 {
		t.Fatalf("domains %v", resp.Domains)
	}
	if got := len(resp.Used); got != 12 {
		t.Fatalf("%d per-rule entries, want 3 items x 4 rules", got)
	}
}

// FuzzCheckRequest: arbitrary column contents never panic the node; a bad item
// is reported and never recorded.
func FuzzCheckRequest(f *testing.F) {
	f.Add("a\x00b\x00", "default\x00", []byte{1, 2}, uint32(1), int32(0), uint64(0))
	f.Add("\x00", "nope", []byte{}, uint32(0), int32(9), uint64(5))
	n, _ := newTestNode(f)
	f.Fuzz(func(t *testing.T, recipients, domains string, content []byte, cost uint32, mode int32, hash uint64) {
		req := &pb.CheckRequest{Recipients: strings.Split(recipients, "\x00")}
		if domains != "" {
			req.Domains = strings.Split(domains, "\x00")
		}
		if len(content) > 0 {
			req.Contents = [][]byte{content}
		} else if hash != 0 {
			req.ContentHashes = []uint64{hash}
		}
		req.Costs = []uint32{cost}
		req.Modes = []pb.Mode{pb.Mode(mode)}
		before := n.Stats().Domains[0].Records
		resp, err := n.Check(context.Background(), req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("batch error %v is not InvalidArgument", err)
			}
			return
		}
		recorded := 0
		for i := range req.Recipients {
			if resp.Recorded[i] {
				recorded++
			}
		}
		for _, e := range resp.Errors {
			if resp.Recorded[e.Index] || e.Message == "" {
				t.Fatalf("failed item %d: recorded=%v message %q", e.Index, resp.Recorded[e.Index], e.Message)
			}
		}
		if after := n.Stats().Domains[0].Records; after-before > int64(recorded) {
			t.Fatalf("%d new records for %d recorded items", after-before, recorded)
		}
	})
}

// TestLateRequestDecidesNothing: a request the node reads more than
// LateRequestSlack after its caller's deadline (not_after_ms) is refused
// whole with DEADLINE_EXCEEDED and records nothing: its caller has given
// up, and may have retried elsewhere. One read within the slack is decided.
func TestLateRequestDecidesNothing(t *testing.T) {
	n, _ := newTestNode(t)
	ctx := context.Background()
	late := time.Now().Add(-LateRequestSlack - time.Second).UnixMilli()
	_, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000001"}, NotAfterMs: late})
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "not_after_ms") {
		t.Fatalf("a request read 2 s past its deadline: %v; want DEADLINE_EXCEEDED naming not_after_ms", err)
	}
	if got := n.Stats().LateRequests; got != 1 {
		t.Fatalf("LateRequests = %d, want 1", got)
	}
	peek, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000001"}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || peek.Used[0] != 0 {
		t.Fatalf("after the late request: %v %v; want nothing counted", peek.GetUsed(), err)
	}
	within := time.Now().Add(-LateRequestSlack / 2).UnixMilli()
	resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000001"}, NotAfterMs: within})
	if err != nil || !resp.Admitted[0] {
		t.Fatalf("a request read within the slack: %v %v; want it decided", resp, err)
	}
}
