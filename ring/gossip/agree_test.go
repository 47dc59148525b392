package gossip

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/ring"
)

func names(ms []ring.Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestChooseRing(t *testing.T) {
	p := ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}
	k := func(rules uint64) agreementKey { return agreementKey{rules: rules, protocol: 1, placement: p} }
	c := func(name string, key agreementKey) candidate {
		return candidate{name: name, addr: name + ":1", key: key}
	}
	legacy := candidate{name: "old", addr: "old:1", legacy: true}
	for _, tc := range []struct {
		name  string
		cands []candidate
		ring  []string
		why   map[string]string // member -> substring of the reason
	}{
		{"one", []candidate{c("a", k(1))}, []string{"a"}, nil},
		{"all agree", []candidate{c("a", k(1)), c("b", k(1)), c("c", k(1))}, []string{"a", "b", "c"}, nil},
		{"a foreign newcomer", []candidate{c("a", k(1)), c("b", k(1)), c("c", k(1)), c("d", k(2))},
			[]string{"a", "b", "c"}, map[string]string{"d": "rules hash 0000000000000002, the ring's 0000000000000001"}},
		{"the newcomer's name sorts first", []candidate{c("a", k(2)), c("b", k(1)), c("c", k(1))},
			[]string{"b", "c"}, map[string]string{"a": "2 of 3 serving members agree"}},
		{"a tie goes to the first name", []candidate{c("b", k(1)), c("a", k(2))},
			[]string{"a"}, map[string]string{"b": "rules hash 0000000000000001, the ring's 0000000000000002"}},
		{"a two-two tie", []candidate{c("a", k(5)), c("d", k(5)), c("b", k(4)), c("c", k(4))},
			[]string{"a", "d"}, map[string]string{"b": "rules", "c": "rules"}},
		{"protocol", []candidate{c("a", k(1)), c("b", k(1)), c("c", agreementKey{rules: 1, protocol: 2, placement: p})},
			[]string{"a", "b"}, map[string]string{"c": "protocol 2, the ring's 1"}},
		{"placement", []candidate{c("a", k(1)), c("b", k(1)), c("c", agreementKey{rules: 1, protocol: 1, placement: ring.Config{PartitionCount: 7, ReplicationFactor: 20, Load: 1.25}})},
			[]string{"a", "b"}, map[string]string{"c": "placement 7/20/1.25, the ring's 271/20/1.25"}},
		{"legacy agrees with any ring", []candidate{legacy, c("a", k(1)), c("b", k(2)), c("c", k(2))},
			[]string{"b", "c", "old"}, map[string]string{"a": "rules"}},
		{"only legacy", []candidate{legacy}, []string{"old"}, nil},
		{"none", nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			for range 10 { // the choice does not depend on the order
				cands := slices.Clone(tc.cands)
				rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
				in, out := chooseRing(cands)
				if got := names(in); !slices.Equal(got, tc.ring) {
					t.Fatalf("ring %v, want %v", got, tc.ring)
				}
				if len(out) != len(tc.why) {
					t.Fatalf("left out %v, want %v", out, tc.why)
				}
				for name, sub := range tc.why {
					if !strings.Contains(out[name], sub) {
						t.Fatalf("%s left out because %q; want it to say %q", name, out[name], sub)
					}
				}
			}
		})
	}
}

// TestForeignMemberGetsNoPartitions is the regression test of issue 12's
// case 5 at the gossip level: a member with other rules joins a cluster of
// three. Every member, the newcomer included, keeps the ring of the three,
// and lists the newcomer as left out, saying why.
func TestForeignMemberGetsNoPartitions(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c", "node-d")
	cfg := func(name string, rules uint64, seeds ...string) Config {
		c := mockConfig(t, n, name, seeds...)
		c.Agreement = Agreement{Rules: rules, Protocol: 1, Version: "test"}
		return c
	}
	seed := n.byName["node-a"].addr
	a := start(t, cfg("node-a", 1))
	b := start(t, cfg("node-b", 1, seed))
	c := start(t, cfg("node-c", 1, seed))
	three := []*Membership{a, b, c}
	eventually(t, 10*time.Second, "three converge", converged(three, "node-a", "node-b", "node-c"))
	epoch := a.Ring().Epoch()

	d := start(t, cfg("node-d", 2, seed))
	all := append(three, d)
	eventually(t, 10*time.Second, "d is seen and left out by everyone", func() error {
		if err := converged(all, "node-a", "node-b", "node-c")(); err != nil {
			return err
		}
		for _, m := range all {
			s, ok := member(m, "node-d")
			if !ok || s.State != StateServing || !strings.Contains(s.Excluded, "rules hash 0000000000000002, the ring's 0000000000000001") {
				return errorf("%s sees node-d as %+v", m.Name(), s)
			}
			if s.Rules != 2 || !s.Agreed || s.Version != "test" {
				return errorf("%s sees node-d's agreement as %+v", m.Name(), s)
			}
		}
		return nil
	})
	if got := d.Ring().Epoch(); got != epoch {
		t.Fatalf("the ring changed when a foreign member joined: epoch %016x, was %016x", got, epoch)
	}
	if got := d.Ring().Counts()["node-d"]; got != 0 {
		t.Fatalf("node-d owns %d partitions", got)
	}
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
