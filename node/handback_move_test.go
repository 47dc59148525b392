package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/window"
)

// These tests replay, one step at a time, what a starved test run of
// TestRulesChangeRollsThrough did (0.05 of a core: node-1 saw node-0 gone
// for a second), where the oracle found thousands of admitted sends
// forgotten and some over-admitted.

// gatedPeers wraps Peers: while armed, the first Acquire sent to member
// name waits at the gate (entered receives) until release is closed, and
// the first Handback sent to it is dropped unsent while dropHandback is set.
type gatedPeers struct {
	Peers
	name         string
	armed        chan struct{}
	entered      chan struct{}
	release      chan struct{}
	gated        atomic.Bool
	dropHandback atomic.Bool
	dropped      atomic.Int64
}

type gatedPeer struct {
	Peer
	g *gatedPeers
}

func (g *gatedPeers) Peer(m ring.Member) (Peer, error) {
	p, err := g.Peers.Peer(m)
	if err != nil || m.Name != g.name {
		return p, err
	}
	return gatedPeer{p, g}, nil
}

func (p gatedPeer) Acquire(ctx context.Context, req *pb.AcquireRequest, _ ...grpc.CallOption) (*pb.AcquireResponse, error) {
	select {
	case <-p.g.armed:
		if p.g.gated.CompareAndSwap(false, true) {
			p.g.entered <- struct{}{}
			<-p.g.release
		}
	default:
	}
	return p.Peer.Acquire(ctx, req)
}

func (p gatedPeer) Handback(ctx context.Context, req *pb.HandbackRequest, _ ...grpc.CallOption) (*pb.HandbackResponse, error) {
	if p.g.dropHandback.CompareAndSwap(true, false) {
		p.g.dropped.Add(1)
		return &pb.HandbackResponse{}, nil // lost on its way: the owner never took it
	}
	return p.Peer.Handback(ctx, req)
}

func newGatedPeers(ln *LocalNetwork, name string) *gatedPeers {
	return &gatedPeers{Peers: ln.Peers(), name: name, armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
}

// threeLocal starts node-a (with peers pa, nil for the network's own),
// node-b (with pb) and node-c, and waits until every partition is open on
// its owner under one ring of the three. It returns them and that check.
func threeLocal(t *testing.T, ln *LocalNetwork, pa, pbPeers Peers) (a, b, c *Node, settled func() error) {
	t.Helper()
	if pa == nil {
		pa = ln.Peers()
	}
	if pbPeers == nil {
		pbPeers = ln.Peers()
	}
	a = startLocalCfg(t, ln, Config{Name: "node-a", Peers: pa, Replication: ReplicationOff})
	b = startLocalCfg(t, ln, Config{Name: "node-b", Peers: pbPeers, Replication: ReplicationOff}, a.clus.Load().ms.GossipAddr())
	c = startLocal(t, ln, "node-c", a.clus.Load().ms.GossipAddr())
	nodes := map[string]*Node{"node-a": a, "node-b": b, "node-c": c}
	settled = func() error {
		r := a.Ring()
		for _, n := range nodes {
			if n.Ring().Len() != 3 || n.Ring().Epoch() != r.Epoch() {
				return fmt.Errorf("%s: a ring of %d, epoch %x", n.cfg.Name, n.Ring().Len(), n.Ring().Epoch())
			}
		}
		for p := range a.store.Partitions() {
			if o := nodes[r.PartitionOwner(p).Name]; !o.store.IsOpen(p) {
				return fmt.Errorf("partition %d is not open on its owner %s", p, o.cfg.Name)
			}
		}
		return nil
	}
	poll(t, "three nodes settle", settled)
	return a, b, c, settled
}

// sendOwedBy has a admit one send to a recipient of a partition p that a
// owns (and, with backedBy, that member backs), then has b record another
// send of that recipient as b does while it decides for p under a ring of
// its own, close p and owe it to a (rule 7). It returns p and a function
// that peeks at what a counts for the recipient.
func sendOwedBy(t *testing.T, a, b *Node, backedBy string) (int, func() uint32) {
	t.Helper()
	rcp, p := recipientOwnedBy(a.Ring(), "node-a", backedBy)
	ctx := context.Background()
	if resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}}); err != nil || !resp.Admitted[0] {
		t.Fatalf("first send: %v %v", err, resp)
	}
	b.openPartition(p)
	key, tag := KeyOf(rcp)
	dv := b.view.Load().domains[DefaultDomain]
	// A second earlier: records merge as a union of sends per millisecond.
	if _, _, err := b.store.Record(p, dv.ref, key, tag, b.nowMs()-1000, window.Item{Cost: 1}, 0, b.nowMs()); err != nil {
		t.Fatal(err)
	}
	b.closePartition(p)
	b.ho.mu.Lock()
	b.ho.parts[p].owed, b.ho.parts[p].handed = true, false
	b.ho.mu.Unlock()
	used := func() uint32 {
		resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil || len(resp.Errors) > 0 {
			return 0 // closed for a move: asked again
		}
		return resp.Used[0]
	}
	return p, used
}

