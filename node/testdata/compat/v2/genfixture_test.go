// This file made node/testdata/compat/v2 (data/ and expect.json), the data
// directory of the previous version that node/compat_test.go recovers. It is
// kept here for reference only: it builds against the previous version
// (commit 605fa0e, snapshot format FRQSNAP2, WAL format version 1), not
// against the current one. To make the fixture again, in a checkout of that
// commit:
//
//	cp <this file> node/genfixture_test.go
//	FREQRING_COMPAT_OUT=/tmp/compat-v2 go test -run TestGenFixture -count=1 ./node
//	cp -r /tmp/compat-v2/data /tmp/compat-v2/expect.json <repo>/node/testdata/compat/v2/
//
// It uses only the public API. Run 1 (4 shards) records sends at T0, T0+2h,
// T0+3h30m and T0+3h59m10s (T0 = 2026-11-20T00:00:00Z) and closes, which
// writes a snapshot. Run 2 reopens the directory at T0+3h59m30s, records
// sends with request ids at T0+3h59m30s and T0+3h59m40s, and the directory is
// copied while the node is still open, after the last Check returned (its WAL
// append fsynced): a crash with a WAL tail after the snapshot. Then a copy of
// the copy is opened at T1 = T0+4h with the default config, every answer is
// checked against a naive model of the default rules, and the answers are
// written to expect.json.
package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

var (
	genT0 = time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	genT1 = genT0.Add(4 * time.Hour)
)

// genClock is a clock that reads what it was set to.
type genClock struct{ ns atomic.Int64 }

func (c *genClock) Now() int64        { return c.ns.Load() }
func (c *genClock) set(t time.Time)   { c.ns.Store(t.UnixNano()) }
func (c *genClock) ms() int64         { return c.ns.Load() / 1e6 }
func genRecipient(i int) string       { return fmt.Sprintf("+861380000%04d", i) }
func genAt(d time.Duration) time.Time { return genT0.Add(d) }

type genSend struct {
	rcp, content string
	cost         uint32 // 0 means 1
	id           uint64
}

type genStep struct {
	at    time.Duration // after T0
	sends []genSend
}

// genSteps returns the Checks of run 1 and of run 2, one per step.
func genSteps() (run1, run2 []genStep) {
	s1 := genStep{at: 0}
	s2 := genStep{at: 2 * time.Hour}
	s3 := genStep{at: 3*time.Hour + 30*time.Minute}
	s4 := genStep{at: 3*time.Hour + 59*time.Minute + 10*time.Second}
	s5 := genStep{at: 3*time.Hour + 59*time.Minute + 30*time.Second}
	s6 := genStep{at: 3*time.Hour + 59*time.Minute + 40*time.Second}
	add := func(s *genStep, n int, g genSend) {
		for range n {
			s.sends = append(s.sends, g)
		}
	}
	for i := range 18 {
		r := genRecipient(i)
		for k := range i % 4 {
			g := genSend{rcp: r}
			if k == 0 && i%5 == 1 {
				g.id = 1000 + uint64(i) // outside the idempotency window at T1
			}
			s1.sends = append(s1.sends, g)
		}
		add(&s2, i%3, genSend{rcp: r, content: "A"})
		nA := min(i%4, 2)
		if i%7 == 0 {
			nA = 3 // the third is denied by content-59s
		}
		add(&s3, nA, genSend{rcp: r, content: "A"})
		if i%2 == 0 {
			add(&s3, 1, genSend{rcp: r, content: "B"})
			g := genSend{rcp: r, content: "B"}
			if i%3 == 0 {
				g.id = 2000 + uint64(i) // in the snapshot
			}
			add(&s4, 1, g)
			add(&s4, 2, genSend{rcp: r, content: "B"}) // the second is denied by content-59s
		}
		if i%5 == 0 {
			add(&s4, 1, genSend{rcp: r, cost: 3, id: 2100 + uint64(i)})
		}
		// The WAL tail.
		if i%2 == 1 {
			add(&s5, 1, genSend{rcp: r, content: "C", id: 3000 + uint64(i)})
			add(&s6, 1, genSend{rcp: r, content: "C", id: 3000 + uint64(i)}) // a retry: duplicate
		}
		if i%4 == 0 {
			add(&s5, 1, genSend{rcp: r, content: "B", id: 3100 + uint64(i)}) // denied by content-59s
		}
		if i%3 == 0 {
			add(&s5, 1, genSend{rcp: r, cost: 2, id: 3200 + uint64(i)})
		}
		if i%6 == 5 {
			add(&s6, 2, genSend{rcp: r, content: "C"}) // the second is denied by content-59s
		}
	}
	// One request id for two recipients is two ids.
	add(&s6, 1, genSend{rcp: genRecipient(1), content: "D", id: 4242})
	add(&s6, 1, genSend{rcp: genRecipient(2), content: "D", id: 4242})
	// Recipient 18 nears recipient-24h: 45 sends in run 1, 4 in the tail; a
	// cost-2 attempt is denied.
	for _, s := range []*genStep{&s1, &s2, &s3} {
		add(s, 1, genSend{rcp: genRecipient(18), cost: 15})
	}
	add(&s5, 1, genSend{rcp: genRecipient(18), cost: 4, id: 5018})
	add(&s5, 1, genSend{rcp: genRecipient(18), cost: 2})
	// Recipient 19 reaches recipient-1m: 12 sends in run 1, 3 in the tail; a
	// 16th is denied.
	add(&s4, 12, genSend{rcp: genRecipient(19)})
	add(&s5, 1, genSend{rcp: genRecipient(19), id: 5019})
	add(&s5, 1, genSend{rcp: genRecipient(19), cost: 2})
	add(&s6, 1, genSend{rcp: genRecipient(19)})
	return []genStep{s1, s2, s3, s4}, []genStep{s5, s6}
}

