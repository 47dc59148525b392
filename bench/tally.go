package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// tally counts what a run measures: its callers add each measured call,
// its clock reads the current second once a second, and fill copies the
// totals into the report. Safe for concurrent use.
type tally struct {
	measuring                                            atomic.Bool // the warm-up is over
	stages                                               *Stages     // nil, or measured with the calls
	decisions, admitted, denied, errs, degraded, secErrs atomic.Int64

	mu sync.Mutex // guards total and second, and any histogram a run keeps beside them
	// Latency in µs, of the whole measured time and of the current second.
	total, second *hdrhistogram.Histogram
}

func newHistogram() *hdrhistogram.Histogram { return hdrhistogram.New(1, 120_000_000, 3) }

func newTally() *tally { return &tally{total: newHistogram(), second: newHistogram()} }

// count adds one measured call's items: a admitted, d denied, e failed and
// g answered by the client's failure policy. It returns the decisions
// counted so far.
func (t *tally) count(a, d, e, g int64) int64 {
	t.admitted.Add(a)
	t.denied.Add(d)
	t.errs.Add(e)
	t.secErrs.Add(e)
	t.degraded.Add(g)
	return t.decisions.Add(a + d)
}

// latencyLocked adds one call's latency in µs (at least 1) to the run's and
// the second's histograms. The caller holds t.mu.
func (t *tally) latencyLocked(us int64) {
	us = max(us, 1)
	t.total.RecordValue(us)
	t.second.RecordValue(us)
}

// clock runs a run's clock into r: it waits until measureAt (or ctx's end),
// starts measuring, then appends a Second to r.Series once a second, with a
// progress line to progress (nil: none) counting unit per second, until ctx
// ends or d has passed, when it calls stop. It sets r.Elapsed.
func (t *tally) clock(ctx context.Context, r *Report, measureAt time.Time, d time.Duration, stop func(), progress io.Writer, unit string) {
	if wait := time.Until(measureAt); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	t.measuring.Store(true)
	if t.stages != nil {
		t.stages.measure(true)
		defer t.stages.measure(false)
	}
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	end := time.NewTimer(d)
	defer end.Stop()
	var last int64
	for sec := 1; ; sec++ {
		select {
		case <-ctx.Done():
			r.Elapsed = time.Since(start)
			return
		case <-end.C:
			stop()
			r.Elapsed = time.Since(start)
			return
		case <-tick.C:
		}
		t.mu.Lock()
		s := Second{T: sec, P50: ms(t.second.ValueAtQuantile(50)), P99: ms(t.second.ValueAtQuantile(99))}
		t.second.Reset()
		t.mu.Unlock()
		cur := t.decisions.Load()
		s.Decisions, last = cur-last, cur
		s.Errors = t.secErrs.Swap(0)
		r.Series = append(r.Series, s)
		if progress != nil {
			fmt.Fprintf(progress, "%-16s t=%3ds  %10d %s/s  p99 %7.2f ms  errors %d\n", r.Target, sec, s.Decisions, unit, s.P99, s.Errors)
		}
	}
}

// fill copies the run's totals and latency into r, once its callers have
// stopped and clock has set r.Elapsed.
func (t *tally) fill(r *Report) {
	r.Decisions, r.Admitted, r.Denied = t.decisions.Load(), t.admitted.Load(), t.denied.Load()
	r.Errors, r.Degraded = t.errs.Load(), t.degraded.Load()
	r.PerSecond = float64(r.Decisions) / r.Elapsed.Seconds()
	r.Latency = latencyOf(t.total)
	for _, q := range []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 100} {
		r.Percentiles = append(r.Percentiles, [2]float64{q, ms(t.total.ValueAtQuantile(q))})
	}
}