// recipientOwnedBy returns a recipient whose partition owner owns under r,
// backed by backup ("" for any), and that partition.
func recipientOwnedBy(r *ring.Ring, owner, backup string) (string, int) {
	for i := 0; ; i++ {
		rcp := fmt.Sprintf("+86151%08d", i)
		key, _ := KeyOf(rcp)
		p := r.PartitionHash(key)
		if bk, _ := r.PartitionReplica(p); r.PartitionOwner(p).Name == owner && (backup == "" || bk.Name == backup) {
			return rcp, p
		}
	}
}

// twoLocal starts node-a (with data directory dir, "" for none) and node-b,
// replicating synchronously, and waits until they have settled.
func twoLocal(t *testing.T, ln *LocalNetwork, dir string) (a, b *Node) {
	t.Helper()
	a = startLocalCfg(t, ln, Config{Name: "node-a", Peers: ln.Peers(), DataDir: dir})
	b = startLocalCfg(t, ln, Config{Name: "node-b", Peers: ln.Peers()}, a.clus.Load().ms.GossipAddr())
	poll(t, "two nodes settle", settledTwo(a, b))
	return a, b
}

// settledTwo returns the check that a and b share a ring of the two and
// every partition is open on its owner.
func settledTwo(a, b *Node) func() error {
	return func() error {
		ra, rb := a.Ring(), b.Ring()
		if ra.Len() != 2 || ra.Epoch() != rb.Epoch() {
			return fmt.Errorf("rings of %d and %d members, epochs %x and %x", ra.Len(), rb.Len(), ra.Epoch(), rb.Epoch())
		}
		for p := range a.store.Partitions() {
			owner := a
			if ra.PartitionOwner(p).Name == "node-b" {
				owner = b
			}
			if !owner.store.IsOpen(p) {
				return fmt.Errorf("partition %d is not open on its owner %s", p, owner.cfg.Name)
			}
		}
		return nil
	}
}

// wantCounted polls until a counts want sends of the recipient.
func wantCounted(t *testing.T, used func() uint32, want uint32, why string) {
	t.Helper()
	poll(t, why, func() error {
		if got := used(); got != want {
			return fmt.Errorf("a counts %d sends, want %d", got, want)
		}
		return nil
	})
}

// TestHandbackDuringAcquisition: a is moving partition p, asking node-c
// only (as for a member that appeared while p stayed open), when b's
// handback of p arrives. The move decided whom to ask before the handback,
// so it must not open p as if it had asked b: a must still pull b's copy.
// Before the fix the move opened p and cleared the handback's "ask every
// member", b never told a again under that ring, and its send was lost
// when b left.
func TestHandbackDuringAcquisition(t *testing.T) {
	ln := NewLocalNetwork()
	gp := newGatedPeers(ln, "node-c")
	a, b, _, _ := threeLocal(t, ln, gp, nil)
	p, used := sendOwedBy(t, a, b, "")

	close(gp.armed)
	a.ho.mu.Lock()
	a.ho.parts[p].from = map[string]bool{"node-c": true}
	a.ho.mu.Unlock()
	a.ho.wake()
	select { // the move asks node-c, and waits there
	case <-gp.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("a's move never asked node-c")
	}
	if err := b.handback(context.Background(), a.Ring(), map[string][]uint32{"node-a": {uint32(p)}}); err != nil {
		t.Fatal(err)
	}
	// Only that handback may bring the send: b tells a nothing again.
	b.ho.mu.Lock()
	b.ho.parts[p].handbackAt = time.Now().Add(time.Hour)
	b.ho.mu.Unlock()
	close(gp.release)
	wantCounted(t, used, 2, "a counts b's send after the handback")
}

// TestHandbackToldAgainUntilAcquired: b's handback of p never reaches a
// (here it is dropped on its way; in the starved run a move that could not
// ask b consumed it). b must tell a again under the same ring until a
// acquires p from it, not once per ring.
func TestHandbackToldAgainUntilAcquired(t *testing.T) {
	ln := NewLocalNetwork()
	gp := newGatedPeers(ln, "node-a")
	a, b, _, _ := threeLocal(t, ln, nil, gp)
	gp.dropHandback.Store(true)
	p, used := sendOwedBy(t, a, b, "")
	b.ho.wakeHandback()
	wantCounted(t, used, 2, "a counts b's send after b tells it again")
	if gp.dropped.Load() != 1 {
		t.Fatalf("%d handbacks dropped, want 1: the test did not lose the first", gp.dropped.Load())
	}
	b.ho.mu.Lock()
	owed := b.ho.parts[p].owed
	b.ho.mu.Unlock()
	if owed {
		t.Fatal("b still owes p after a acquired it")
	}
}

