package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// reloadClock is a clock a test sets, in unix ms.
type reloadClock struct{ ms atomic.Int64 }

func (c *reloadClock) Now() int64 { return c.ms.Load() * int64(time.Millisecond) }

// openReloadNode opens a memory-only node on rulesYAML at clock c.
func openReloadNode(t *testing.T, rulesYAML string, c *reloadClock) *node.Node {
	t.Helper()
	n, err := node.New(node.Config{Rules: mustParse(t, rulesYAML), Clock: c, SweepInterval: -1, Name: "reload"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// checkItem sends one item and returns its answer's admitted flag and the
// used count of each rule.
func checkItem(t *testing.T, n *node.Node, domain, rcp string, mode pb.Mode) (bool, []uint32) {
	t.Helper()
	resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Domains: []string{domain}, Modes: []pb.Mode{mode}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Errors) > 0 {
		t.Fatalf("%s/%s: %v", domain, rcp, resp.Errors[0])
	}
	return resp.Admitted[0], resp.Used
}

const tenPerHourAndSms = tenPerHour + `  - name: sms
    rules:
      - {name: sms-1m, scope: recipient, limit: 2, window: 1m}
`

// TestReloadJudgesHistoryByNewLimits: records survive a reload, and the new
// limits judge them at once.
func TestReloadJudgesHistoryByNewLimits(t *testing.T) {
	clk := &reloadClock{}
	clk.ms.Store(1_000_000)
	n := openReloadNode(t, tenPerHour, clk)
	for range 7 {
		if ok, _ := checkItem(t, n, "default", "+1", pb.Mode_MODE_CHECK_AND_RECORD); !ok {
			t.Fatal("denied below the limit")
		}
		clk.ms.Add(1000)
	}
	five := strings.Replace(tenPerHour, "limit: 10", "limit: 5", 1)
	if err := n.Reload(context.Background(), mustParse(t, five)); err != nil {
		t.Fatal(err)
	}
	if ok, used := checkItem(t, n, "default", "+1", pb.Mode_MODE_CHECK_AND_RECORD); ok || used[0] != 5 {
		// Used saturates at the scope's largest limit (window.RuleResult).
		t.Fatalf("under 5 per hour after 7 sends: admitted %v, used %v; want denied, 5", ok, used)
	}
	twenty := strings.Replace(tenPerHour, "limit: 10", "limit: 20", 1)
	if err := n.Reload(context.Background(), mustParse(t, twenty)); err != nil {
		t.Fatal(err)
	}
	if ok, used := checkItem(t, n, "default", "+1", pb.Mode_MODE_CHECK_AND_RECORD); !ok || used[0] != 8 {
		t.Fatalf("under 20 per hour after 7 sends: admitted %v, used %v; want admitted, 8", ok, used)
	}
	if resp, _ := n.Rules(context.Background(), &pb.RulesRequest{}); resp.Domains[0].Rules[0].Limit != 20 {
		t.Fatalf("Rules RPC after the reload: %v, want limit 20", resp.Domains[0])
	}
	if s := n.Stats(); s.Reloads != 2 || s.ReloadFailures != 0 {
		t.Fatalf("Stats: %d reloads, %d failures; want 2, 0", s.Reloads, s.ReloadFailures)
	}
}

// TestReloadRefusesToDropHistory: a reload without a domain that holds
// records changes nothing; once they have expired, it goes through.
func TestReloadRefusesToDropHistory(t *testing.T) {
	clk := &reloadClock{}
	clk.ms.Store(1_000_000)
	n := openReloadNode(t, tenPerHourAndSms, clk)
	checkItem(t, n, "sms", "+1", pb.Mode_MODE_CHECK_AND_RECORD)
	checkItem(t, n, "sms", "+1", pb.Mode_MODE_CHECK_AND_RECORD)
	err := n.Reload(context.Background(), mustParse(t, tenPerHour))
	if !errors.Is(err, node.ErrRemovedDomains) || !strings.Contains(err.Error(), `"sms" (1 records`) {
		t.Fatalf("reload without sms: %v; want ErrRemovedDomains naming sms and its records", err)
	}
	if ok, used := checkItem(t, n, "sms", "+1", pb.Mode_MODE_PEEK); ok || used[0] != 2 {
		t.Fatalf("sms after the refused reload: admitted %v, used %v; want denied at 2", ok, used)
	}
	if s := n.Stats(); s.Reloads != 0 || s.ReloadFailures != 1 {
		t.Fatalf("Stats: %d reloads, %d failures; want 0, 1", s.Reloads, s.ReloadFailures)
	}
	clk.ms.Add(time.Minute.Milliseconds()) // sms's window has passed; the sweep keeps them SweepSlack more
	if _, err := n.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(context.Background(), mustParse(t, tenPerHour)); !errors.Is(err, node.ErrRemovedDomains) {
		t.Fatalf("reload while sms's records are within the sweep's slack: %v; want ErrRemovedDomains", err)
	}
	clk.ms.Add(node.SweepSlack.Milliseconds())
	if _, err := n.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(context.Background(), mustParse(t, tenPerHour)); err != nil {
		t.Fatalf("reload once sms's records expired: %v", err)
	}
	resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+1"}, Domains: []string{"sms"}})
	if err != nil || len(resp.Errors) != 1 || !strings.Contains(resp.Errors[0].Message, "unknown domain") {
		t.Fatalf("sms after it was dropped: %v %v; want unknown domain", resp.GetErrors(), err)
	}
}

// TestReloadUnderLoad reloads a node's rules, and fails to (a bad file),
// while 64 senders check: the oracle finds no over-admission and no
// forgotten send, and a peek of every recipient counts the same before and
// after a reload and a failed one.
func TestReloadUnderLoad(t *testing.T) {
	base := mustParse(t, churnRules)
	more := mustParse(t, churnRules+`  - name: extra
    rules:
      - {name: extra-1m, scope: recipient, limit: 3, window: 1m}
`)
	c := moveCluster(t, 1, churnRules, true, "")
	n := c.Members()[0].Node
	s := newSender(c, 5)
	const population = 400
	rec := &loadRecord{}
	stop := make(chan struct{})
	wg := runLoad(t, s, 64, population, stop, rec)
	waitDecided(t, rec, 1000)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	for i := range 20 {
		rs := []*rules.Set{more, base}[i%2]
		if err := n.Reload(context.Background(), rs); err != nil {
			t.Fatal(err)
		}
		waitDecided(t, rec, 100)
		if i%5 == 0 { // a bad file: Watch reports it, and nothing changes
			if err := os.WriteFile(path, []byte(strings.Replace(churnRules, "limit: 5", "limit: -5", 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := rules.Load(path)
			if err == nil {
				t.Fatal("a negative limit loaded")
			}
			n.ReloadFailed(err)
		}
	}
	close(stop)
	wg.Wait()
	if st := n.Stats(); st.Reloads != 20 || st.ReloadFailures != 4 {
		t.Fatalf("Stats: %d reloads, %d failures; want 20, 4", st.Reloads, st.ReloadFailures)
	}
	wantExact(t, base, s, rec, population)

	// count-1h's counts: the load has stopped, and the shorter windows
	// move on with the clock.
	counts := func() []uint32 {
		var all []uint32
		for i := range population {
			_, used := checkItem(t, n, "default", fmt.Sprintf("+86137%08d", i), pb.Mode_MODE_PEEK)
			all = append(all, used[2])
		}
		return all
	}
	before := counts()
	if err := n.Reload(context.Background(), more); err != nil {
		t.Fatal(err)
	}
	if after := counts(); !reflect.DeepEqual(before, after) {
		t.Fatal("a reload changed the counts of the default domain")
	}
	// A refused reload (it drops "extra", which now holds a record) changes
	// nothing either.
	checkItem(t, n, "extra", "+1", pb.Mode_MODE_CHECK_AND_RECORD)
	if err := n.Reload(context.Background(), base); !errors.Is(err, node.ErrRemovedDomains) {
		t.Fatalf("reload dropping extra: %v, want ErrRemovedDomains", err)
	}
	if after := counts(); !reflect.DeepEqual(before, after) {
		t.Fatal("a refused reload changed the counts")
	}
	if _, used := checkItem(t, n, "extra", "+1", pb.Mode_MODE_PEEK); used[0] != 1 {
		t.Fatalf("extra after the refused reload: used %v, want 1", used)
	}
}

// TestRulesReloadRollsThrough reloads new rules into the nodes of a
// cluster one at a time, under load, as a ConfigMap update reaches the pods
// of a StatefulSet: the ring follows the majority and no count is lost.
func TestRulesReloadRollsThrough(t *testing.T) {
	oldRules := mustParse(t, churnRules)
	newRules := mustParse(t, churnRules+`  - name: extra
    rules:
      - {name: extra-1m, scope: recipient, limit: 3, window: 1m}
`)
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 3, InMemory: true, Rules: oldRules})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newSender(c, 3)
	const population = 400
	rec := &loadRecord{}
	stop := make(chan struct{})
	wg := runLoad(t, s, 32, population, stop, rec)
	waitDecided(t, rec, 2000)
	ms := c.Members()
	for i, want := range []int{2, 2, 3} { // ring sizes after each reload
		m := ms[len(ms)-1-i]
		if err := m.Node.Reload(context.Background(), newRules); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConverged(context.Background(), want); err != nil {
			t.Fatalf("after reloading %s: %v", m.Name, err)
		}
		if err := c.WaitSettled(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s reloaded the new rules: a ring of %d", m.Name, want)
		waitDecided(t, rec, 2000)
	}
	close(stop)
	wg.Wait()
	wantExact(t, oldRules, s, rec, population)
}

// TestSweepSlackKeepsWhatEarlierDecisionsCount: a decision timed a little
// before a sweep (a batch takes its time before it locks its partitions; a
// node whose clock is behind decides after a handoff) still counts the
// sends the sweep could have dropped: the sweep acts as of SweepSlack ago.
func TestSweepSlackKeepsWhatEarlierDecisionsCount(t *testing.T) {
	const rules = `domains:
  - name: default
    rules:
      - {name: day, scope: recipient, limit: 50, window: 24h}
      - {name: same-hour, scope: recipient+content, limit: 5, window: 1h}
`
	clk := &reloadClock{}
	start := int64(1_790_000_000_000)
	clk.ms.Store(start)
	n := openReloadNode(t, rules, clk)
	check := func(mode pb.Mode) []uint32 {
		t.Helper()
		resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+1"},
			Contents: [][]byte{[]byte("your code is 1234")}, Modes: []pb.Mode{mode}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("check: %v %v", err, resp.GetErrors())
		}
		return resp.Used
	}
	check(pb.Mode_MODE_CHECK_AND_RECORD)
	hour := time.Hour.Milliseconds()
	clk.ms.Store(start + hour + 30_000) // the sweep runs 30 s after the send left the window
	if _, err := n.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := n.Stats().Domains[0]; s.Compacted != 0 {
		t.Fatalf("compacted %d records 30 s after their content window, within the slack of %v", s.Compacted, node.SweepSlack)
	}
	clk.ms.Store(start + hour - 1) // a decision timed before the sweep
	if used := check(pb.Mode_MODE_PEEK); used[1] != 1 {
		t.Fatalf("a decision timed before the sweep counts %v; want the content's send counted", used)
	}
	clk.ms.Store(start + hour + node.SweepSlack.Milliseconds())
	if _, err := n.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := n.Stats().Domains[0]; s.Compacted != 1 {
		t.Fatalf("%d records compacted once the slack has passed; want 1", s.Compacted)
	}
	if used := check(pb.Mode_MODE_PEEK); used[0] != 1 || used[1] != 0 {
		t.Fatalf("after the compaction: used %v, want [1 0]", used)
	}
}
