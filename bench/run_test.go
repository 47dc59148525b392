package bench

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// slowTarget admits every item after holding each call for delay.
type slowTarget struct{ delay time.Duration }

func (slowTarget) Name() string { return "slow" }
func (t slowTarget) Check(ctx context.Context, items []Item, out []Result) error {
	time.Sleep(t.delay)
	for i := range out {
		out[i] = Result{Admitted: true}
	}
	return nil
}
func (slowTarget) Memory(context.Context) (int64, int64, error) { return 0, 0, nil }
func (slowTarget) Close() error                                 { return nil }

// TestOpenLoopSplitsLatency: an open loop that its one caller cannot keep
// (a call every millisecond, each taking two) reports each call's latency
// from its intended time as how late it started plus how long it took; a
// closed loop reports neither part. Time is synctest's.
func TestOpenLoopSplitsLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, err := Run(t.Context(), slowTarget{delay: 2 * time.Millisecond}, Config{
			Workload: Workload{Recipients: 10, Templates: 1}, Concurrency: 1, Batch: 1, Rate: 1000,
			Warmup: -1, Duration: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.Service.P50 != 2 || r.Service.Max != 2 {
			t.Errorf("service %+v, want 2 ms for every call", r.Service)
		}
		// Call k is due at k ms and starts at 2k ms: k ms late.
		if r.StartLateness.Max < 400 || r.StartLateness.Max > 1000 {
			t.Errorf("start lateness %+v, want calls up to about 500 ms behind", r.StartLateness)
		}
		if d := r.Latency.Max - (r.StartLateness.Max + r.Service.Max); d < -1 || d > 1 {
			t.Errorf("latency max %.3f ms is not lateness %.3f plus service %.3f", r.Latency.Max, r.StartLateness.Max, r.Service.Max)
		}

		r, err = Run(t.Context(), slowTarget{delay: 2 * time.Millisecond}, Config{
			Workload: Workload{Recipients: 10, Templates: 1}, Concurrency: 1, Batch: 1, Warmup: -1, Duration: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		if r.StartLateness != (Latency{}) || r.Service != (Latency{}) || r.Latency.P50 != 2 {
			t.Errorf("closed loop: lateness %+v, service %+v, latency %+v", r.StartLateness, r.Service, r.Latency)
		}
	})
}
