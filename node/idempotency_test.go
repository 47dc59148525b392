package node

import (
	"context"
	"reflect"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
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
