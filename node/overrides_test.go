package node

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// overrideRules: a base whose largest recipient limit (the record's cap)
// is 20, which the vip override raises to 40.
const overrideRules = `domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 3, window: 1m}
      - {name: recipient-1h, scope: recipient, limit: 20, window: 1h}
`

var vip = &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"+1555"}, Limits: map[string]uint32{"recipient-1m": 10, "recipient-1h": 40}}

// refLimits decides by brute force: a send at t is admitted iff every rule
// (limit, window ms) counts fewer than limit sends in (t-window, t].
func refAdmits(sends []int64, t int64, limits [2]int) bool {
	for r, w := range [2]int64{60_000, 3_600_000} {
		n := 0
		for _, s := range sends {
			if s > t-w && s <= t {
				n++
			}
		}
		if n+1 > limits[r] {
			return false
		}
	}
	return true
}

// TestOverrideAppliesAndLiftsLiveWithoutLosingCounts: one key is checked
// at random times while its override (raising both limits, the larger one
// above the base's record capacity) is set and lifted live, ten times.
// Every decision equals the brute-force one under the limits in force over
// every send ever admitted: raising keeps more history in the record, and
// lifting judges the kept history by the base limits exactly.
func TestOverrideAppliesAndLiftsLiveWithoutLosingCounts(t *testing.T) {
	n, clk := newRulesNode(t, overrideRules)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(14, 3))
	var sends []int64
	now := t0
	on := false
	var admittedOn, admittedOver20 int
	for phase := range 10 {
		on = phase%2 == 0
		if on {
			if _, err := n.SetOverride(ctx, &pb.OverrideSetRequest{Override: vip}); err != nil {
				t.Fatal(err)
			}
		} else if r, err := n.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"}); err != nil || !r.Deleted {
			t.Fatalf("delete: %v %v", r, err)
		}
		limits := [2]int{3, 20}
		if on {
			limits = [2]int{10, 40}
		}
		for range 150 {
			now += int64(rng.IntN(8_000))
			clk.ns = now * 1e6
			want := refAdmits(sends, now, limits)
			resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+1555"}})
			if err != nil || len(resp.Errors) > 0 {
				t.Fatal(err, resp.GetErrors())
			}
			if resp.Admitted[0] != want {
				t.Fatalf("phase %d (override %v) t0%+d: admitted %v, brute force says %v (%d sends)", phase, on, now-t0, resp.Admitted[0], want, len(sends))
			}
			if want {
				sends = append(sends, now)
				if on {
					admittedOn++
					n1h := 0
					for _, s := range sends {
						if s > now-3_600_000 {
							n1h++
						}
					}
					if n1h > 20 {
						admittedOver20++
					}
				}
			}
		}
	}
	if admittedOn == 0 || admittedOver20 == 0 {
		t.Fatalf("the override never admitted beyond the base's capacity (%d admitted under it, %d beyond 20 an hour): the test proves nothing", admittedOn, admittedOver20)
	}
	// Other keys never saw the override.
	resp, _ := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+1556", "+1556", "+1556", "+1556"}})
	if got := resp.Admitted; !got[0] || !got[2] || got[3] {
		t.Fatalf("another key: admitted %v, want 3 of 4 under the base", got)
	}
}

// TestExemptOverride: an exempt prefix admits every send without a check,
// records each, reports no shadow denial; lifted, the base limits judge all
// of them.
func TestExemptOverride(t *testing.T) {
	n, _ := newRulesNode(t, overrideRules)
	ctx := context.Background()
	if _, err := n.SetOverride(ctx, &pb.OverrideSetRequest{Override: &pb.Override{Name: "test-numbers", Domain: "default", Prefixes: []string{"+1555"}, Exempt: true}}); err != nil {
		t.Fatal(err)
	}
	req := &pb.CheckRequest{Recipients: make([]string, 25)}
	for i := range req.Recipients {
		req.Recipients[i] = "+15550001"
	}
	resp, err := n.Check(ctx, req)
	if err != nil || len(resp.Errors) > 0 {
		t.Fatal(err, resp.GetErrors())
	}
	for i := range 25 {
		if !resp.Admitted[i] || !resp.Recorded[i] {
			t.Fatalf("item %d: admitted %v recorded %v, want both", i, resp.Admitted[i], resp.Recorded[i])
		}
	}
	if resp.ShadowDeniedBy != nil {
		t.Fatalf("an exempt key reports shadow denials %v", resp.ShadowDeniedBy)
	}
	if s := ruleStats(n, "default"); s["recipient-1m"].ShadowDenied != 0 || s["recipient-1m"].Denied != 0 {
		t.Fatalf("rule stats %+v: exempt items count as denials", s)
	}
	if _, err := n.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "test-numbers"}); err != nil {
		t.Fatal(err)
	}
	resp, err = n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+15550001"}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || resp.Admitted[0] || resp.Used[1] != 20 || resp.Remaining[1] != 0 {
		t.Fatalf("lifted: %v admitted %v used %v, want denied with the hour full (20, the record's cap)", err, resp.GetAdmitted(), resp.GetUsed())
	}
}

