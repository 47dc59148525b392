package node_test

// TestRecoverPreviousVersionDataDir opens a data directory written by the
// previous version and checks that every answer it gave is given again.
//
// The fixture, testdata/compat/v2, was made by
// testdata/compat/v2/genfixture_test.go (how to run it is at its top) against
// commit 605fa0e: snapshot format FRQSNAP2, WAL format version 1, 4 shards,
// 64 KiB WAL segments, the default rules and a fake clock. Run 1 recorded
// sends to 20 recipients at T0, T0+2h, T0+3h30m and T0+3h59m10s
// (T0 = 2026-11-20T00:00:00Z), some with contents, costs and request ids, and
// some denied; Close wrote data/0000000000000002.snap. Run 2 reopened the
// directory and recorded sends with request ids at T0+3h59m30s and
// T0+3h59m40s, and the directory was copied while that node was still open
// after its last Check had returned: a crash, leaving the WAL tail
// data/wal/0000000000000002.wal after the snapshot. expect.json holds what the
// previous version answered at T1 = T0+4h, checked there against a naive model
// of the rules: a peek of every recipient without content and with each
// content, and the WAL tail's recorded items with request ids, whose retries
// are duplicates decided at their first time. Ids held only by the snapshot
// are not retried: the previous version drops them when the shard count
// changes.
//
// Never rewrite the fixture with the current version: it stands for
// directories already on disk. A new on-disk format gets a new fixture beside
// it (testdata/compat/v3), made by the version before the change.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

// compatExpect is the format of testdata/compat/*/expect.json.
type compatExpect struct {
	T1UnixNs int64    `json:"t1_unix_ns"`
	Rules    []string `json:"rules"` // the default domain's rules, in response order
	Peeks    []struct {
		Recipient        string   `json:"recipient"`
		Content          string   `json:"content"` // "" means none
		Admitted         bool     `json:"admitted"`
		DeniedBy         int32    `json:"denied_by"`
		RetryAfterMs     int64    `json:"retry_after_ms"`
		Used             []uint32 `json:"used"`
		RuleRetryAfterMs []int64  `json:"rule_retry_after_ms"`
	} `json:"peeks"`
	Duplicates []struct {
		Recipient   string `json:"recipient"`
		Content     string `json:"content"`
		Cost        uint32 `json:"cost"`
		RequestID   uint64 `json:"request_id"`
		DecidedAtMs int64  `json:"decided_at_ms"`
	} `json:"duplicates"`
}

// fixedClock is a clock stopped at one instant, unix ns.
type fixedClock int64

func (c fixedClock) Now() int64 { return int64(c) }

func TestRecoverPreviousVersionDataDir(t *testing.T) {
	const fixture = "testdata/compat/v2"
	b, err := os.ReadFile(filepath.Join(fixture, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp compatExpect
	if err := json.Unmarshal(b, &exp); err != nil {
		t.Fatal(err)
	}
	if len(exp.Peeks) == 0 || len(exp.Duplicates) == 0 {
		t.Fatalf("%s/expect.json: %d peeks and %d duplicates, want some of each", fixture, len(exp.Peeks), len(exp.Duplicates))
	}
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(fixture, "data"))); err != nil {
		t.Fatal(err)
	}
	t.Logf("T1 = %v", time.Unix(0, exp.T1UnixNs).UTC())

	open := func() *node.Node {
		t.Helper()
		n, err := node.New(node.Config{DataDir: dir, Clock: fixedClock(exp.T1UnixNs),
			SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n
	}

	n := open()
	if rs := n.Recovery(); rs.Snapshot == "" || rs.Replayed == 0 {
		t.Errorf("recovered %+v: want a snapshot loaded and WAL sends replayed", rs)
	}
	checkCompat(t, "after recovering the previous version's directory", n, &exp)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = open() // the directory as this version left it
	defer n.Close()
	checkCompat(t, "after reopening", n, &exp)
}

// checkCompat peeks every recipient, retries the WAL tail's request ids, and
// peeks again: the retries must be duplicates that record nothing.
func checkCompat(t *testing.T, when string, n *node.Node, exp *compatExpect) {
	t.Helper()
	ctx := context.Background()

	peek := &pb.CheckRequest{Modes: []pb.Mode{pb.Mode_MODE_PEEK}}
	for _, p := range exp.Peeks {
		peek.Recipients = append(peek.Recipients, p.Recipient)
		peek.Contents = append(peek.Contents, []byte(p.Content))
	}
	checkPeeks := func(what string) {
		t.Helper()
		resp, err := n.Check(ctx, peek)
		if err != nil {
			t.Fatalf("%s, %s: %v", when, what, err)
		}
		if len(resp.Errors) > 0 {
			t.Fatalf("%s, %s: item errors %v", when, what, resp.Errors)
		}
		var rules []string
		for _, r := range resp.Domains[node.DefaultDomain].GetRules() {
			rules = append(rules, r.Name)
		}
		if !slices.Equal(rules, exp.Rules) {
			t.Fatalf("%s, %s: rules %v, want %v", when, what, rules, exp.Rules)
		}
		off := 0
		for i, p := range exp.Peeks {
			k := int(resp.RuleCounts[i])
			if off+k > len(resp.Used) {
				t.Fatalf("%s, %s: rule counts %v overrun %d used entries", when, what, resp.RuleCounts, len(resp.Used))
			}
			used, retry := resp.Used[off:off+k], resp.RuleRetryAfterMs[off:off+k]
			off += k
			if !slices.Equal(used, p.Used) || !slices.Equal(retry, p.RuleRetryAfterMs) ||
				resp.Admitted[i] != p.Admitted || resp.DeniedBy[i] != p.DeniedBy || resp.RetryAfterMs[i] != p.RetryAfterMs {
				t.Errorf("%s, %s: peek %s content %q: admitted %v denied by %d retry after %d ms, used %v, rule retry after %v;\n"+
					"want admitted %v denied by %d retry after %d ms, used %v, rule retry after %v",
					when, what, p.Recipient, p.Content, resp.Admitted[i], resp.DeniedBy[i], resp.RetryAfterMs[i], used, retry,
					p.Admitted, p.DeniedBy, p.RetryAfterMs, p.Used, p.RuleRetryAfterMs)
			}
		}
	}
	checkPeeks("peeks")

	retry := &pb.CheckRequest{}
	var all []uint32
	for i, d := range exp.Duplicates {
		retry.Recipients = append(retry.Recipients, d.Recipient)
		retry.Contents = append(retry.Contents, []byte(d.Content))
		retry.Costs = append(retry.Costs, d.Cost)
		retry.RequestIds = append(retry.RequestIds, d.RequestID)
		all = append(all, uint32(i))
	}
	resp, err := n.Check(ctx, retry)
	if err != nil {
		t.Fatalf("%s, retries: %v", when, err)
	}
	if len(resp.Errors) > 0 {
		t.Fatalf("%s, retries: item errors %v", when, resp.Errors)
	}
	if !slices.Equal(resp.Duplicates, all) {
		t.Errorf("%s, retries: duplicates %v, want every item %v", when, resp.Duplicates, all)
	}
	for i, d := range exp.Duplicates {
		if !resp.Admitted[i] || resp.DecidedAtMs[i] != d.DecidedAtMs {
			t.Errorf("%s, retry of %s request id %d: admitted %v decided at %d ms, want admitted, decided at %d ms (the first time)",
				when, d.Recipient, d.RequestID, resp.Admitted[i], resp.DecidedAtMs[i], d.DecidedAtMs)
		}
	}
	checkPeeks("peeks after the retries")
}
