package node_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// overridesOf returns a node's admin overrides and tombstones, by name:
// version, negated for a tombstone.
func overridesOf(t *testing.T, n *node.Node) map[string]int64 {
	t.Helper()
	l, err := n.ListOverrides(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, o := range l.Overrides {
		if o.Source == "admin" {
			out[o.Name] = o.Version
		}
	}
	for _, o := range l.Deleted {
		out[o.Name] = -o.Version
	}
	return out
}

func setOverride(t *testing.T, n *node.Node, name string, version int64, limit uint32) {
	t.Helper()
	_, err := n.SetOverride(context.Background(), &pb.OverrideSetRequest{Override: &pb.Override{
		Name: name, Domain: "default", Prefixes: []string{"+1555"}, Limits: map[string]uint32{"recipient-1m": limit}, Version: version}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestOverrideSync: members pull each other's admin overrides, keeping the
// newest version of each override or of its deletion: one set on a member
// alone reaches the other, a newer version replaces an older one, a delete
// a member missed is applied and not brought back from it, and a member
// that joins later gets them all on its own.
func TestOverrideSync(t *testing.T) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 2, InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, b := c.Members()[0].Node, c.Members()[1].Node

	setOverride(t, a, "vip", 100, 30)
	setOverride(t, a, "old", 100, 20)
	setOverride(t, b, "old", 200, 25) // newer on b
	setOverride(t, a, "gone", 100, 20)
	setOverride(t, b, "gone", 100, 20)
	if _, err := a.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "gone", Version: 300}); err != nil {
		t.Fatal(err)
	}
	// b still has "gone" (it missed the delete); a must not take it back.
	a.SyncOverrides(ctx)
	if got, want := overridesOf(t, a), map[string]int64{"vip": 100, "old": 200, "gone": -300}; !equal(got, want) {
		t.Fatalf("a after sync: %v, want %v", got, want)
	}
	b.SyncOverrides(ctx)
	if got, want := overridesOf(t, b), map[string]int64{"vip": 100, "old": 200, "gone": -300}; !equal(got, want) {
		t.Fatalf("b after sync: %v, want %v", got, want)
	}
	// The adopted override decides: +1555... gets old's 25 a minute.
	resp, err := b.Check(ctx, &pb.CheckRequest{Recipients: []string{"+15551"}, Costs: []uint32{25}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] {
		t.Fatalf("cost 25 under the adopted override: %v %v", err, resp)
	}

	// A member that joins later pulls them when it sees the ring.
	m, err := c.Add(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx, 3); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"vip": 100, "old": 200, "gone": -300}
	deadline := time.Now().Add(30 * time.Second)
	for !equal(overridesOf(t, m.Node), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the new member has %v after 30 s, want %v", overridesOf(t, m.Node), want)
		}
		time.Sleep(20 * time.Millisecond) // a readiness wait: the sync runs on the ring change
	}
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
