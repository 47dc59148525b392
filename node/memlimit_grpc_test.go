package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

// TestItemGateThroughGRPC: with MaxMemory at its least, a node decides at
// most 16,384 items of Limiter calls at once; calls of 10,000 items each,
// unary and on a stream, beyond that wait their turn and are all answered.
func TestItemGateThroughGRPC(t *testing.T) {
	n, err := node.New(node.Config{MaxMemory: node.MinMaxMemory, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	cl := startServer(t, n)
	ctx := context.Background()
	request := func(k, id int) *pb.CheckRequest {
		req := &pb.CheckRequest{Recipients: make([]string, node.MaxBatch), StreamId: uint64(id)}
		for i := range req.Recipients {
			req.Recipients[i] = fmt.Sprintf("+86%03d%08d", k, i)
		}
		return req
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for k := range 4 {
		wg.Go(func() {
			resp, err := cl.Check(ctx, request(k, 0))
			if err == nil && len(resp.Admitted) != node.MaxBatch {
				err = fmt.Errorf("unary call %d: %d answers", k, len(resp.Admitted))
			}
			errs <- err
		})
	}
	wg.Go(func() {
		s, err := cl.CheckStream(ctx)
		if err != nil {
			errs <- err
			return
		}
		for k := 4; k < 8; k++ {
			if err := s.Send(request(k, k)); err != nil {
				errs <- err
				return
			}
		}
		s.CloseSend()
		for range 4 {
			resp, err := s.Recv()
			if err == nil && (resp.Failed != nil || len(resp.Admitted) != node.MaxBatch) {
				err = fmt.Errorf("stream request %d: failed %v, %d answers", resp.StreamId, resp.Failed, len(resp.Admitted))
			}
			errs <- err
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if s := n.Stats(); s.Checks != 8*node.MaxBatch || s.GateWaits == 0 {
		t.Fatalf("%d checks, %d calls waited; want %d checks, some waits", s.Checks, s.GateWaits, 8*node.MaxBatch)
	}
}