// TestMalformedOverrideChangesNothing: each bad override is refused with
// INVALID_ARGUMENT naming the field and the value, and the node's overrides
// and decisions stay as they were.
func TestMalformedOverrideChangesNothing(t *testing.T) {
	n, _ := newRulesNode(t, overrideRules)
	ctx := context.Background()
	if _, err := n.SetOverride(ctx, &pb.OverrideSetRequest{Override: vip}); err != nil {
		t.Fatal(err)
	}
	before, _ := n.ListOverrides(ctx, nil)
	for _, tc := range []struct {
		name string
		o    *pb.Override
		want string
	}{
		{"missing", nil, "override: missing"},
		{"no name", &pb.Override{Domain: "default", Recipients: []string{"a"}, Exempt: true}, `override "": name: is empty`},
		{"unknown domain", &pb.Override{Name: "vip", Domain: "sms", Recipients: []string{"a"}, Exempt: true}, `override "vip": domain: unknown domain "sms"`},
		{"unknown rule", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Limits: map[string]uint32{"recipient-2m": 4}}, `override "vip": limits: unknown rule "recipient-2m"`},
		{"limit too high", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Limits: map[string]uint32{"recipient-1m": 5000}}, `override "vip": limits: rule "recipient-1m": limit 5000 out of range [1, 1000]`},
		{"limit above 2^30", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Limits: map[string]uint32{"recipient-1m": 3_000_000_000}}, `override "vip": limits: rule "recipient-1m": limit 3000000000 out of range [1, 1000]`},
		{"largest limit", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Limits: map[string]uint32{"recipient-1m": math.MaxUint32}}, `limit 4294967295 out of range [1, 1000]`},
		{"no keys", &pb.Override{Name: "vip", Domain: "default", Exempt: true}, `override "vip": recipients: no recipients and no prefixes`},
		{"bad utf-8", &pb.Override{Name: "vip", Domain: "default", Prefixes: []string{"+1\xff"}, Exempt: true}, `override "vip": prefixes: entry 0 "+1\xff" is not valid UTF-8`},
		{"both", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Exempt: true, Limits: map[string]uint32{"recipient-1m": 5}}, `override "vip": exempt: exempt and limits both set`},
		{"older", &pb.Override{Name: "vip", Domain: "default", Recipients: []string{"a"}, Exempt: true, Version: 1}, `override "vip": version: 1 is older`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.SetOverride(ctx, &pb.OverrideSetRequest{Override: tc.o})
			if c := status.Code(err); (c != codes.InvalidArgument && c != codes.FailedPrecondition) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want INVALID_ARGUMENT containing %q", err, tc.want)
			}
		})
	}
	after, _ := n.ListOverrides(ctx, nil)
	if len(after.Overrides) != 1 || after.Overrides[0].String() != before.Overrides[0].String() {
		t.Fatalf("overrides changed: %v, were %v", after.Overrides, before.Overrides)
	}
	// vip still applies: 10 a minute.
	req := &pb.CheckRequest{Recipients: make([]string, 11)}
	for i := range req.Recipients {
		req.Recipients[i] = "+1555"
	}
	resp, _ := n.Check(ctx, req)
	if !resp.Admitted[9] || resp.Admitted[10] {
		t.Fatalf("admitted %v, want 10 of 11 under vip", resp.Admitted)
	}
}

// TestOverridesSurviveRestart: admin overrides are in the data directory:
// after a restart (and after a crash, from the WAL) they are in force, and
// the raised history the records kept under them is replayed whole.
func TestOverridesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	rs, err := rules.Parse("test", []byte(overrideRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Rules: rs, Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1, Name: "n"}
	n := openNode(t, cfg)
	ctx := context.Background()
	if _, err := n.SetOverride(ctx, &pb.OverrideSetRequest{Override: vip}); err != nil {
		t.Fatal(err)
	}
	send := func(n *Node, k int) []bool {
		t.Helper()
		var out []bool
		for range k {
			clk.advance(7_000_000_000) // 7 s: the minute admits at most 9
			resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+1555"}})
			if err != nil || len(resp.Errors) > 0 {
				t.Fatal(err, resp.GetErrors())
			}
			out = append(out, resp.Admitted[0])
		}
		return out
	}
	for i, a := range send(n, 30) {
		if !a {
			t.Fatalf("send %d denied under vip", i)
		}
	}
	crash(t, n) // no final snapshot: the WAL replays the 30 sends
	if _, err := os.Stat(filepath.Join(dir, overridesFile)); err != nil {
		t.Fatal(err)
	}
	n = openNode(t, cfg)
	defer n.Close()
	list, _ := n.ListOverrides(ctx, nil)
	if len(list.Overrides) != 1 || list.Overrides[0].Name != "vip" || list.Overrides[0].Source != "admin" || list.Overrides[0].Version == 0 {
		t.Fatalf("after restart: overrides %v", list.Overrides)
	}
	// 30 sends in the hour were replayed (not pruned to the base's 20):
	// 10 more are admitted, the 41st is not.
	got := send(n, 11)
	for i, a := range got {
		if a != (i < 10) {
			t.Fatalf("after restart: admitted %v, want 10 then a denial (30 of 40 replayed)", got)
		}
	}
}
