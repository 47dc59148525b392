package node

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// retryOnce sends req twice and returns both responses.
func retryOnce(t *testing.T, check func(context.Context, *pb.CheckRequest) (*pb.CheckResponse, error), req *pb.CheckRequest) (*pb.CheckResponse, *pb.CheckResponse) {
	t.Helper()
	a, err := check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestRetriedItemIsRecordedOnce(t *testing.T) {
	n, clk := newTestNode(t)
	req := &pb.CheckRequest{Recipients: []string{"a", "b", "a"}, RequestIds: []uint64{11, 12, 13}, Costs: []uint32{2}}
	first, again := retryOnce(t, n.Check, req)
	if !reflect.DeepEqual(again.Duplicates, []uint32{0, 1, 2}) || len(first.Duplicates) != 0 {
		t.Fatalf("duplicates: first %v, retry %v", first.Duplicates, again.Duplicates)
	}
	if !reflect.DeepEqual(again.Admitted, first.Admitted) || !reflect.DeepEqual(again.DecidedAtMs, first.DecidedAtMs) {
		t.Fatalf("retry answers %v at %v, first %v at %v", again.Admitted, again.DecidedAtMs, first.Admitted, first.DecidedAtMs)
	}
	peek, _ := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"a", "b"}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if peek.Used[0] != 4 || peek.Used[4] != 2 { // a: two items of cost 2; b: one
		t.Fatalf("used after retry: a %d, b %d; want 4 and 2", peek.Used[0], peek.Used[4])
	}
	// Past the window the id is new again.
	clk.ns += int64(2 * time.Minute)
	late, _ := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"b"}, RequestIds: []uint64{12}})
	if len(late.Duplicates) != 0 || !late.Recorded[0] {
		t.Fatalf("an id past the window: duplicates %v recorded %v", late.Duplicates, late.Recorded)
	}
	// A denied item is not remembered: its retry is decided afresh.
	for range 20 {
		n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"c"}})
	}
	d1, d2 := retryOnce(t, n.Check, &pb.CheckRequest{Recipients: []string{"c"}, RequestIds: []uint64{99}})
	if d1.Admitted[0] || d2.Admitted[0] || len(d2.Duplicates) != 0 {
		t.Fatalf("denied item retried: %v %v dup %v", d1.Admitted, d2.Admitted, d2.Duplicates)
	}
}

func TestRequestIDsSurviveRestarts(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		dir := t.TempDir()
		clk := &testClock{}
		clk.set(t0)
		cfg := durableConfig(t, dir, clk)
		a := openNode(t, cfg)
		req := &pb.CheckRequest{Recipients: []string{"x", "y"}, RequestIds: []uint64{5, 6}}
		if _, err := a.Check(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if graceful {
			a.Close() // snapshot: ids travel in it
		} else {
			crash(t, a) // WAL: ids travel in it
		}
		b := openNode(t, cfg)
		resp, err := b.Check(context.Background(), req)
		if err != nil || !reflect.DeepEqual(resp.Duplicates, []uint32{0, 1}) {
			t.Fatalf("graceful=%v: retry after restart: %v duplicates %v", graceful, err, resp.GetDuplicates())
		}
		b.Close()
	}
}

// Case 8 of issue 12: a request id reused with other content, cost, mode or
// domain was answered as a duplicate of the first item, silently. Now it is
// a per-item ALREADY_EXISTS naming the field, and nothing is recorded; a
// true retry is still a duplicate.
func TestReusedRequestIDIsAnItemError(t *testing.T) {
	rs, err := rules.Parse("test", []byte(`domains:
  - name: default
    rules: [{name: r, scope: recipient, limit: 100, window: 1m}]
  - name: other
    rules: [{name: r, scope: recipient, limit: 100, window: 1m}]
`))
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(Config{Clock: &fixedClock{ns: t0 * 1e6}, Name: "test", Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	first := &pb.CheckRequest{Recipients: []string{"a"}, Contents: [][]byte{[]byte("hello")}, Costs: []uint32{2}, RequestIds: []uint64{7}}
	if resp, err := n.Check(context.Background(), first); err != nil || !resp.Recorded[0] {
		t.Fatalf("first: %v %v", resp, err)
	}
	for _, tc := range []struct {
		name string
		req  *pb.CheckRequest
		want string
	}{
		{"content", &pb.CheckRequest{Recipients: []string{"a"}, Contents: [][]byte{[]byte("other")}, Costs: []uint32{2}}, "other contents"},
		{"cost", &pb.CheckRequest{Recipients: []string{"a"}, Contents: [][]byte{[]byte("hello")}, Costs: []uint32{3}}, "other costs (first 2, now 3)"},
		{"mode", &pb.CheckRequest{Recipients: []string{"a"}, Contents: [][]byte{[]byte("hello")}, Costs: []uint32{2}, Modes: []pb.Mode{pb.Mode_MODE_RECORD_ONLY}}, "other modes (first check-and-record, now record-only)"},
		{"domain", &pb.CheckRequest{Recipients: []string{"a"}, Contents: [][]byte{[]byte("hello")}, Costs: []uint32{2}, Domains: []string{"other"}}, `first used in domain "default"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.RequestIds = []uint64{7}
			resp, err := n.Check(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.AlreadyExists) || len(resp.Duplicates) != 0 || resp.Recorded[0] ||
				!strings.Contains(resp.Errors[0].Message, `request_ids: recipient "a": request id 7 was `) || !strings.Contains(resp.Errors[0].Message, tc.want) {
				t.Fatalf("errors %v duplicates %v recorded %v; want one ALREADY_EXISTS naming %q", resp.Errors, resp.Duplicates, resp.Recorded, tc.want)
			}
		})
	}
	again, err := n.Check(context.Background(), first)
	if err != nil || len(again.Errors) != 0 || !reflect.DeepEqual(again.Duplicates, []uint32{0}) {
		t.Fatalf("true retry: %v errors %v duplicates %v", err, again.GetErrors(), again.GetDuplicates())
	}
	// The same id for another recipient names another item: not an error.
	b, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"b"}, RequestIds: []uint64{7}})
	if err != nil || len(b.Errors) != 0 || !b.Recorded[0] {
		t.Fatalf("id 7 for recipient b: %v %v", b, err)
	}
	// One request id for three items is rejected whole.
	_, err = n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"x", "y", "z"}, RequestIds: []uint64{9}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "request_ids: 1 entry for 3 items, want 0 or 3") {
		t.Fatalf("one id for three items: %v", err)
	}
	if s := n.Stats(); s.Domains[0].Records != 2 || s.Domains[1].Records != 0 {
		t.Fatalf("records %d and %d, want 2 (a, b) and 0", s.Domains[0].Records, s.Domains[1].Records)
	}
}