// TestLateReleaseKeepsWhatIsOwed: b holds a send of partition p (owned by
// a, backed by c) that it decided after a's last pull from it, and owes p.
// A Release from a for p, sent after that earlier pull and arriving now
// under the same epoch, must not drop b's copy: b's handback must still
// bring the send to a.
func TestLateReleaseKeepsWhatIsOwed(t *testing.T) {
	ln := NewLocalNetwork()
	a, b, _, _ := threeLocal(t, ln, nil, nil)
	p, used := sendOwedBy(t, a, b, "node-c")
	ctx := context.Background()
	rr, err := b.rpc().Release(ctx, &pb.ReleaseRequest{Node: "node-a", RingEpoch: a.Ring().Epoch(), Partitions: []uint32{uint32(p)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rr.Dropped) != 0 {
		t.Fatalf("b dropped %v, which it owes a", rr.Dropped)
	}
	if err := b.handback(ctx, a.Ring(), map[string][]uint32{"node-a": {uint32(p)}}); err != nil {
		t.Fatal(err)
	}
	wantCounted(t, used, 2, "a counts b's send after the handback")
}

// TestVanishedMembersCountForForgetDeadAfter: rule 5 forgets a member
// ForgetDeadAfter after it vanished, not at the first reconcile after a
// quiet spell. a has seen b and c serving, nothing changes for longer than
// ForgetDeadAfter, then both vanish without leaving: a, alone, must lose
// its majority (and decide nothing) rather than forget them at once.
// Before the fix a's count of them dated from its last reconcile, so it
// forgot them as soon as they went, and decided alone while they, alive
// but cut off, might decide too.
func TestVanishedMembersCountForForgetDeadAfter(t *testing.T) {
	// Long enough that the mover's reconcile after they vanish comes well
	// within it (its tick is ForgetDeadAfter/4) on a loaded machine.
	const forget = 8 * time.Second
	ln := NewLocalNetwork()
	a := startLocalCfg(t, ln, Config{Name: "node-a", Peers: ln.Peers(), ForgetDeadAfter: forget, Replication: ReplicationOff})
	b := startLocalCfg(t, ln, Config{Name: "node-b", Peers: ln.Peers(), ForgetDeadAfter: forget, Replication: ReplicationOff}, a.clus.Load().ms.GossipAddr())
	c := startLocalCfg(t, ln, Config{Name: "node-c", Peers: ln.Peers(), ForgetDeadAfter: forget, Replication: ReplicationOff}, a.clus.Load().ms.GossipAddr())
	poll(t, "a ring of three", func() error {
		if n := a.Ring().Len(); n != 3 {
			return fmt.Errorf("a's ring has %d members", n)
		}
		return nil
	})
	// A quiet spell longer than ForgetDeadAfter: no ring change, so no
	// reconcile; only the mover's ticks see the members.
	epoch := a.Ring().Epoch()
	quiet := time.Now().Add(forget + forget/2)
	for deadline := time.Now().Add(10 * forget); time.Now().Before(quiet); time.Sleep(50 * time.Millisecond) {
		if a.Ring().Epoch() != epoch { // a member flapped: start again
			epoch, quiet = a.Ring().Epoch(), time.Now().Add(forget+forget/2)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ring never stayed still for %v", forget+forget/2)
		}
	}
	losses := a.ho.majorityLosses.Load()
	for _, n := range []*Node{b, c} { // as a crash: no leave
		ln.Unregister(n.cfg.AdvertiseAddr)
		n.Close()
	}
	poll(t, "a's ring shrinks to itself", func() error {
		if n := a.Ring().Len(); n != 1 {
			return fmt.Errorf("a's ring has %d members", n)
		}
		return nil
	})
	poll(t, "a loses its majority", func() error {
		if a.ho.majorityLosses.Load() == losses {
			return fmt.Errorf("a kept its majority alone: it forgot b and c as they vanished")
		}
		return nil
	})
}

// TestBackupRefusesWhatItDecidedElsewhere: a backup takes no sends of a
// partition it has open (it decides for it under a ring its gossip has not
// replaced yet) or owes (it decided for it under another ring, and the
// owner has not acquired it since): the owner decided them from a record
// without what the backup admitted. In a starved run node-1 saw node-2 gone
// for 0.4 s, decided alone for node-2's partitions, and then took node-2's
// replicated sends again: 106 sends over-admitted.
func TestBackupRefusesWhatItDecidedElsewhere(t *testing.T) {
	ln := NewLocalNetwork()
	a, b, _, _ := threeLocal(t, ln, nil, nil)
	r := a.Ring()
	rcp, p := recipientOwnedBy(r, "node-a", "node-b")
	key, tag := KeyOf(rcp)
	ctx := context.Background()
	replicate := func() error {
		var enc walEncoder
		enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: a.nowMs(), cost: 1})
		_, err := b.rpc().Replicate(ctx, &pb.ReplicateRequest{Node: "node-a", RingEpoch: r.Epoch(), Sends: enc.bytes()})
		return err
	}
	if err := replicate(); err != nil {
		t.Fatalf("a send of a partition b backs: %v", err)
	}
	want := func(what string, code codes.Code, msg string) {
		t.Helper()
		err := replicate()
		if st := status.Convert(err); st.Code() != code || !strings.Contains(st.Message(), msg) {
			t.Fatalf("%s: %v, want %v saying %q", what, err, code, msg)
		}
	}
	b.ho.mu.Lock()
	b.ho.parts[p].owed, b.ho.parts[p].handed = true, false
	b.ho.mu.Unlock()
	want("owed", codes.Aborted, "has not acquired yet") // the owner acquires it again at once (rule 8)
	b.ho.mu.Lock()
	b.ho.parts[p].handed = true // acquired from b since
	b.ho.mu.Unlock()
	if err := replicate(); err != nil {
		t.Fatalf("after the owner acquired it: %v", err)
	}
	b.openPartition(p)
	want("open", codes.FailedPrecondition, "decides for it under another ring")
	b.closePartition(p)
	if err := replicate(); err != nil {
		t.Fatalf("closed again: %v", err)
	}
}

