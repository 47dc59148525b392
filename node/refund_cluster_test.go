package node_test

import (
	"context"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestRefundReachesTheBackup: a refund made through another node reaches the
// owner and its backup; when the owner is killed, the backup's history,
// which the new owner acquires, has the refund.
func TestRefundReachesTheBackup(t *testing.T) {
	c := moveCluster(t, 3, tenPerHour, true, "")
	const rcp = "+8613900000042"
	check := func(m *nodetest.Member, id uint64, mode pb.Mode) *pb.CheckResponse {
		t.Helper()
		resp, err := m.Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{id}, Modes: []pb.Mode{mode}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("%v: %v %v", mode, resp.GetErrors(), err)
		}
		return resp
	}
	ms := c.Members()
	for id := uint64(1); id <= 4; id++ {
		check(ms[int(id)%3], id, pb.Mode_MODE_CHECK_AND_RECORD)
	}
	if resp := check(ms[0], 3, pb.Mode_MODE_REFUND); len(resp.Refunded) != 1 || resp.Used[0] != 3 {
		t.Fatalf("refund: %v; want refunded, 3 used", resp)
	}
	key, _ := node.KeyOf(rcp)
	r := ms[0].Node.Ring()
	owner := r.PartitionOwner(r.PartitionHash(key)).Name
	for _, m := range ms {
		if m.Name == owner {
			if err := c.Kill(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.WaitConverged(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSettled(context.Background()); err != nil {
		t.Fatal(err)
	}
	up := c.Up()
	if resp := check(up[0], 0, pb.Mode_MODE_PEEK); resp.Used[0] != 3 {
		t.Fatalf("after the owner was killed: used %d, want 3 (4 sends, 1 refunded)", resp.Used[0])
	}
}
