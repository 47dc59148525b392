package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/window"
)

// startLocal starts a memory-only cluster member on ln, with gossip on
// 127.0.0.1 joining join, and waits until it serves.
func startLocal(t *testing.T, ln *LocalNetwork, name string, join ...string) *Node {
	t.Helper()
	return startLocalCfg(t, ln, Config{Name: name, Peers: ln.Peers(), Replication: ReplicationOff}, join...)
}

// startLocalCfg is startLocal for cfg (its Name, Peers, Replication and
// ForgetDeadAfter; the rest as startLocal sets it).
func startLocalCfg(t *testing.T, ln *LocalNetwork, cfg Config, join ...string) *Node {
	t.Helper()
	g := gossip.Config{BindAddr: "127.0.0.1", Join: join, RejoinInterval: -1, DeadNodeReclaimTime: 200 * time.Millisecond,
		ProbeInterval: 300 * time.Millisecond, ProbeTimeout: 250 * time.Millisecond, GossipInterval: 50 * time.Millisecond}
	name := cfg.Name
	addr := name + ".in-memory:1"
	cfg.AdvertiseAddr, cfg.Cluster, cfg.SweepInterval = addr, &g, -1
	cfg.InsecurePeers = true // a LocalNetwork: no listener anyone could call
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln.Register(addr, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer lcancel()
		n.Leave(lctx)
		ln.Unregister(addr)
		n.Close()
	})
	return n
}

// poll calls cond every 5 ms until it returns nil, or fails the test after
// 30 s with its last error.
func poll(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHandbackBringsBackWhatWasDecidedElsewhere checks rule 7's mechanics:
// b holds a send of a partition a owns (as b would after deciding for it
// while it saw a gone) and owes it; b's handback makes a close the
// partition, acquire it again from every member, and count the send.
func TestHandbackBringsBackWhatWasDecidedElsewhere(t *testing.T) {
	ln := NewLocalNetwork()
	a := startLocal(t, ln, "node-a")
	b := startLocal(t, ln, "node-b", a.clus.Load().ms.GossipAddr())
	settled := settledTwo(a, b)
	poll(t, "two nodes settle", settled)
	r := a.Ring()
	var rcp string
	var p int
	for i := 0; rcp == ""; i++ {
		k := fmt.Sprintf("+86151%08d", i)
		key, _ := KeyOf(k)
		if p = r.PartitionHash(key); r.PartitionOwner(p).Name == "node-a" {
			rcp = k
		}
	}
	ctx := context.Background()
	used := func() uint32 {
		t.Helper()
		resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("peek: %v %v", err, resp.GetErrors())
		}
		return resp.Used[0]
	}
	if resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}}); err != nil || !resp.Admitted[0] {
		t.Fatalf("first send: %v %v", err, resp)
	}

	// What b decided for p under a ring that made it the owner: it opened
	// p, recorded a send, and closed p again when the rings healed.
	b.openPartition(p)
	defer b.closePartition(p)
	key, tag := KeyOf(rcp)
	dv := b.view.Load().domains[DefaultDomain]
	// A second earlier: records merge as a union of sends per millisecond.
	if _, _, err := b.store.Record(p, dv.ref, key, tag, b.nowMs()-1000, window.Item{Cost: 1}, 0, b.nowMs()); err != nil {
		t.Fatal(err)
	}
	if got := used(); got != 1 {
		t.Fatalf("a counts %d sends before the handback, want 1", got)
	}
	b.closePartition(p)
	b.ho.mu.Lock()
	b.ho.parts[p].owed, b.ho.parts[p].handed = true, false
	b.ho.mu.Unlock()
	if err := b.handback(ctx, r, map[string][]uint32{"node-a": {uint32(p)}}); err != nil {
		t.Fatal(err)
	}
	poll(t, "a acquires the partition again", settled)
	if got := used(); got != 2 {
		t.Fatalf("a counts %d sends after the handback, want 2 (its own and b's)", got)
	}
	b.ho.mu.Lock()
	owed := b.ho.parts[p].owed
	b.ho.mu.Unlock()
	if owed {
		t.Fatal("b still owes the partition after a acquired it")
	}

	// A handback at the generation a merged (b opened nothing since) is
	// skipped; one at a later generation is taken even under the same ring:
	// an epoch names a member set, which recurs after a flap.
	a.ho.mu.Lock()
	g := a.ho.parts[p].pulledGen["node-b"]
	a.ho.mu.Unlock()
	moves := a.ho.moves.Load()
	hb := func(gen uint64) {
		t.Helper()
		if _, err := a.rpc().Handback(ctx, &pb.HandbackRequest{Node: "node-b", RingEpoch: r.Epoch(), Partitions: []uint32{uint32(p)}, Generations: []uint64{gen}}); err != nil {
			t.Fatal(err)
		}
	}
	hb(g)
	if !a.store.IsOpen(p) || a.ho.moves.Load() != moves {
		t.Fatal("a handback at the generation merged closed the partition again")
	}
	hb(g + 1)
	// The mover opens the partition before it counts the move: wait for both.
	poll(t, "a takes the handback at a later generation", func() error {
		if a.ho.moves.Load() == moves {
			return fmt.Errorf("no move counted since the handback")
		}
		return settled()
	})
	// One from a stranger, or under another ring, is refused.
	if _, err := a.rpc().Handback(ctx, &pb.HandbackRequest{Node: "node-x", RingEpoch: r.Epoch(), Partitions: []uint32{uint32(p)}}); err == nil {
		t.Fatal("a handback from a stranger was taken")
	}
	if _, err := a.rpc().Handback(ctx, &pb.HandbackRequest{Node: "node-b", RingEpoch: r.Epoch() + 1, Partitions: []uint32{uint32(p)}}); err == nil {
		t.Fatal("a handback under another ring was taken")
	}
}
