package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/window"
)

// TestOverAdmissionsMatchesAudit: the compact oracle counts what Audit does.
func TestOverAdmissionsMatchesAudit(t *testing.T) {
	rules := window.DefaultRules()
	rng := rand.New(rand.NewPCG(3, 3))
	for round := range 20 {
		var compact []sent
		var full []Send
		at := int64(1_790_000_000_000)
		for range 3000 {
			at += int64(rng.IntN(3000))
			s := sent{at: at, recipient: uint32(rng.IntN(5)), template: uint16(rng.IntN(3))}
			compact = append(compact, s)
			full = append(full, Send{Domain: "d", Recipient: RecipientName(s.recipient), Content: TemplateHash(s.template), At: s.at, Checked: true})
		}
		v, err := Audit(map[string][]window.Rule{"d": rules}, full)
		if err != nil {
			t.Fatal(err)
		}
		if got := overAdmissions(rules, compact); got != int64(len(v)) {
			t.Fatalf("round %d: compact oracle %d, Audit %d", round, got, len(v))
		}
		if round == 0 && len(v) == 0 {
			t.Fatal("the random sends break no rule: the test tests nothing")
		}
	}
}

func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server is not installed and CI_REQUIRE_REDIS is set")
		}
		t.Skip("SKIPPED: redis-server is not installed (apt-get install redis-server); .ci/run installs it")
	}
}

// TestRedisTargetsNeverOverAdmit runs the seed's design on a local Redis for a
// second each way and audits what it admitted.
func TestRedisTargetsNeverOverAdmit(t *testing.T) {
	needRedis(t)
	ctx := context.Background()
	srv, err := StartRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	for _, mode := range []RedisMode{RedisMerged, RedisPerRule} {
		target, err := NewRedisTarget(ctx, srv.Addr, mode, window.DefaultRules(), 3)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(ctx, target, Config{
			Workload: Workload{Recipients: 200, Templates: 3}, Concurrency: 8, Batch: 20,
			Warmup: -1, Duration: time.Second, Audit: true,
		})
		target.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.0f decisions/s, %d admitted, %d denied, %d errors, %.0f B/recipient, over-admitted %d of %d",
			r.Target, r.PerSecond, r.Admitted, r.Denied, r.Errors, r.BytesPerRecipient, r.OverAdmissions, r.Audited)
		if r.Errors > 0 || r.Denied == 0 || r.Admitted == 0 {
			t.Fatalf("%s: %+v", r.Target, r)
		}
		if r.OverAdmissions != 0 {
			t.Fatalf("%s over-admitted %d sends", r.Target, r.OverAdmissions)
		}
	}
}

// TestFreqringSmoke is the CI smoke run: a few seconds of the seed's
// workload against a local 3-node cluster through the client, small enough a
// population that the limits bind; the oracle must find no over-admission.
// (Not a speed assertion.)
func TestFreqringSmoke(t *testing.T) {
	ctx := context.Background()
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	target, err := NewFreqringTarget(ctx, lc.Addrs(), "default", 3, client.Config{Timeout: 5 * time.Second}) // not a latency test: under -race on 2 busy cores a replicated batch can take longer than the default 500 ms
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	for _, batch := range []int{100, 1} { // CheckBatch, and coalesced single checks
		r, err := Run(ctx, target, Config{
			// Bounded by count, not time, so that the limits bind however
			// slow a busy machine is: 300 recipients and 3 contents admit at
			// most 6 each a minute (content-59s), so 4,000 decisions must
			// deny some. The duration only caps the run.
			Workload: Workload{Recipients: 300, Templates: 3, Seed: uint64(batch), Offset: uint32(batch) * 10_000}, Concurrency: 16, Batch: batch,
			Warmup: -1, Duration: time.Minute, MaxOps: 4000, Audit: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("batch %d: %.0f decisions/s, %d admitted, %d denied, %d errors, %d degraded, p99 %.2f ms, %.0f B/recipient, over-admitted %d of %d",
			batch, r.PerSecond, r.Admitted, r.Denied, r.Errors, r.Degraded, r.Latency.P99, r.BytesPerRecipient, r.OverAdmissions, r.Audited)
		if r.Errors > 0 || r.Degraded > 0 || r.Admitted == 0 || r.Denied == 0 {
			t.Fatalf("batch %d: %d errors, %d degraded, %d admitted, %d denied", batch, r.Errors, r.Degraded, r.Admitted, r.Denied)
		}
		if r.OverAdmissions != 0 {
			t.Fatalf("batch %d: freqring over-admitted %d sends", batch, r.OverAdmissions)
		}
	}
	if s := target.Client().Stats(); s.Coalesced == 0 {
		t.Fatalf("single checks never shared an RPC: %+v", s)
	}
}

// TestReportsRender: the table shows each target and the ratios, the JSON
// reads back, and the chart is well-formed SVG with a line per target and
// panel.
func TestReportsRender(t *testing.T) {
	mk := func(name string, rate, p99 float64) *Report {
		r := &Report{Target: name, Mode: "closed loop, 4 callers", Batch: 10, PerSecond: rate,
			Latency: Latency{P50: p99 / 4, P99: p99}, BytesPerRecipient: rate / 1000, MemoryRecipients: 1}
		for s := 1; s <= 5; s++ {
			r.Series = append(r.Series, Second{T: s, Decisions: int64(rate), P99: p99})
		}
		for _, q := range []float64{0, 50, 90, 99, 99.9, 100} {
			r.Percentiles = append(r.Percentiles, [2]float64{q, p99 * q / 100})
		}
		return r
	}
	reports := []*Report{mk("freqring", 500_000, 1), mk("redis-merged", 40_000, 12)}
	reports[0].Mode = "open loop, 500000/s"
	reports[0].StartLateness, reports[0].Service = Latency{P50: 0.01, P90: 0.2, P99: 0.4}, Latency{P50: 0.2, P90: 0.5, P99: 0.7}
	var b strings.Builder
	if err := WriteTable(&b, reports); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"freqring", "redis-merged", "freqring vs redis-merged: 12.5× decisions/s, 12.0× lower p99 latency",
		"freqring, open loop, 500000/s: calls started behind their time by p50 / p90 / p99 0.010 / 0.200 / 0.400 ms; from their actual start they took 0.200 / 0.500 / 0.700 ms"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, b.String())
		}
	}
	dir := t.TempDir()
	if err := WriteJSON(filepath.Join(dir, "r.json"), reports); err != nil {
		t.Fatal(err)
	}
	var back []*Report
	if raw, err := os.ReadFile(filepath.Join(dir, "r.json")); err != nil || json.Unmarshal(raw, &back) != nil || len(back) != 2 || back[1].PerSecond != 40_000 {
		t.Fatalf("JSON does not read back: %v %+v", err, back)
	}
	svg := filepath.Join(dir, "r.svg")
	if err := WriteSVG(svg, reports); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(svg)
	d := xml.NewDecoder(bytes.NewReader(raw))
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 3*len(reports) {
		t.Fatalf("%d lines in the chart, want %d (3 panels x %d targets)", lines, 3*len(reports), len(reports))
	}
}
