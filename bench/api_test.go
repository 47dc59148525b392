package bench

import (
	"context"
	"testing"
	"time"

	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/window"
)

// testAPIRules are seed 004's two rules scaled down so that a few thousand
// calls over a small population hit the limits and see windows end: 40 and 8
// calls per 2 s (sliding counters of 10 sub-windows of 200 ms; buckets of
// 10 and 3).
func testAPIRules(alg window.Algorithm) APIRules {
	r := DefaultAPIRules(alg)
	r.IP.Limit, r.IP.Window = 40, 2*time.Second
	r.User.Limit, r.User.Window = 8, 2*time.Second
	switch {
	case alg == window.SlidingCounter:
		r.IP.Buckets, r.User.Buckets = 10, 10
	case r.IP.BucketCapacity() > 0:
		r.IP.Capacity, r.User.Capacity = 10, 3 // bursts below the limits
	}
	return r
}

var testAPIWorkload = APIWorkload{Apps: 3, IPs: 20, Users: 30, Interfaces: 3, Zipf: 1.2}

func checkAPIReport(t *testing.T, r *APIReport) {
	t.Helper()
	t.Logf("%s %s batch %d: %.0f calls/s, %d allowed, %d denied (ip %d, user %d), %d errors, %d degraded, p50 %.2f p99 %.2f ms, %.0f B/key; ip: %v; user: %v",
		r.Target, r.Algorithm, r.Batch, r.PerSecond, r.Admitted, r.Denied, r.DeniedByIP, r.DeniedByUser, r.Errors, r.Degraded,
		r.Latency.P50, r.Latency.P99, r.BytesPerRecipient, r.IPAudit, r.UserAudit)
	if r.Errors > 0 || r.Degraded > 0 || r.Admitted == 0 || r.DeniedByIP == 0 || r.DeniedByUser == 0 {
		t.Fatalf("%s: %d errors, %d degraded, %d allowed, %d denied by ip, %d by user: want none, none, and some of each",
			r.Target, r.Errors, r.Degraded, r.Admitted, r.DeniedByIP, r.DeniedByUser)
	}
	if r.OverAdmissions != 0 {
		t.Fatalf("%s over-admitted: ip %v, user %v", r.Target, r.IPAudit, r.UserAudit)
	}
	if r.Algorithm == window.SlidingCounter.String() && r.IPAudit.ExactOverAdmissions+r.UserAudit.ExactOverAdmissions != 0 {
		t.Fatalf("%s: a sliding counter admitted beyond the exact window: ip %v, user %v", r.Target, r.IPAudit, r.UserAudit)
	}
}

func apiRunConfig(batch int) Config {
	// Bounded by count; the duration only caps the run.
	return Config{Concurrency: 8, Batch: batch, Warmup: -1, Duration: time.Minute, MaxOps: 3000, Audit: true, CallTimeout: 10 * time.Second}
}

// TestAPIFreqring runs the seed 004 workload against a local 3-node cluster
// with each kind of algorithm (the three buckets are one meter: gcra stands
// for them), in batches and as single calls; the oracle must find no
// over-admission on either key.
func TestAPIFreqring(t *testing.T) {
	ctx := context.Background()
	for _, alg := range []window.Algorithm{window.FixedWindow, window.SlidingCounter, window.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			rules := testAPIRules(alg)
			rs, err := rules.RuleSet()
			if err != nil {
				t.Fatal(err)
			}
			lc, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Rules: rs})
			if err != nil {
				t.Fatal(err)
			}
			defer lc.Close()
			target, err := NewAPIFreqringTarget(ctx, lc.Addrs(), client.Config{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			for _, tc := range []struct {
				batch  int
				refund bool
			}{{20, false}, {1, false}, {20, true}} {
				target.Refund = tc.refund
				w := testAPIWorkload
				w.Seed = uint64(tc.batch) + 10*uint64(boolInt(tc.refund))
				r, err := RunAPI(ctx, target, APIConfig{Workload: w, Rules: rules, Run: apiRunConfig(tc.batch)})
				if err != nil {
					t.Fatal(err)
				}
				checkAPIReport(t, r)
			}
		})
	}
}

// TestAPIRedis runs the seed 004 workload against seed 004's Redis design
// (fixed hourly counters) and seed 003's (a hash of sub-window counters).
func TestAPIRedis(t *testing.T) {
	needRedis(t)
	ctx := context.Background()
	srv, err := StartRedis(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	for _, alg := range []window.Algorithm{window.FixedWindow, window.SlidingCounter} {
		target, err := NewAPIRedisTarget(ctx, srv.Addr, testAPIRules(alg))
		if err != nil {
			t.Fatal(err)
		}
		r, err := RunAPI(ctx, target, APIConfig{Workload: testAPIWorkload, Rules: testAPIRules(alg), Run: apiRunConfig(20)})
		target.Close()
		if err != nil {
			t.Fatal(err)
		}
		checkAPIReport(t, r)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
