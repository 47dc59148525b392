package node_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/rules"
)

// heldHandbacks wraps a node's Peers: while hold is set, every Handback
// fails unsent, as if the owner could not be reached.
type heldHandbacks struct {
	node.Peers
	hold *atomic.Bool
}

type heldHandbackPeer struct {
	node.Peer
	hold *atomic.Bool
}

func (h heldHandbacks) Peer(m ring.Member) (node.Peer, error) {
	p, err := h.Peers.Peer(m)
	if err != nil {
		return p, err
	}
	return heldHandbackPeer{p, h.hold}, nil
}

func (p heldHandbackPeer) Handback(ctx context.Context, req *pb.HandbackRequest, opts ...grpc.CallOption) (*pb.HandbackResponse, error) {
	if p.hold.Load() {
		return nil, status.Error(codes.Unavailable, "test: the handback is held")
	}
	return p.Peer.Handback(ctx, req, opts...)
}

// twoPerHour is one domain with one rule: 2 sends per recipient per hour.
const twoPerHour = `domains:
  - name: default
    rules:
      - {name: two-per-hour, scope: recipient, limit: 2, window: 1h}
`

// TestFrozenOwnerDecidesNothingStale is gap 4 of the exactness issue, step
// by step: owner A of a recipient freezes (SIGSTOP); the others see it
// gone, and the recipient's owner under their ring admits the limit's 2
// sends. A thaws with its ring unchanged and its partition still open,
// and is asked again: it must never admit a third. With one fault, the
// backup owns the partition meanwhile and refuses A's sends while it
// decides for it and until A has acquired it (rules 3 and 7). With the
// backup killed as well and restarted before A thaws, another member
// decides meanwhile, and the restarted backup, which never saw A go, must
// still refuse A's sends until A has acquired the partition again (rule 8).
// The handbacks that would make A acquire it are held throughout: the
// fence must not wait for them.
func TestFrozenOwnerDecidesNothingStale(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size       int
		killBackup bool
	}{{"freeze", 3, false}, {"freeze-and-backup-restart", 5, true}} {
		t.Run(tc.name, func(t *testing.T) { testFrozenOwner(t, tc.size, tc.killBackup) })
	}
}

func testFrozenOwner(t *testing.T, size int, killBackup bool) {
	rs, err := rules.Parse("test", []byte(twoPerHour))
	if err != nil {
		t.Fatal(err)
	}
	var hold atomic.Bool
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: size, Rules: rs, Faults: true, DataDir: t.TempDir(),
		Node: func(cfg *node.Config) { cfg.SweepInterval, cfg.Peers = -1, heldHandbacks{cfg.Peers, &hold} }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ms := c.Members()
	a := ms[0]
	full := a.Node.Ring()
	rcp := "+8615000000000"
	key, _ := node.KeyOf(rcp)
	for i := 1; full.PartitionOwner(full.PartitionHash(key)).Name != a.Name; i++ {
		rcp = fmt.Sprintf("+86150%08d", i)
		key, _ = node.KeyOf(rcp)
	}
	p := full.PartitionHash(key)
	backup, _ := full.PartitionReplica(p)
	var b *nodetest.Member
	var rest []*nodetest.Member
	for _, m := range ms[1:] {
		if m.Name == backup.Name {
			b = m
		} else {
			rest = append(rest, m)
		}
	}
	hold.Store(true)
	if err := c.Freeze(a); err != nil {
		t.Fatal(err)
	}
	if killBackup {
		if err := c.Kill(b); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConvergedOn(ctx, rest, len(rest)); err != nil {
			t.Fatal(err)
		}
	} else if err := c.WaitConvergedOn(ctx, ms[1:], len(ms)-1); err != nil {
		t.Fatal(err)
	}
	interim := rest[0].Node.Ring().PartitionOwner(p).Name
	var owner *nodetest.Member
	for _, m := range ms {
		if m.Name == interim {
			owner = m
		}
	}
	var id atomic.Uint64
	send := func(m *nodetest.Member) (admitted bool, err error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := c.Check(cctx, m, &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{id.Add(1)}})
		if err != nil {
			return false, err
		}
		if len(resp.Errors) > 0 {
			return false, fmt.Errorf("%s", resp.Errors[0].Message)
		}
		return resp.Admitted[0], nil
	}
	for k := range 2 {
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok, err := send(owner)
			if err == nil && ok {
				break
			}
			if err == nil || time.Now().After(deadline) {
				t.Fatalf("send %d to %s, the owner while A is gone: admitted %v, %v", k+1, owner.Name, ok, err)
			}
		}
	}
	if killBackup {
		if err := c.Restart(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConvergedOn(ctx, ms[1:], len(ms)-1); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Thaw(a); err != nil {
		t.Fatal(err)
	}
	// The handbacks stay held for a second after the thaw; then they go,
	// as they would once the owner answers.
	release := time.Now().Add(time.Second)
	deadline := time.Now().Add(30 * time.Second)
	denied := 0
	for denied < 3 {
		if time.Now().After(release) {
			hold.Store(false)
		}
		if time.Now().After(deadline) {
			t.Fatalf("A did not deny in 30 s (B's ring has A: %v)", b.Node.Ring().Has(a.Name))
		}
		inB := b.Node.Ring().Has(a.Name)
		ok, err := send(a)
		switch {
		case ok:
			t.Fatalf("A admitted a third send in the hour (B's ring had A: %v): it decided from a record without %s's sends", inB, owner.Name)
		case err == nil:
			denied++
		}
	}
	t.Logf("%s decided meanwhile; B refused %d calls as stale; A acquired %d partitions again after a stale refusal",
		owner.Name, b.Node.Stats().StaleRefusals, a.Node.Stats().Reacquired)
}
