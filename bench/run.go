package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/freqring/freqring/window"
)

// Config is one bench run. A zero field takes the default in its comment.
type Config struct {
	Workload    Workload
	Rules       []window.Rule // the domain's rules, for the oracle; nil means window.DefaultRules()
	Concurrency int           // workers with a call in flight; 0 means 64
	Batch       int           // items per call; 0 means 100
	Rate        float64       // decisions/s; 0 means a closed loop, > 0 an open loop at this rate
	Warmup      time.Duration // sent but not measured; 0 means 2s, negative none
	Duration    time.Duration // measured; 0 means 10s
	MaxOps      int64         // stop after this many measured decisions; 0 means no bound
	Audit       bool          // keep every admitted send and replay them against Rules
	Progress    io.Writer     // a line a second while it runs; nil means none
	CallTimeout time.Duration // deadline of one call; 0 means 5s
	Stages      *Stages       // nil, or where the target's nodes report their stages' time, for Report.Stages
}

func (c *Config) fill() {
	c.Workload.fill()
	if c.Rules == nil {
		c.Rules = window.DefaultRules()
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Batch == 0 {
		c.Batch = 100
	}
	if c.Warmup == 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 5 * time.Second
	}
}

func (c *Config) validate() error {
	if err := c.Workload.validate(); err != nil {
		return err
	}
	switch {
	case c.Concurrency < 1 || c.Concurrency > 10_000:
		return fmt.Errorf("bench: Concurrency %d out of range [1, 10000]", c.Concurrency)
	case c.Batch < 1 || c.Batch > 10_000:
		return fmt.Errorf("bench: Batch %d out of range [1, 10000]", c.Batch)
	case c.Rate < 0:
		return fmt.Errorf("bench: Rate %g is negative", c.Rate)
	case c.Duration < 0:
		return fmt.Errorf("bench: Duration %v is negative", c.Duration)
	}
	return nil
}

// Latency summarises call latencies in milliseconds.
type Latency struct {
	P50, P90, P99, P999, Max float64
}

// Second is one second of a run, for the progress line and the chart.
type Second struct {
	T         int     // seconds since the measured part began
	Decisions int64   // items decided in this second
	Errors    int64   // items failed
	P50, P99  float64 // call latency, ms
}

// Report is the outcome of one run against one target.
type Report struct {
	Target      string
	Mode        string // "closed loop, 64 callers" or "open loop, 20000/s"
	Batch       int
	Recipients  int
	Decisions   int64 // measured items the limiter decided (admitted or denied); never degraded answers
	Admitted    int64 // by the limiter
	Denied      int64 // by the limiter
	Errors      int64 // items failed (call errors count each of their items)
	Degraded    int64 // items the client's failure policy answered because no node did: neither decisions nor errors
	Elapsed     time.Duration
	PerSecond   float64 // measured decisions per second
	Latency     Latency // per call with at least one item the limiter decided, from the intended send time in an open loop
	Series      []Second
	Percentiles [][2]float64 // (percentile, ms) points of the latency distribution

	// An open loop's Latency in two parts, over the same calls: how far
	// behind its intended time each call started (the load generator's
	// lateness, which a busy process or its timers cause), and the call
	// itself, from its actual start. Zero in a closed loop.
	StartLateness, Service Latency

	// Stages is where the nodes' time went over the measured part, stage by
	// stage, for a target whose nodes report it (Config.Stages): the server's
	// side of Latency.
	Stages []StageLatency `json:",omitempty"`

	MemoryBytes       int64   // server-side bytes held after the run (0 if unknown)
	MemoryRecipients  int64   // recipients they hold
	BytesPerRecipient float64 // MemoryBytes / MemoryRecipients

	Audited        int64 // admitted sends replayed against the rules (warm-up included)
	OverAdmissions int64 // of them, sends that took a window above its limit
	AuditSkipped   string
}

// sent is one admitted send, compact, for the oracle.
type sent struct {
	at        int64
	recipient uint32
	template  uint16
}

// Run drives target with cfg's workload and returns the report. It stops
// after Warmup+Duration, after MaxOps measured decisions, or when ctx ends.
func Run(ctx context.Context, target Target, cfg Config) (*Report, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Report{Target: target.Name(), Batch: cfg.Batch, Recipients: cfg.Workload.Recipients}
	if cfg.Rate > 0 {
		r.Mode = fmt.Sprintf("open loop, %.0f/s", cfg.Rate)
	} else {
		r.Mode = fmt.Sprintf("closed loop, %d callers", cfg.Concurrency)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	lr := newLoadRun(target, cfg)
	lr.tl.stages = cfg.Stages
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		wg.Go(func() { lr.work(runCtx, stop, w) })
	}

	// The clock: switch to measuring after the warm-up, tick each second,
	// stop after the duration.
	lr.tl.clock(runCtx, r, lr.start.Add(max(cfg.Warmup, 0)), cfg.Duration, stop, cfg.Progress, "decisions")
	wg.Wait()
	return lr.report(ctx, r)
}

