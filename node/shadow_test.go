package node

import (
	"context"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

const shadowRules = `domains:
  - name: sms
    rules:
      - {name: recipient-1m, scope: recipient, limit: 3, window: 1m}
      - {name: trial-10s, scope: recipient, limit: 1, window: 10s, shadow: true}
  - name: trial
    shadow: true
    rules:
      - {name: all-1m, scope: recipient, limit: 2, window: 1m}
`

func newRulesNode(t testing.TB, yaml string) (*Node, *fixedClock) {
	t.Helper()
	rs, err := rules.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	clk := &fixedClock{ns: t0 * 1e6}
	n, err := New(Config{Clock: clk, Name: "test", Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, clk
}

// ruleStats returns the node's counters of one domain's rules, by name.
func ruleStats(n *Node, domain string) map[string]RuleStats {
	out := map[string]RuleStats{}
	for _, d := range n.Stats().Domains {
		if d.Name == domain {
			for _, r := range d.Rules {
				out[r.Name] = r
			}
		}
	}
	return out
}

// TestShadowRuleNeverDeniesAndIsCounted: one send a second to one recipient
// of domain sms. The shadow rule (1 in 10s) would deny from the second send
// on and never does; the real rule (3 a minute) denies from the fourth. The
// answer names the shadow rule, the counters count it, and the records hold
// exactly the admitted sends.
func TestShadowRuleNeverDeniesAndIsCounted(t *testing.T) {
	n, clk := newRulesNode(t, shadowRules)
	ctx := context.Background()
	wantShadow := []int32{-1, 1, 1, 1, 1}
	wantAdmitted := []bool{true, true, true, false, false}
	for k := range 5 {
		clk.ns = (t0 + int64(k)*1000) * 1e6
		resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+1"}, Domains: []string{"sms"}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("send %d: %v %v", k, err, resp.GetErrors())
		}
		if resp.Admitted[0] != wantAdmitted[k] || resp.Recorded[0] != wantAdmitted[k] {
			t.Fatalf("send %d: admitted %v recorded %v, want %v", k, resp.Admitted[0], resp.Recorded[0], wantAdmitted[k])
		}
		switch {
		case wantShadow[k] < 0 && resp.ShadowDeniedBy != nil:
			t.Fatalf("send %d: shadow_denied_by %v, want empty (no item has one)", k, resp.ShadowDeniedBy)
		case wantShadow[k] >= 0 && (len(resp.ShadowDeniedBy) != 1 || resp.ShadowDeniedBy[0] != wantShadow[k]):
			t.Fatalf("send %d: shadow_denied_by %v, want [%d]", k, resp.ShadowDeniedBy, wantShadow[k])
		}
		if !wantAdmitted[k] && resp.DeniedBy[0] != 0 {
			t.Fatalf("send %d: denied by %d, want 0", k, resp.DeniedBy[0])
		}
		// The shadow rule's counts are the truth: used grows past its limit.
		if got := resp.Used[1]; k < 3 && got != uint32(k+1) {
			t.Fatalf("send %d: shadow rule used %d, want %d", k, got, k+1)
		}
		if !resp.Domains["sms"].Rules[1].Shadow || resp.Domains["sms"].Rules[0].Shadow {
			t.Fatalf("send %d: rule descriptions %v", k, resp.Domains["sms"].Rules)
		}
	}
	got := ruleStats(n, "sms")
	if got["trial-10s"].ShadowDenied != 4 || got["trial-10s"].Denied != 0 || got["recipient-1m"].Denied != 2 || got["recipient-1m"].ShadowDenied != 0 {
		t.Fatalf("rule stats %+v, want trial-10s shadow-denied 4, recipient-1m denied 2", got)
	}
	if s := n.Stats(); s.Admitted != 3 || s.Denied != 2 {
		t.Fatalf("admitted %d denied %d, want 3 and 2", s.Admitted, s.Denied)
	}
	// A peek reports the shadow rule too; a record-only item is not checked.
	resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{"+1", "+1"}, Domains: []string{"sms"},
		Modes: []pb.Mode{pb.Mode_MODE_PEEK, pb.Mode_MODE_RECORD_ONLY}})
	if err != nil || len(resp.ShadowDeniedBy) != 2 || resp.ShadowDeniedBy[0] != 1 || resp.ShadowDeniedBy[1] != -1 {
		t.Fatalf("peek and record-only: %v, shadow_denied_by %v, want [1 -1]", err, resp.GetShadowDeniedBy())
	}
}

// TestShadowDomain: "shadow: true" on a domain makes every rule a shadow:
// nothing is denied, every send is recorded, and each one past the limit is
// counted and named.
func TestShadowDomain(t *testing.T) {
	n, _ := newRulesNode(t, shadowRules)
	ctx := context.Background()
	req := &pb.CheckRequest{Recipients: []string{"+2", "+2", "+2", "+2", "+2"}, Domains: []string{"trial"}}
	resp, err := n.Check(ctx, req)
	if err != nil || len(resp.Errors) > 0 {
		t.Fatal(err, resp.GetErrors())
	}
	for k := range 5 {
		want := int32(-1)
		if k >= 2 {
			want = 0
		}
		if !resp.Admitted[k] || !resp.Recorded[k] || resp.DeniedBy[k] != -1 || resp.ShadowDeniedBy[k] != want {
			t.Fatalf("item %d: admitted %v recorded %v denied %d shadow %d, want admitted, recorded, -1, %d",
				k, resp.Admitted[k], resp.Recorded[k], resp.DeniedBy[k], resp.ShadowDeniedBy[k], want)
		}
	}
	if got := ruleStats(n, "trial")["all-1m"]; got.ShadowDenied != 3 || got.Denied != 0 {
		t.Fatalf("all-1m stats %+v, want shadow-denied 3", got)
	}
	// The records hold all five sends: the last one's used is 5, capped at the
	// scope's largest limit (2), as any rule's.
	if resp.Used[4] != 2 {
		t.Fatalf("used %d after five sends, want 2 (the record keeps the largest limit of the scope)", resp.Used[4])
	}
}