// genModel decides sends under the default rules the naive way.
type genModel struct {
	sends []genRecorded
}

type genRecorded struct {
	genSend
	at int64 // unix ms
}

var genRules = []struct {
	name    string
	content bool
	limit   int
	window  int64 // ms
	cap     int   // largest limit of the scope: Used saturates there
}{
	{"recipient-1m", false, 15, 60_000, 50},
	{"recipient-24h", false, 50, 86_400_000, 50},
	{"content-59s", true, 2, 59_000, 5},
	{"content-59m", true, 5, 59 * 60_000, 5},
}

const genIDWindow = 60_000 // default IdempotencyWindow, ms

func (m *genModel) used(rcp, content string, now int64) []int {
	u := make([]int, len(genRules))
	for i, r := range genRules {
		if r.content && content == "" {
			continue
		}
		for _, s := range m.sends {
			if s.rcp == rcp && s.at > now-r.window && s.at <= now && (!r.content || s.content == content) {
				u[i] += int(max(s.cost, 1))
			}
		}
		u[i] = min(u[i], r.cap)
	}
	return u
}

func (m *genModel) admits(rcp, content string, cost int, now int64) bool {
	for i, u := range m.used(rcp, content, now) {
		r := genRules[i]
		if (!r.content || content != "") && u+cost > r.limit {
			return false
		}
	}
	return true
}

// dup returns the time of the send that recorded id for rcp, if remembered.
func (m *genModel) dup(rcp string, id uint64, now int64) (int64, bool) {
	if id == 0 {
		return 0, false
	}
	for _, s := range m.sends {
		if s.rcp == rcp && s.id == id && now-s.at < genIDWindow {
			return s.at, true
		}
	}
	return 0, false
}

func genRequest(sends []genSend, mode pb.Mode) *pb.CheckRequest {
	req := &pb.CheckRequest{Modes: []pb.Mode{mode}}
	for _, s := range sends {
		req.Recipients = append(req.Recipients, s.rcp)
		req.Contents = append(req.Contents, []byte(s.content))
		req.Costs = append(req.Costs, max(s.cost, 1))
		req.RequestIds = append(req.RequestIds, s.id)
	}
	return req
}

