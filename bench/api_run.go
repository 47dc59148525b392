package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/freqring/freqring/window"
)

// APITarget is a limiter under test with the seed 004 workload.
type APITarget interface {
	Name() string
	// CheckCalls decides calls in order and fills out (len(out) ==
	// len(calls)). An error fails the whole call.
	CheckCalls(ctx context.Context, calls []Call, out []CallResult) error
	// Memory returns the server-side bytes the target holds now and how
	// many keys they hold (0 if the target cannot tell).
	Memory(ctx context.Context) (bytes, keys int64, err error)
	Close() error
}

// CallResult is one call's outcome.
type CallResult struct {
	Allowed  bool   // both keys admitted
	DeniedBy string // "ip", "user" or "ip+user" when denied (the Redis scripts stop at the first)
	// IPRecorded and UserRecorded say whether the call counts on each key
	// now: the oracle replays these. IPAt and UserAt are the decision times,
	// unix ms, as the limiter reported them.
	IPRecorded, UserRecorded bool
	IPAt, UserAt             int64
	Degraded                 bool // a failure policy answered for a key: no decision
	Err                      error
}

// APIConfig is one run of the seed 004 workload.
type APIConfig struct {
	Workload APIWorkload
	Rules    APIRules // the zero value means DefaultAPIRules(window.FixedWindow)
	// Run sets Concurrency, Batch (calls per request), Warmup, Duration,
	// MaxOps (calls), Audit, Progress and CallTimeout as for Run; its
	// Workload, Rules and Rate are not used (the api runner is a closed loop).
	Run Config
}

// APIReport is the outcome of one api run. Its Report counts calls: a
// decision is a call both keys decided, Admitted the allowed calls, and
// PerSecond calls a second (each two checks). Its OverAdmissions are both
// rules' (IPAudit and UserAudit).
type APIReport struct {
	*Report
	Algorithm    string
	DeniedByIP   int64 // calls the (app, ip) key denied
	DeniedByUser int64 // calls the (app, user, interface) key denied
	IPAudit      KeyAudit
	UserAudit    KeyAudit
}

// apiSent is a recorded send, compact, for the oracle.
type apiSent struct {
	key uint64
	at  int64
}