// TestRetryOfUnconfirmedSendIsDecidedAgain: a send whose backup refused it
// fails (the owner answers UNAVAILABLE) and is taken back, for nobody was
// told it was admitted: counting it would deny a legitimate message early
// (a phantom send). Its retry with the same request id must be decided and
// recorded again, not answered as admitted with the first decision, which
// the owner made from a record that may lack what the backup admitted
// under another ring.
func TestRetryOfUnconfirmedSendIsDecidedAgain(t *testing.T) {
	ln := NewLocalNetwork()
	a, b := twoLocal(t, ln, "")
	rcp, p := recipientOwnedBy(a.Ring(), "node-a", "")
	ctx := context.Background()
	check := func(mode pb.Mode) *pb.CheckResponse {
		t.Helper()
		resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{mode}, RequestIds: []uint64{42}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	b.ho.mu.Lock()
	b.ho.parts[p].owed, b.ho.parts[p].handed = true, false // b refuses p's sends (rule 7)
	b.ho.mu.Unlock()
	if resp := check(pb.Mode_MODE_CHECK_AND_RECORD); len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) {
		t.Fatalf("with its backup refusing: %v, want UNAVAILABLE", resp)
	}
	b.ho.mu.Lock()
	b.ho.parts[p].handed = true
	b.ho.mu.Unlock()
	wantDecidedAgain(t, a, rcp, check(pb.Mode_MODE_CHECK_AND_RECORD))
}

// wantDecidedAgain checks that resp, n's answer to the retry of a send
// whose backup refused it, admitted and recorded it, and that n counts it
// once: the failed attempt was taken back (had n kept it, it would count
// 2), and the retry was decided again (answered as a duplicate of the
// failed attempt, it would count 0).
func wantDecidedAgain(t *testing.T, n *Node, rcp string, resp *pb.CheckResponse) {
	t.Helper()
	if len(resp.Errors) != 0 || !resp.Admitted[0] || !resp.Recorded[0] {
		t.Fatalf("the retry: %v", resp)
	}
	peek, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || len(peek.Errors) > 0 {
		t.Fatal(err, peek.GetErrors())
	}
	if peek.Used[0] != 1 {
		t.Fatalf("%s counts %d sends, want 1: 2 counts the failed attempt, a phantom send; 0 answered the retry as its duplicate", n.cfg.Name, peek.Used[0])
	}
}

