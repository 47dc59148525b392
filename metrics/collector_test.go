package metrics_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/metrics"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

const t0 = int64(1_790_000_000_000) // unix ms

// clock is a node.Clock that moves only when told, unix ns.
type clock struct{ ns int64 }

func (c *clock) Now() int64 { return c.ns }

const testRules = `
domains:
  - name: a
    rules:
      - {name: r1, scope: recipient, limit: 2, window: 1m}
      - {name: r2, scope: recipient, limit: 3, window: 1h}
  - name: b
    rules:
      - {name: q, scope: recipient, limit: 1, window: 1m}
`

// newNode opens a memory-only node serving testRules at t0 with obs.
func newNode(t *testing.T, obs node.Observer) (*node.Node, *clock) {
	t.Helper()
	rs, err := rules.Parse("test", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{ns: t0 * 1e6}
	n, err := node.New(node.Config{Rules: rs, Clock: clk, Name: "n1", SweepInterval: -1, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, clk
}

// knownSequence runs checks whose outcome is worked out by hand in
// TestMetricValues: domain a admits 3 and denies 2 (one by r1, one by r2);
// domain b admits 1 and answers its retry as a duplicate; one item fails
// ALREADY_EXISTS (a request id reused in another domain) and two
// INVALID_ARGUMENT (an unknown domain).
func knownSequence(t *testing.T, n *node.Node, clk *clock) {
	t.Helper()
	check := func(req *pb.CheckRequest) {
		t.Helper()
		if _, err := n.Check(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	x := &pb.CheckRequest{Recipients: []string{"x"}, Domains: []string{"a"}}
	check(&pb.CheckRequest{Recipients: []string{"x", "x", "x"}, Domains: []string{"a"}}) // admitted, admitted, denied by r1
	clk.ns += int64(time.Minute)
	check(x) // admitted: r2 holds 3
	clk.ns += int64(time.Minute)
	check(x) // denied by r2
	yb := &pb.CheckRequest{Recipients: []string{"y"}, Domains: []string{"b"}, RequestIds: []uint64{7}}
	check(yb)                                                                                           // admitted
	check(yb)                                                                                           // a duplicate, answered as admitted
	check(&pb.CheckRequest{Recipients: []string{"y"}, Domains: []string{"a"}, RequestIds: []uint64{7}}) // ALREADY_EXISTS
	check(&pb.CheckRequest{Recipients: []string{"u", "v"}, Domains: []string{"nope"}})                  // INVALID_ARGUMENT x2
}

func TestMetricValues(t *testing.T) {
	obs := metrics.NewObserver()
	n, clk := newNode(t, obs)
	knownSequence(t, n, clk)
	want := `
# HELP freqring_decisions_total Items decided on this node, by domain and result (admitted or denied); an item answered from the idempotency table counts as admitted.
# TYPE freqring_decisions_total counter
freqring_decisions_total{domain="a",result="admitted"} 3
freqring_decisions_total{domain="a",result="denied"} 2
freqring_decisions_total{domain="b",result="admitted"} 2
freqring_decisions_total{domain="b",result="denied"} 0
# HELP freqring_rule_denied_total Items denied, by domain and the rule the answer names (denied_by: the denying rule with the longest retry-after); a domain's rules sum to its denied decisions.
# TYPE freqring_rule_denied_total counter
freqring_rule_denied_total{domain="a",rule="r1"} 1
freqring_rule_denied_total{domain="a",rule="r2"} 1
freqring_rule_denied_total{domain="b",rule="q"} 0
# HELP freqring_failed_items_total Items this node answered with an error, by gRPC code name: those failed here and those whose owner did not answer a forward.
# TYPE freqring_failed_items_total counter
freqring_failed_items_total{code="AlreadyExists"} 1
freqring_failed_items_total{code="InvalidArgument"} 2
# HELP freqring_duplicate_items_total Items answered from the idempotency table (a retried request id): not recorded again.
# TYPE freqring_duplicate_items_total counter
freqring_duplicate_items_total 1
# HELP freqring_checked_items_total Items decided or failed on this node (its own and those peers forwarded to it).
# TYPE freqring_checked_items_total counter
freqring_checked_items_total 10
# HELP freqring_domain_records Recipients with a record, by domain (owned, backed up and moving partitions).
# TYPE freqring_domain_records gauge
freqring_domain_records{domain="a"} 1
freqring_domain_records{domain="b"} 1
# HELP freqring_serving 1 while the node decides (recovered and joined, not shutting down), else 0.
# TYPE freqring_serving gauge
freqring_serving 1
# HELP freqring_ring_members Members in the ring this node routes by.
# TYPE freqring_ring_members gauge
freqring_ring_members 1
# HELP freqring_reloads_total Rules reloads, by result: ok (applied) or failed (refused; the old rules stay).
# TYPE freqring_reloads_total counter
freqring_reloads_total{result="failed"} 0
freqring_reloads_total{result="ok"} 0
# HELP freqring_gossip_bad_packets_total Gossip packets and streams that did not decode or decrypt.
# TYPE freqring_gossip_bad_packets_total counter
freqring_gossip_bad_packets_total 0
# HELP freqring_gossip_warnings_total Warning and error lines of memberlist (the gossip library), bad packets' among them.
# TYPE freqring_gossip_warnings_total counter
freqring_gossip_warnings_total 0
# HELP freqring_gossip_warnings_not_logged_total Warning lines of memberlist left out of the log: at most one of a kind is logged every 10 s.
# TYPE freqring_gossip_warnings_not_logged_total counter
freqring_gossip_warnings_not_logged_total 0
# HELP freqring_check_items Items per Check call (or CheckStream request).
# TYPE freqring_check_items histogram
freqring_check_items_bucket{le="1"} 5
freqring_check_items_bucket{le="4"} 7
freqring_check_items_bucket{le="16"} 7
freqring_check_items_bucket{le="64"} 7
freqring_check_items_bucket{le="256"} 7
freqring_check_items_bucket{le="1024"} 7
freqring_check_items_bucket{le="4096"} 7
freqring_check_items_bucket{le="16384"} 7
freqring_check_items_bucket{le="+Inf"} 7
freqring_check_items_sum 10
freqring_check_items_count 7
`
	names := []string{"freqring_decisions_total", "freqring_rule_denied_total", "freqring_failed_items_total",
		"freqring_duplicate_items_total", "freqring_checked_items_total", "freqring_domain_records", "freqring_serving",
		"freqring_ring_members", "freqring_reloads_total", "freqring_check_items",
		"freqring_gossip_bad_packets_total", "freqring_gossip_warnings_total", "freqring_gossip_warnings_not_logged_total"}
	reg := metrics.NewRegistry(n, obs)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// Durations are not exact, but there is one Check observation per call.
	if got := testutil.CollectAndCount(obs, "freqring_check_duration_seconds"); got != 1 {
		t.Fatalf("freqring_check_duration_seconds: %d series, want 1", got)
	}
}

// TestStageHistograms: one series per stage each call reports, and a stage
// a call does not report is dropped.
func TestStageHistograms(t *testing.T) {
	obs := metrics.NewObserver()
	want := 0
	for _, c := range node.Calls() {
		want += len(node.StagesOf(c))
	}
	if got := testutil.CollectAndCount(obs, "freqring_stage_duration_seconds"); got != want || want < 20 {
		t.Fatalf("freqring_stage_duration_seconds: %d series, want %d", got, want)
	}
	obs.Stage(node.CallCheck, node.StageWALFsync, 3*time.Millisecond)
	obs.Stage(node.CallReplicate, node.StageJudge, time.Millisecond) // not a stage of replicate
	exp := `
# HELP freqring_stage_duration_seconds Wall time of one stage of a call: call is check (at the node it reached), forward (at the owner a check was forwarded to) or replicate (at a backup); stage is queue, decode, judge, forward, store, wal_queue, wal_write, wal_fsync, backup, persist (the WAL and backups waited for together), apply or respond. docs/operations.md says what each one covers.
# TYPE freqring_stage_duration_seconds histogram
`
	var b strings.Builder
	b.WriteString(exp)
	for _, c := range node.Calls() {
		for _, s := range node.StagesOf(c) {
			n, sum := 0, "0"
			if c == node.CallCheck && s == node.StageWALFsync {
				n, sum = 1, "0.003"
			}
			for _, le := range metrics.StageBuckets {
				k := 0
				if le >= 0.003 {
					k = n
				}
				fmt.Fprintf(&b, "freqring_stage_duration_seconds_bucket{call=%q,stage=%q,le=%q} %d\n", c.String(), s.String(), strconv.FormatFloat(le, 'g', -1, 64), k)
			}
			fmt.Fprintf(&b, "freqring_stage_duration_seconds_bucket{call=%q,stage=%q,le=\"+Inf\"} %d\n", c.String(), s.String(), n)
			fmt.Fprintf(&b, "freqring_stage_duration_seconds_sum{call=%q,stage=%q} %s\n", c.String(), s.String(), sum)
			fmt.Fprintf(&b, "freqring_stage_duration_seconds_count{call=%q,stage=%q} %d\n", c.String(), s.String(), n)
		}
	}
	if err := testutil.CollectAndCompare(obs, strings.NewReader(b.String()), "freqring_stage_duration_seconds"); err != nil {
		t.Fatal(err)
	}
}

// TestNoRecipientInLabels scrapes a node that decided for distinctive
// recipients and contents and checks that none reaches the exposition.
func TestNoRecipientInLabels(t *testing.T) {
	obs := metrics.NewObserver()
	n, _ := newNode(t, obs)
	n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+8613812345678", "secret-recipient"},
		Contents: [][]byte{[]byte("secret-content")}, Domains: []string{"a"}})
	n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"unknown-domain-recipient"}, Domains: []string{"zz-unknown"}})
	mfs, err := metrics.NewRegistry(n, obs).Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				for _, bad := range []string{"8613812345678", "secret", "unknown-domain", "zz-unknown"} {
					if strings.Contains(l.GetValue(), bad) {
						t.Errorf("%s{%s=%q} carries request data", mf.GetName(), l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
}

// TestMetricNamesFollowConventions checks every freqring_ metric a node
// exports: counters end in _total, nothing is a summary, and names carry a
// unit or are counts.
func TestMetricNamesFollowConventions(t *testing.T) {
	obs := metrics.NewObserver()
	n, clk := newNode(t, obs)
	knownSequence(t, n, clk)
	mfs, err := metrics.NewRegistry(n, obs).Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "freqring_") {
			continue
		}
		seen++
		switch mf.GetType().String() {
		case "COUNTER":
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case "SUMMARY":
			t.Errorf("%s is a summary: use a histogram", name)
		default:
			if strings.HasSuffix(name, "_total") {
				t.Errorf("%s ends in _total but is a %s", name, mf.GetType())
			}
		}
		if strings.Contains(name, "duration") && !strings.HasSuffix(name, "_seconds") {
			t.Errorf("%s is a duration not in seconds", name)
		}
	}
	if seen < 30 {
		t.Fatalf("only %d freqring_ metrics gathered", seen)
	}
}

// TestMetricValuesOfReloadsShadowRulesAndRefunds: the counters of reloads
// (applied, failed and refused), shadow denials and refunds after a known
// sequence.
func TestMetricValuesOfReloadsShadowRulesAndRefunds(t *testing.T) {
	const shadowRules = `
domains:
  - name: s
    rules:
      - {name: enforced, scope: recipient, limit: 5, window: 1h}
      - {name: trial, scope: recipient, limit: 1, window: 1h, shadow: true}
  - name: gone
    rules:
      - {name: g, scope: recipient, limit: 1, window: 1h}
`
	rs, err := rules.Parse("test", []byte(shadowRules))
	if err != nil {
		t.Fatal(err)
	}
	obs := metrics.NewObserver()
	n, err := node.New(node.Config{Rules: rs, Clock: &clock{ns: t0 * 1e6}, Name: "n1", SweepInterval: -1, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	check := func(id uint64, domain string, mode pb.Mode) {
		t.Helper()
		resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"x"}, Domains: []string{domain}, RequestIds: []uint64{id}, Modes: []pb.Mode{mode}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("%v: %v %v", mode, resp.GetErrors(), err)
		}
	}
	check(1, "s", pb.Mode_MODE_CHECK_AND_RECORD)
	check(2, "s", pb.Mode_MODE_CHECK_AND_RECORD) // trial would deny
	check(3, "s", pb.Mode_MODE_CHECK_AND_RECORD) // trial would deny
	check(3, "s", pb.Mode_MODE_REFUND)
	check(3, "s", pb.Mode_MODE_REFUND) // a repeat: no second refund
	check(4, "gone", pb.Mode_MODE_CHECK_AND_RECORD)

	wider, err := rules.Parse("test", []byte(strings.Replace(shadowRules, "limit: 5", "limit: 6", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(context.Background(), wider); err != nil {
		t.Fatal(err)
	}
	_, badErr := rules.Parse("test", []byte(strings.Replace(shadowRules, "limit: 5", "limit: 0", 1)))
	n.ReloadFailed(badErr)
	without, err := rules.Parse("test", []byte(shadowRules[:strings.Index(shadowRules, "  - name: gone")]))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(context.Background(), without); err == nil {
		t.Fatal("a reload dropping a domain with records went through")
	}
	want := `
# HELP freqring_reloads_total Rules reloads, by result: ok (applied) or failed (refused; the old rules stay).
# TYPE freqring_reloads_total counter
freqring_reloads_total{result="failed"} 2
freqring_reloads_total{result="ok"} 1
# HELP freqring_refunds_total Sends returned by request id (refunds).
# TYPE freqring_refunds_total counter
freqring_refunds_total 1
# HELP freqring_rule_shadow_denied_total Items a shadow rule would have denied (it never denies), by domain and rule.
# TYPE freqring_rule_shadow_denied_total counter
freqring_rule_shadow_denied_total{domain="gone",rule="g"} 0
freqring_rule_shadow_denied_total{domain="s",rule="enforced"} 0
freqring_rule_shadow_denied_total{domain="s",rule="trial"} 2
# HELP freqring_decisions_total Items decided on this node, by domain and result (admitted or denied); an item answered from the idempotency table counts as admitted.
# TYPE freqring_decisions_total counter
freqring_decisions_total{domain="gone",result="admitted"} 1
freqring_decisions_total{domain="gone",result="denied"} 0
freqring_decisions_total{domain="s",result="admitted"} 3
freqring_decisions_total{domain="s",result="denied"} 0
`
	reg := metrics.NewRegistry(n, obs)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "freqring_reloads_total", "freqring_refunds_total",
		"freqring_rule_shadow_denied_total", "freqring_decisions_total"); err != nil {
		t.Fatal(err)
	}
}