// RunAPI drives target with the seed 004 workload and returns the report.
func RunAPI(ctx context.Context, target APITarget, cfg APIConfig) (*APIReport, error) {
	cfg.Workload.fill()
	if err := cfg.Workload.validate(); err != nil {
		return nil, err
	}
	if cfg.Rules == (APIRules{}) {
		cfg.Rules = DefaultAPIRules(window.FixedWindow)
	}
	if err := cfg.Rules.Validate(); err != nil {
		return nil, err
	}
	rc := cfg.Run
	rc.Rate = 0
	rc.fill()
	if err := rc.validate(); err != nil {
		return nil, err
	}
	r := &APIReport{Report: &Report{Target: target.Name(), Batch: rc.Batch, Recipients: cfg.Workload.Users,
		Mode: fmt.Sprintf("closed loop, %d callers", rc.Concurrency)}, Algorithm: cfg.Rules.IP.Algorithm.String()}

	var (
		measuring                                  atomic.Bool
		decisions, admitted, denied, errs, degrade atomic.Int64
		byIP, byUser                               atomic.Int64
		mu                                         sync.Mutex
		total                                      = hdrhistogram.New(1, 120_000_000, 3)
		second                                     = hdrhistogram.New(1, 120_000_000, 3)
		secErrs                                    atomic.Int64
		ipSends                                    = make([][]apiSent, rc.Concurrency)
		userSends                                  = make([][]apiSent, rc.Concurrency)
	)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range rc.Concurrency {
		wg.Go(func() {
			gen := cfg.Workload.generator(w)
			calls := make([]Call, rc.Batch)
			out := make([]CallResult, rc.Batch)
			for runCtx.Err() == nil {
				for i := range calls {
					calls[i] = gen.next()
				}
				began := time.Now()
				cctx, cancel := context.WithTimeout(runCtx, rc.CallTimeout)
				err := target.CheckCalls(cctx, calls, out)
				cancel()
				lat := time.Since(began)
				measured := measuring.Load() && runCtx.Err() == nil
				var a, d, e, g, bi, bu int64
				for i, c := range calls {
					o := &out[i]
					if err != nil {
						e++
						continue
					}
					// What a key recorded counts for the oracle, whatever
					// the call's outcome (the other key may have failed).
					if rc.Audit && o.IPRecorded {
						ipSends[w] = append(ipSends[w], apiSent{c.ipKey(), o.IPAt})
					}
					if rc.Audit && o.UserRecorded {
						userSends[w] = append(userSends[w], apiSent{c.userKey(), o.UserAt})
					}
					if o.Err != nil {
						e++
						continue
					}
					switch {
					case o.Degraded:
						g++
					case o.Allowed:
						a++
					default:
						d++
						switch o.DeniedBy {
						case "ip":
							bi++
						case "user":
							bu++
						case "ip+user":
							bi++
							bu++
						}
					}
				}
				if !measured {
					if runCtx.Err() != nil {
						return
					}
					continue
				}
				if a+d > 0 {
					us := max(lat.Microseconds(), 1)
					mu.Lock()
					total.RecordValue(us)
					second.RecordValue(us)
					mu.Unlock()
				}
				decisions.Add(a + d)
				admitted.Add(a)
				denied.Add(d)
				byIP.Add(bi)
				byUser.Add(bu)
				errs.Add(e)
				secErrs.Add(e)
				degrade.Add(g)
				if rc.MaxOps > 0 && decisions.Load() >= rc.MaxOps {
					stop()
				}
			}
		})
	}

	if rc.Warmup > 0 {
		select {
		case <-time.After(time.Until(start.Add(rc.Warmup))):
		case <-runCtx.Done():
		}
	}
	measuring.Store(true)
	mStart := time.Now()
	tick := time.NewTicker(time.Second)
	end := time.NewTimer(rc.Duration)
	var last int64
loop:
	for t := 1; ; t++ {
		select {
		case <-runCtx.Done():
			break loop
		case <-end.C:
			stop()
			break loop
		case <-tick.C:
		}
		mu.Lock()
		s := Second{T: t, P50: ms(second.ValueAtQuantile(50)), P99: ms(second.ValueAtQuantile(99))}
		second.Reset()
		mu.Unlock()
		cur := decisions.Load()
		s.Decisions, last = cur-last, cur
		s.Errors = secErrs.Swap(0)
		r.Series = append(r.Series, s)
		if rc.Progress != nil {
			fmt.Fprintf(rc.Progress, "%-16s t=%3ds  %10d calls/s  p99 %7.2f ms  errors %d\n", r.Target, t, s.Decisions, s.P99, s.Errors)
		}
	}
	tick.Stop()
	end.Stop()
	r.Elapsed = time.Since(mStart)
	wg.Wait()

	r.Decisions, r.Admitted, r.Denied = decisions.Load(), admitted.Load(), denied.Load()
	r.DeniedByIP, r.DeniedByUser = byIP.Load(), byUser.Load()
	r.Errors, r.Degraded = errs.Load(), degrade.Load()
	r.PerSecond = float64(r.Decisions) / r.Elapsed.Seconds()
	r.Latency = latencyOf(total)
	for _, q := range []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 100} {
		r.Percentiles = append(r.Percentiles, [2]float64{q, ms(total.ValueAtQuantile(q))})
	}
	if b, n, err := target.Memory(context.WithoutCancel(ctx)); err == nil && n > 0 {
		r.MemoryBytes, r.MemoryRecipients, r.BytesPerRecipient = b, n, float64(b)/float64(n)
	}
	if rc.Audit {
		var err error
		if r.IPAudit, err = auditSent(cfg.Rules.IP, ipSends); err != nil {
			return nil, err
		}
		if r.UserAudit, err = auditSent(cfg.Rules.User, userSends); err != nil {
			return nil, err
		}
		r.Audited = r.IPAudit.Sends + r.UserAudit.Sends
		r.OverAdmissions = r.IPAudit.OverAdmissions + r.UserAudit.OverAdmissions
	} else {
		r.AuditSkipped = "not asked for"
	}
	if r.Decisions == 0 && r.Errors > 0 {
		return r, errors.New("bench: every call failed")
	}
	return r, nil
}

// auditSent is AuditKeys for the workers' compact sends.
func auditSent(r window.Rule, perWorker [][]apiSent) (KeyAudit, error) {
	def, err := definition(r)
	if err != nil {
		return KeyAudit{}, err
	}
	var keys []uint64
	var ats []int64
	for _, ss := range perWorker {
		for _, s := range ss {
			keys = append(keys, s.key)
			ats = append(ats, s.at)
		}
	}
	return auditKeys(keys, ats, r.WindowMillis(), r.Limit, def), nil
}

// WriteAPIJSON writes api reports to path as indented JSON.
func WriteAPIJSON(path string, reports []*APIReport) error {
	b, err := json.MarshalIndent(reports, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteAPITable prints the reports as WriteTable does (a decision is a
// call, of two checks), then each target's denials by key and audit per
// rule, the exact sliding window's count included.
func WriteAPITable(w io.Writer, reports []*APIReport) error {
	rs := make([]*Report, len(reports))
	for i, r := range reports {
		rs[i] = r.Report
	}
	if err := WriteTable(w, rs); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range reports {
		fmt.Fprintf(w, "%s (%s): %.0f checks/s; denied by (app, ip) %d, by (app, user, interface) %d\n",
			r.Target, r.Algorithm, 2*r.PerSecond, r.DeniedByIP, r.DeniedByUser)
		if r.AuditSkipped == "" {
			fmt.Fprintf(w, "  (app, ip):                 %v\n  (app, user, interface):    %v\n", r.IPAudit, r.UserAudit)
		}
	}
	return nil
}