// genCheck records one step's sends, checking each answer against m.
func genCheck(t *testing.T, n *node.Node, m *genModel, now int64, sends []genSend) {
	t.Helper()
	resp, err := n.Check(context.Background(), genRequest(sends, pb.Mode_MODE_CHECK_AND_RECORD))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Errors) > 0 {
		t.Fatalf("item errors: %v", resp.Errors)
	}
	var wantDups []uint32
	for i, s := range sends {
		if at, ok := m.dup(s.rcp, s.id, now); ok {
			wantDups = append(wantDups, uint32(i))
			if resp.DecidedAtMs[i] != at {
				t.Fatalf("item %d %+v: duplicate decided at %d, want %d", i, s, resp.DecidedAtMs[i], at)
			}
			continue
		}
		want := m.admits(s.rcp, s.content, int(max(s.cost, 1)), now)
		if resp.Recorded[i] != want {
			t.Fatalf("item %d %+v at %d: recorded %v, model says %v", i, s, now, resp.Recorded[i], want)
		}
		if want {
			m.sends = append(m.sends, genRecorded{s, now})
		}
	}
	if !slices.Equal(resp.Duplicates, wantDups) {
		t.Fatalf("duplicates %v, want %v", resp.Duplicates, wantDups)
	}
}

// genExpect is the format of expect.json.
type genExpect struct {
	Comment    string     `json:"comment"`
	T1UnixNs   int64      `json:"t1_unix_ns"`
	Rules      []string   `json:"rules"`
	Peeks      []genPeek  `json:"peeks"`
	Duplicates []genRetry `json:"duplicates"`
}

type genPeek struct {
	Recipient        string   `json:"recipient"`
	Content          string   `json:"content"`
	Admitted         bool     `json:"admitted"`
	DeniedBy         int32    `json:"denied_by"`
	RetryAfterMs     int64    `json:"retry_after_ms"`
	Used             []uint32 `json:"used"`
	RuleRetryAfterMs []int64  `json:"rule_retry_after_ms"`
}

type genRetry struct {
	Recipient   string `json:"recipient"`
	Content     string `json:"content"`
	Cost        uint32 `json:"cost"`
	RequestID   uint64 `json:"request_id"`
	DecidedAtMs int64  `json:"decided_at_ms"`
}