// loadRun is the state one Run shares between its workers, its clock and
// its report. Its workers run concurrently: tally and nextCall are safe for
// concurrent use, late and service are guarded by tl.mu, and each worker
// owns its own sends[w].
type loadRun struct {
	cfg    Config
	target Target
	tl     *tally
	// late and service split an open loop's latency: how late each call
	// started, and how long it took from its actual start (µs, under tl.mu).
	late, service *hdrhistogram.Histogram
	start         time.Time
	interval      time.Duration // between the scheduled calls of an open loop; 0 in a closed loop
	precise       bool          // sleepUntil yields through the last millisecond before each call
	nextCall      atomic.Int64  // the next slot of an open loop's schedule
	sends         [][]sent      // admitted sends per worker, with Audit
}

// newLoadRun starts the clock of a run of cfg (filled and valid) against
// target.
func newLoadRun(target Target, cfg Config) *loadRun {
	lr := &loadRun{cfg: cfg, target: target, tl: newTally(), late: newHistogram(), service: newHistogram()}
	lr.start = time.Now()
	if cfg.Rate > 0 {
		lr.interval = time.Duration(float64(time.Second) * float64(cfg.Batch) / cfg.Rate)
	}
	// Timers are precise enough when calls are frequent (the process is
	// busy); with sparse calls, yield through the last millisecond before
	// each (a quarter of a core at most, at one call per 5 ms).
	lr.precise = lr.interval >= 5*time.Millisecond
	lr.sends = make([][]sent, cfg.Concurrency)
	return lr
}

