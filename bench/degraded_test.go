package bench

import (
	"context"
	"testing"
	"time"
)

// halfDegraded answers every odd item with a failure policy's admission, as
// a client whose node is stopping does, and admits the even ones itself.
type halfDegraded struct{}

func (halfDegraded) Name() string { return "half-degraded" }
func (halfDegraded) Check(_ context.Context, items []Item, out []Result) error {
	for i := range items {
		out[i] = Result{Admitted: true, At: time.Now().UnixMilli(), Degraded: i%2 == 1}
	}
	return nil
}
func (halfDegraded) Memory(context.Context) (int64, int64, error) { return 0, 0, nil }
func (halfDegraded) Close() error                                 { return nil }

// TestDegradedAreNotDecisions is issue 12's case 9: answers of the client's
// failure policy are counted as degraded, never as decisions, admissions or
// in decisions/s.
func TestDegradedAreNotDecisions(t *testing.T) {
	r, err := Run(context.Background(), halfDegraded{}, Config{
		Workload: Workload{Recipients: 1000, Templates: 3, Seed: 1}, Concurrency: 2, Batch: 10,
		Warmup: -1, Duration: 5 * time.Second, MaxOps: 5000,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Degraded == 0 || r.Decisions != r.Degraded || r.Admitted != r.Decisions || r.Denied != 0 {
		t.Fatalf("%d decisions (%d admitted, %d denied), %d degraded; want as many decisions, all admitted, as degraded",
			r.Decisions, r.Admitted, r.Denied, r.Degraded)
	}
	if want := float64(r.Decisions) / r.Elapsed.Seconds(); r.PerSecond != want {
		t.Fatalf("%.0f decisions/s, want %.0f (degraded answers excluded)", r.PerSecond, want)
	}
}
