package client

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// TestShadowDeniedByIsNamed: the client names the shadow rule a node
// reports in shadow_denied_by, leaves it empty for -1 and for a response
// without the column, and marks shadow rules in Rules.
func TestShadowDeniedByIsNamed(t *testing.T) {
	var omit atomic.Bool
	f := startFake(t, &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		resp := admitAll(req, nil)
		resp.Domains["default"].Rules[0].Shadow = true
		if !omit.Load() {
			resp.ShadowDeniedBy = make([]int32, len(req.Recipients))
			for i := range resp.ShadowDeniedBy {
				resp.ShadowDeniedBy[i] = int32(i%2) - 1 // -1, 0, -1, 0, ...
			}
		}
		return resp, nil
	}})
	cl := newClient(t, Config{Rand: rand.NewPCG(1, 2)}, f.addr)
	ctx := context.Background()
	decs, err := cl.CheckBatch(ctx, []Item{{Recipient: "a"}, {Recipient: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if decs[0].ShadowDeniedBy != "" || decs[1].ShadowDeniedBy != "r" || !decs[1].Admitted || !decs[1].Rules[0].Shadow {
		t.Fatalf("decisions %+v, want shadow rule r named on the second only", decs)
	}
	omit.Store(true)
	decs, err = cl.CheckBatch(ctx, []Item{{Recipient: "a"}, {Recipient: "b"}})
	if err != nil || decs[0].ShadowDeniedBy != "" || decs[1].ShadowDeniedBy != "" {
		t.Fatalf("without the column: %v %+v", err, decs)
	}
}