// work is worker w's loop: one call of Batch items after another (on the
// schedule in an open loop), each counted once the warm-up is over, until
// ctx ends. It calls stop once MaxOps decisions are counted.
func (lr *loadRun) work(ctx context.Context, stop func(), w int) {
	cfg := &lr.cfg
	gen := cfg.Workload.generator(w)
	items := make([]Item, cfg.Batch)
	out := make([]Result, cfg.Batch)
	for ctx.Err() == nil {
		intended := time.Now()
		if lr.interval > 0 { // open loop: take the next slot of the schedule
			intended = lr.start.Add(time.Duration(lr.nextCall.Add(1)-1) * lr.interval)
			if !sleepUntil(ctx, intended, lr.precise) {
				return
			}
		}
		for i := range items {
			items[i] = gen.next()
		}
		started := time.Now()
		cctx, cancel := context.WithTimeout(ctx, cfg.CallTimeout)
		err := lr.target.Check(cctx, items, out)
		cancel()
		done := time.Now()
		// A call the end of the run cut off is not counted; what it
		// got admitted is still kept for the oracle.
		measured := lr.tl.measuring.Load() && ctx.Err() == nil
		a, d, e, g := lr.classify(w, items, out, err)
		if !measured {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if a+d > 0 { // a call answered by the failure policy alone measures no limiter
			lr.record(intended, started, done)
		}
		if n := lr.tl.count(a, d, e, g); cfg.MaxOps > 0 && n >= cfg.MaxOps {
			stop()
		}
	}
}

// classify counts the outcomes of worker w's call of items, which failed
// with err or answered out: a admitted, d denied, e failed and g answered
// by the client's failure policy. With Audit it keeps the admitted sends.
func (lr *loadRun) classify(w int, items []Item, out []Result, err error) (a, d, e, g int64) {
	for i := range items {
		switch {
		case err != nil || out[i].Err != nil:
			e++
		case out[i].Degraded:
			g++ // the client's failure policy answered, not the limiter: no decision
		case out[i].Admitted:
			a++
			if lr.cfg.Audit {
				lr.sends[w] = append(lr.sends[w], sent{at: out[i].At, recipient: items[i].Recipient, template: items[i].Template})
			}
		default:
			d++
		}
	}
	return a, d, e, g
}

// record adds the latency of one measured call, intended to start at
// intended, started at started and done at done: from its intended start
// and, in an open loop, split into lateness and service.
func (lr *loadRun) record(intended, started, done time.Time) {
	lr.tl.mu.Lock()
	lr.tl.latencyLocked(done.Sub(intended).Microseconds())
	if lr.cfg.Rate > 0 {
		lr.late.RecordValue(max(started.Sub(intended).Microseconds(), 1))
		lr.service.RecordValue(max(done.Sub(started).Microseconds(), 1))
	}
	lr.tl.mu.Unlock()
}

// report completes r once the workers have stopped: the totals, the
// target's memory (asked even when ctx has ended) and, with Audit, the
// oracle's count of over-admissions. It fails when every call failed.
func (lr *loadRun) report(ctx context.Context, r *Report) (*Report, error) {
	lr.tl.fill(r)
	if lr.cfg.Stages != nil {
		r.Stages = lr.cfg.Stages.latencies()
	}
	if lr.cfg.Rate > 0 {
		r.StartLateness, r.Service = latencyOf(lr.late), latencyOf(lr.service)
	}
	r.setMemory(lr.target.Memory(context.WithoutCancel(ctx)))
	if lr.cfg.Audit {
		var all []sent
		for _, s := range lr.sends {
			all = append(all, s...)
		}
		r.Audited = int64(len(all))
		r.OverAdmissions = overAdmissions(lr.cfg.Rules, all)
	} else {
		r.AuditSkipped = "not asked for"
	}
	if r.Decisions == 0 && r.Errors > 0 {
		return r, errors.New("bench: every call failed")
	}
	return r, nil
}

// setMemory sets r's memory figures from a target's Memory answer: b bytes
// held for n recipients (or keys), unless err is set or n is 0.
func (r *Report) setMemory(b, n int64, err error) {
	if err == nil && n > 0 {
		r.MemoryBytes, r.MemoryRecipients, r.BytesPerRecipient = b, n, float64(b)/float64(n)
	}
}

func ms(us int64) float64 { return float64(us) / 1000 }

// latencyOf summarises a histogram of microseconds.
func latencyOf(h *hdrhistogram.Histogram) Latency {
	return Latency{P50: ms(h.ValueAtQuantile(50)), P90: ms(h.ValueAtQuantile(90)),
		P99: ms(h.ValueAtQuantile(99)), P999: ms(h.ValueAtQuantile(99.9)), Max: ms(h.Max())}
}

// sleepUntil waits until t, or returns false if ctx ends first. With
// precise, it sleeps on a timer until about a millisecond before t and
// yields the processor from there: Go timers fire up to a millisecond late on
// an idle process (the runtime waits in epoll with millisecond timeouts), and
// an open loop measures latency from the intended start, so timer lateness
// would show up as the target's latency.
func sleepUntil(ctx context.Context, t time.Time, precise bool) bool {
	slack := 1200 * time.Microsecond
	if !precise {
		slack = 0
	}
	for {
		d := time.Until(t)
		if d <= 0 {
			return ctx.Err() == nil
		}
		if d <= slack {
			runtime.Gosched()
			continue
		}
		timer := time.NewTimer(d - slack)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

// overAdmissions replays admitted sends against the rules by definition: for
// every rule (L, W), the sends of a scope in (t-W, t] up to and including
// each one must number at most L. It is Audit for compact sends, in O(n log n)
// and about 16 bytes a send.
func overAdmissions(rules []window.Rule, sends []sent) int64 {
	var over int64
	check := func(sameScope func(a, b sent) bool, rs []window.Rule) {
		for _, r := range rs {
			w := r.WindowMillis()
			lo := 0
			for j := range sends {
				if j > 0 && !sameScope(sends[j-1], sends[j]) {
					lo = j
				}
				for sends[lo].at <= sends[j].at-w {
					lo++
				}
				if j-lo+1 > r.Limit {
					over++
				}
			}
		}
	}
	var recip, content []window.Rule
	for _, r := range rules {
		if r.Scope == window.ScopeRecipient {
			recip = append(recip, r)
		} else {
			content = append(content, r)
		}
	}
	slices.SortStableFunc(sends, func(a, b sent) int {
		return cmp.Or(cmp.Compare(a.recipient, b.recipient), cmp.Compare(a.at, b.at))
	})
	check(func(a, b sent) bool { return a.recipient == b.recipient }, recip)
	slices.SortStableFunc(sends, func(a, b sent) int {
		return cmp.Or(cmp.Compare(a.recipient, b.recipient), cmp.Compare(a.template, b.template), cmp.Compare(a.at, b.at))
	})
	check(func(a, b sent) bool { return a.recipient == b.recipient && a.template == b.template }, content)
	return over
}