// TestAcquiredBeforeClosedIsNotOwed: b decided for p (it had p open) when
// the ring moved p to a; a's Acquire reached b before b's own reconcile
// closed p. b must end up having handed p over, not owing it: a pulled
// everything b decided, would skip b's handback as merged already, and a
// backup that owes a partition refuses its owner's sends, so a debt here
// would stop p from admitting until the next ring change.
func TestAcquiredBeforeClosedIsNotOwed(t *testing.T) {
	ln := NewLocalNetwork()
	a, b, _, _ := threeLocal(t, ln, nil, nil)
	r := a.Ring()
	rcp, p := recipientOwnedBy(r, "node-a", "node-b")
	key, tag := KeyOf(rcp)
	b.openPartition(p) // b decides for p, as under a ring of its own
	var bm ring.Member
	for _, m := range r.Members() {
		if m.Name == "node-b" {
			bm = m
		}
	}
	ctx := context.Background()
	if _, _, err := a.pullFrom(ctx, r, bm, []int{p}); err != nil {
		t.Fatal(err)
	}
	b.closeOwing(p) // b's reconcile, late
	b.ho.mu.Lock()
	owed, handed := b.ho.parts[p].owed, b.ho.parts[p].handed
	b.ho.mu.Unlock()
	if owed && !handed {
		t.Fatal("b owes p, which a acquired from it")
	}
	var enc walEncoder
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: a.nowMs(), cost: 1})
	if _, err := b.rpc().Replicate(ctx, &pb.ReplicateRequest{Node: "node-a", RingEpoch: r.Epoch(), Sends: enc.bytes()}); err != nil {
		t.Fatalf("b, p's backup, refuses a's send: %v", err)
	}
	// Closed by b itself while open, p is owed.
	b.openPartition(p)
	b.closeOwing(p)
	b.ho.mu.Lock()
	owed, handed = b.ho.parts[p].owed, b.ho.parts[p].handed
	b.ho.mu.Unlock()
	if !owed || handed {
		t.Fatalf("b closed p, which it had open, and owes it: owed %v, handed %v", owed, handed)
	}
}

// TestRingOfAnotherDecidesNothingHere: a node whose ring holds one member,
// not itself (left out of it, or seeing only that member for a moment under
// load), routes every item to that member, even for a partition still open
// here. In a starved run node-2's ring was {node-0} for 0.4 s while it went
// on deciding locally for the partitions it had open: two sends it and
// node-0 admitted in the same millisecond merged into one (forgotten).
func TestRingOfAnotherDecidesNothingHere(t *testing.T) {
	ln := NewLocalNetwork()
	start := func(name string) *Node {
		addr := name + ".in-memory:1"
		n, err := New(Config{Name: name, AdvertiseAddr: addr, Peers: ln.Peers(), SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		ln.Register(addr, n)
		if err := n.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Unregister(addr); n.Close() })
		return n
	}
	a, b := start("node-a"), start("node-b")
	// a sees a ring of b alone; every partition is still open on a.
	c := a.clus.Load()
	rb := b.clus.Load().static
	a.clus.Store(&cluster{self: c.self, static: rb})
	ctx := context.Background()
	const rcp = "+8615100000001"
	resp, err := a.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}})
	if err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] {
		t.Fatalf("a check through a: %v %v", err, resp)
	}
	peek := func(n *Node) uint32 {
		t.Helper()
		resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatal(err, resp.GetErrors())
		}
		return resp.Used[0]
	}
	if got := peek(b); got != 1 {
		t.Fatalf("b, the ring's only member, counts %d sends, want 1", got)
	}
	a.clus.Store(c) // a's own ring again
	if got := peek(a); got != 0 {
		t.Fatalf("a counts %d sends, want 0: it decided for a partition it does not own under its ring", got)
	}
}