func TestGenFixture(t *testing.T) {
	out := os.Getenv("FREQRING_COMPAT_OUT")
	if out == "" {
		t.Skip("set FREQRING_COMPAT_OUT to the directory to write the fixture to")
	}
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	clk := &genClock{}
	work := t.TempDir()
	cfg := node.Config{DataDir: work, Clock: clk, Shards: 4, SegmentBytes: 64 << 10,
		SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1}
	open := func(cfg node.Config) *node.Node {
		t.Helper()
		n, err := node.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Open(ctx); err != nil {
			t.Fatal(err)
		}
		return n
	}
	m := &genModel{}
	run1, run2 := genSteps()

	clk.set(genT0)
	n1 := open(cfg)
	for _, s := range run1 {
		clk.set(genAt(s.at))
		genCheck(t, n1, m, clk.ms(), s.sends)
	}
	clk.set(genAt(3*time.Hour + 59*time.Minute + 20*time.Second))
	if err := n1.Close(); err != nil { // the final snapshot
		t.Fatal(err)
	}

	clk.set(genAt(run2[0].at))
	tailFrom := clk.ms()
	n2 := open(cfg)
	if rs := n2.Recovery(); rs.Snapshot == "" || rs.Replayed != 0 {
		t.Fatalf("run 2 recovered %+v, want a snapshot and no WAL", rs)
	}
	for _, s := range run2 {
		clk.set(genAt(s.at))
		genCheck(t, n2, m, clk.ms(), s.sends)
	}
	// A crash: the WAL tail was fsynced before the last Check returned.
	data := filepath.Join(out, "data")
	if err := os.CopyFS(data, os.DirFS(work)); err != nil {
		t.Fatal(err)
	}
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}

	// Open a copy as the current version's test will, and write its answers.
	clk.set(genT1)
	now := clk.ms()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.CopyFS(dir, os.DirFS(data)); err != nil {
		t.Fatal(err)
	}
	n := open(node.Config{DataDir: dir, Clock: clk, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
	defer n.Close()
	rs := n.Recovery()
	if rs.Snapshot == "" || rs.Replayed == 0 {
		t.Fatalf("recovered %+v, want a snapshot and a WAL tail", rs)
	}
	t.Logf("recovery: %+v", rs)

	exp := genExpect{
		Comment:  "made by node/testdata/compat/v2/genfixture_test.go against the previous version (commit 605fa0e); answers at t1 after recovering data/",
		T1UnixNs: genT1.UnixNano(),
	}
	var peeks []genSend
	for i := range 20 {
		for _, c := range []string{"", "A", "B", "C", "D"} {
			peeks = append(peeks, genSend{rcp: genRecipient(i), content: c})
		}
	}
	resp, err := n.Check(ctx, genRequest(peeks, pb.Mode_MODE_PEEK))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Domains[node.DefaultDomain].Rules {
		exp.Rules = append(exp.Rules, r.Name)
	}
	for i, r := range genRules {
		if exp.Rules[i] != r.name {
			t.Fatalf("rule %d is %s, want %s", i, exp.Rules[i], r.name)
		}
	}
	off := 0
	for i, p := range peeks {
		k := int(resp.RuleCounts[i])
		gp := genPeek{Recipient: p.rcp, Content: p.content, Admitted: resp.Admitted[i], DeniedBy: resp.DeniedBy[i],
			RetryAfterMs: resp.RetryAfterMs[i], Used: resp.Used[off : off+k], RuleRetryAfterMs: resp.RuleRetryAfterMs[off : off+k]}
		off += k
		var want []uint32
		for _, u := range m.used(p.rcp, p.content, now) {
			want = append(want, uint32(u))
		}
		if !slices.Equal(gp.Used, want) || gp.Admitted != m.admits(p.rcp, p.content, 1, now) {
			t.Fatalf("peek %+v: got %+v, model says used %v admitted %v", p, gp, want, m.admits(p.rcp, p.content, 1, now))
		}
		exp.Peeks = append(exp.Peeks, gp)
	}

	// Retry every request id the WAL tail recorded. Ids held only by the
	// snapshot are not: a store of another shard count drops them (the
	// snapshot keeps ids mixed with their key, by shard).
	var retries []genSend
	for _, s := range m.sends {
		if s.id != 0 && s.at >= tailFrom {
			retries = append(retries, s.genSend)
			exp.Duplicates = append(exp.Duplicates, genRetry{Recipient: s.rcp, Content: s.content, Cost: max(s.cost, 1), RequestID: s.id, DecidedAtMs: s.at})
		}
	}
	genCheck(t, n, m, now, retries)

	var buf bytes.Buffer
	buf.WriteString("{\n")
	line := func(format string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&buf, format, b)
	}
	line("  \"comment\": %s,\n", exp.Comment)
	line("  \"t1_unix_ns\": %s,\n", exp.T1UnixNs)
	line("  \"rules\": %s,\n", exp.Rules)
	buf.WriteString("  \"peeks\": [\n")
	for i, p := range exp.Peeks {
		line("    %s"+map[bool]string{true: "\n", false: ",\n"}[i == len(exp.Peeks)-1], p)
	}
	buf.WriteString("  ],\n  \"duplicates\": [\n")
	for i, d := range exp.Duplicates {
		line("    %s"+map[bool]string{true: "\n", false: ",\n"}[i == len(exp.Duplicates)-1], d)
	}
	buf.WriteString("  ]\n}\n")
	var check genExpect
	if err := json.Unmarshal(buf.Bytes(), &check); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "expect.json"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d peeks, %d duplicates, %d sends recorded", len(exp.Peeks), len(exp.Duplicates), len(m.sends))
}