// TestTieWinnerIsAskedBeforeOpening: b loses a tie to a (two members
// counted, a's name first, a not in b's ring), so a may decide alone, with
// no backup. c then joins b, and b holds a majority again (2 of the 3 it
// counts) while a is still out of its sight: b must not open its partitions
// without asking a. In a starved run node-2 did, at the millisecond node-0
// (the winner, which never lost its majority) admitted its fifth send of a
// second: 6 > 5.
func TestTieWinnerIsAskedBeforeOpening(t *testing.T) {
	ln := NewLocalNetwork()
	cfg := func(name string) Config {
		return Config{Name: name, Peers: ln.Peers(), Replication: ReplicationOff, ForgetDeadAfter: 10 * time.Minute}
	}
	a := startLocalCfg(t, ln, cfg("node-a"))
	join := a.clus.Load().ms.GossipAddr()
	b := startLocalCfg(t, ln, cfg("node-b"), join)
	poll(t, "a ring of two", func() error {
		if n := b.Ring().Len(); n != 2 || a.Ring().Len() != 2 {
			return fmt.Errorf("rings of %d and %d", a.Ring().Len(), n)
		}
		return nil
	})
	ln.Unregister(a.cfg.AdvertiseAddr) // a vanishes from b's sight, as if cut off
	a.Close()
	poll(t, "b loses the tie to a", func() error {
		b.ho.mu.Lock()
		defer b.ho.mu.Unlock()
		if b.ho.tieWinner != "node-a" {
			return fmt.Errorf("b's tie winner is %q", b.ho.tieWinner)
		}
		return nil
	})
	c := startLocalCfg(t, ln, cfg("node-c"), b.clus.Load().ms.GossipAddr())
	poll(t, "b waits for a before it acquires", func() error {
		if b.ho.tieWaits.Load() == 0 {
			return fmt.Errorf("b's ring has %d members; no acquisition waited", b.Ring().Len())
		}
		return nil
	})
	r := b.Ring()
	for p := range b.store.Partitions() {
		if r.PartitionOwner(p).Name == "node-b" && b.store.IsOpen(p) {
			t.Fatalf("b opened partition %d without asking a, the tie's winner", p)
		}
	}
	// a comes back (a new process under its name): b asks it and opens.
	a2 := startLocalCfg(t, ln, cfg("node-a"), b.clus.Load().ms.GossipAddr())
	nodes := map[string]*Node{"node-a": a2, "node-b": b, "node-c": c}
	poll(t, "every partition open on its owner", func() error {
		r := b.Ring()
		if r.Len() != 3 {
			return fmt.Errorf("b's ring has %d members", r.Len())
		}
		for p := range b.store.Partitions() {
			if o := nodes[r.PartitionOwner(p).Name]; o.Ring().Epoch() != r.Epoch() || !o.store.IsOpen(p) {
				return fmt.Errorf("partition %d is not open on its owner %s", p, o.cfg.Name)
			}
		}
		return nil
	})
}

// TestRestartedNodeRemembersWhomItCounted: a node that restarts and sees
// nobody (its peers unreachable, or marked failed by its own starved
// gossip before its first reconcile) must not hold a majority of one and
// decide alone for every partition: it counts the members it counted
// before it stopped (rule 5, members.go) until it sees them again or
// ForgetDeadAfter passes. A starved run of TestRulesChangeRollsThrough
// over-admitted 305 sends so.
func TestRestartedNodeRemembersWhomItCounted(t *testing.T) {
	ln := NewLocalNetwork()
	dir := t.TempDir()
	a := startLocal(t, ln, "node-a")
	b := startLocal(t, ln, "node-b", a.clus.Load().ms.GossipAddr())
	c := startLocalCfg(t, ln, Config{Name: "node-c", Peers: ln.Peers(), DataDir: dir, Replication: ReplicationOff}, a.clus.Load().ms.GossipAddr())
	want := []string{"node-a", "node-b", "node-c"}
	poll(t, "c keeps the three members it counts", func() error {
		b, err := os.ReadFile(filepath.Join(dir, membersFile))
		if err != nil {
			return err
		}
		if got, err := decodeMembers(b); err != nil || !slices.Equal(got, want) {
			return fmt.Errorf("%s holds %q (%v), want %q", membersFile, got, err, want)
		}
		return nil
	})
	for _, n := range []*Node{a, b, c} { // as a crash: no leave
		ln.Unregister(n.cfg.AdvertiseAddr)
		n.Close()
	}

	// c alone again, joining nobody, from the same data directory.
	const forget = 2 * time.Second
	start := time.Now() // before c counts anyone
	c = startLocalCfg(t, ln, Config{Name: "node-c", Peers: ln.Peers(), DataDir: dir, Replication: ReplicationOff, ForgetDeadAfter: forget})
	// c decides nothing until it forgets a and b (rule 5, as before: members
	// gone for ForgetDeadAfter no longer count); alone, it would decide
	// at once.
	poll(t, "c decides again, alone", func() error {
		for p := range c.store.Partitions() {
			if !c.store.IsOpen(p) {
				return fmt.Errorf("partition %d is closed on c", p)
			}
		}
		return nil
	})
	if d := time.Since(start); d < forget {
		t.Fatalf("c decided alone %v after its start, before ForgetDeadAfter (%v): it forgot whom it counted before it stopped", d, forget)
	}
	poll(t, "c keeps only itself", func() error {
		b, err := os.ReadFile(filepath.Join(dir, membersFile))
		if err != nil {
			return err
		}
		if got, err := decodeMembers(b); err != nil || !slices.Equal(got, []string{"node-c"}) {
			return fmt.Errorf("%s holds %q (%v), want [node-c]", membersFile, got, err)
		}
		return nil
	})
}

// TestDamagedMembersFileStopsOpen: a members file that cannot be read
// stops the node with an error that names it, rather than letting it count
// nobody and decide alone.
func TestDamagedMembersFileStopsOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, membersFile)
	if err := os.WriteFile(path, []byte(`{"format":1,"members":["node-a","node-a"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	g := gossip.Config{BindAddr: "127.0.0.1", RejoinInterval: -1}
	ln := NewLocalNetwork()
	n, err := New(Config{Name: "node-a", AdvertiseAddr: "node-a.in-memory:1", Peers: ln.Peers(), Cluster: &g, DataDir: dir, SweepInterval: -1, InsecurePeers: true})
	if err != nil {
		t.Fatal(err)
	}
	err = n.Open(context.Background())
	if err == nil {
		n.Close()
		t.Fatal("Open succeeded with a damaged members file")
	}
	for _, s := range []string{path, `members[1] = "node-a": listed twice`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Open's error %q does not name %q", err, s)
		}
	}
}

// TestDepartedMembersCount: members that gossip saw serving and then lost
// count for rule 5 as of when they vanished, even if this node never looked
// while they were present (a new node whose starved gossip marks every
// member failed between its join and its first reconcile must not hold a
// majority of one), and members that announced leaving and left no longer
// count, even if this node never looked while they were leaving.
func TestDepartedMembersCount(t *testing.T) {
	h := newHandoff(4)
	r, err := ring.New([]ring.Member{{Name: "node-d", Addr: "d:1"}}, ring.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	gone := now.Add(-time.Second)
	h.counted["node-c"] = gone.Add(-time.Second)
	h.counted.note(nil, map[string]gossip.Departure{"node-a": {At: gone}, "node-b": {At: gone}, "node-c": {At: gone, Leaving: true}}, r.Members(), now)
	want := map[string]time.Time{"node-a": gone, "node-b": gone, "node-d": now}
	if !maps.EqualFunc(map[string]time.Time(h.counted), want, time.Time.Equal) {
		t.Fatalf("counted %v, want %v", h.counted, want)
	}
	// A member seen present later than it departed keeps the later time.
	h.counted.note(nil, map[string]gossip.Departure{"node-d": {At: gone}}, r.Members(), now)
	if !h.counted["node-d"].Equal(now) {
		t.Fatalf("node-d counted as of %v, want %v", h.counted["node-d"], now)
	}
}

// TestUnconfirmedSendIsDecidedAgainAfterRestart: the owner takes back a
// send its backup did not confirm (TestRetryOfUnconfirmedSendIsDecidedAgain)
// in its WAL too, so that a node restarted from the WAL alone (a crash: no
// final snapshot) neither counts the failed attempt nor answers the retry
// as its duplicate.
func TestUnconfirmedSendIsDecidedAgainAfterRestart(t *testing.T) {
	ln := NewLocalNetwork()
	dir := t.TempDir()
	a, b := twoLocal(t, ln, dir)
	rcp, p := recipientOwnedBy(a.Ring(), "node-a", "")
	b.ho.mu.Lock()
	b.ho.parts[p].owed, b.ho.parts[p].handed = true, false // b refuses p's sends (rule 7)
	b.ho.mu.Unlock()
	ctx := context.Background()
	req := &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{42}}
	if resp, err := a.Check(ctx, req); err != nil || len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) {
		t.Fatalf("with its backup refusing: %v %v, want UNAVAILABLE", resp, err)
	}
	// A crash now: a copy of the data directory as it stands, the WAL
	// holding the send and its inverse (both appended before the answer).
	crashed := t.TempDir()
	copyLiveDir(t, crashed, dir)
	os.Remove(filepath.Join(crashed, LockFile))
	c, err := New(Config{Name: "node-a", DataDir: crashed, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	wantDecidedAgain(t, c, rcp, resp)
}

// TestShrunkRingNotYetJudgedDecidesNothing: gossip hands a new ring to the
// deciding goroutines before the mover judges rule 5 on it. In a starved
// run node-1's ring shrank to itself (node-0 out of its sight, and node-0
// deciding alone as a tie's winner) while its mover lagged: node-1 still
// held its majority flag, decided for its open partitions under a ring of
// one, with no backup to fence it, and over-admitted. A node must judge
// the majority on the ring it decides under.
func TestShrunkRingNotYetJudgedDecidesNothing(t *testing.T) {
	ln := NewLocalNetwork()
	_, b := twoLocal(t, ln, "")
	rcp, _ := recipientOwnedBy(b.Ring(), "node-b", "")
	alone, err := ring.New([]ring.Member{b.clus.Load().self}, b.cfg.Placement)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := &pb.CheckRequest{Recipients: []string{rcp}}
	// Under the ring its mover judged, b decides (and a backs the send).
	if resp, err := b.judgeAndDecide(ctx, decode(req, b.view.Load(), b.Ring()), b.Ring()); err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] {
		t.Fatalf("under the ring judged: %v %v", resp, err)
	}
	// Under a ring of b alone, not yet judged: b holds 1 of the 2 it
	// counts, and a sorts first.
	resp, err := b.judgeAndDecide(ctx, decode(req, b.view.Load(), alone), alone)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Errors) != 1 || resp.Errors[0].Code != uint32(codes.Unavailable) || resp.Admitted[0] {
		t.Fatalf("under a ring of b alone, not judged: %v; want UNAVAILABLE", resp)
	}
	// A ring that grew keeps the majority: b with a and a newcomer.
	grown, err := ring.New([]ring.Member{b.clus.Load().self, {Name: "node-a", Addr: "node-a.in-memory:1"}, {Name: "node-c", Addr: "node-c.in-memory:1"}}, b.cfg.Placement)
	if err != nil {
		t.Fatal(err)
	}
	if !b.ho.majorityUnder(grown) {
		t.Fatal("a ring that grew lost the majority")
	}
}

// TestReplicatedUnconfirmedMarkIsRefused: an unconfirmed mark is a WAL
// record only; a Replicate that carries one is bad input, refused whole,
// and records nothing.
func TestReplicatedUnconfirmedMarkIsRefused(t *testing.T) {
	ln := NewLocalNetwork()
	a, b, _, _ := threeLocal(t, ln, nil, nil)
	r := a.Ring()
	rcp, _ := recipientOwnedBy(r, "node-a", "node-b")
	key, tag := KeyOf(rcp)
	var enc walEncoder
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: a.nowMs(), cost: 1, id: 7})
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: a.nowMs(), cost: 1, id: 7, unconfirmed: true})
	ref := b.view.Load().domains[DefaultDomain].ref
	before := b.store.Stats(ref).Records
	_, err := b.rpc().Replicate(context.Background(), &pb.ReplicateRequest{Node: "node-a", RingEpoch: r.Epoch(), Sends: enc.bytes()})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "unconfirmed mark") {
		t.Fatalf("a Replicate carrying an unconfirmed mark: %v, want InvalidArgument naming it", err)
	}
	if after := b.store.Stats(ref).Records; after != before {
		t.Fatalf("b holds %d records after the refused Replicate, %d before", after, before)
	}
}

// TestReplicatedSendsBesideAFailedOneReachTheWAL: a Replicate call with a
// send the store cannot record (a time before 1970, which the WAL's framing
// carries, and recordReplicated does not check) fails whole (Internal,
// naming the cause),
// but the sends before and after it that the store did record are returned
// for the WAL, with their sequence numbers, so that none is held in memory
// only.
func TestReplicatedSendsBesideAFailedOneReachTheWAL(t *testing.T) {
	ln := NewLocalNetwork()
	a, _ := twoLocal(t, ln, t.TempDir()) // a, durable, backs b's partitions
	r := a.Ring()
	rcp, p := recipientOwnedBy(r, "node-b", "node-a")
	key, tag := KeyOf(rcp)
	now := a.nowMs()
	var enc walEncoder
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: now - 2, cost: 1, id: 11})
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: -1, cost: 1, id: 12})
	enc.add(walSend{domain: DefaultDomain, key: key, tag: tag, at: now, cost: 1, id: 13})
	seq := a.store.Seq(p)
	logged, err := a.recordReplicated(&pb.ReplicateRequest{Node: "node-b", RingEpoch: r.Epoch(), Sends: enc.bytes()})
	if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "time -1 ms out of range") {
		t.Fatalf("a Replicate with a send at -1 ms: %v, want Internal naming the time", err)
	}
	if logged == nil {
		t.Fatal("nothing returned for the WAL: the two sends recorded would be in memory only")
	}
	var got []string
	if err := decodeWAL(logged.bytes(), func(s walSend) error {
		got = append(got, fmt.Sprintf("id %d at %d seq %d", s.id, s.at-now, s.seq))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("id 11 at -2 seq %d", seq+1), fmt.Sprintf("id 13 at 0 seq %d", seq+2)}
	if !slices.Equal(got, want) {
		t.Fatalf("for the WAL: %q, want %q", got, want)
	}
}

// copyLiveDir copies the data directory src, which a running node may be
// writing, into dst as a crash would leave it: files written atomically
// (name.tmp, then renamed) appear once renamed, and one that goes away
// between the listing and its copy is left out.
func copyLiveDir(t *testing.T, dst, src string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		switch {
		case e.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case strings.HasSuffix(path, ".tmp"):
			return nil
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
