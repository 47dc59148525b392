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
	rc, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	r := &APIReport{Report: &Report{Target: target.Name(), Batch: rc.Batch, Recipients: cfg.Workload.Users,
		Mode: fmt.Sprintf("closed loop, %d callers", rc.Concurrency)}, Algorithm: cfg.Rules.IP.Algorithm.String()}

	ar := &apiRun{cfg: cfg, rc: rc, target: target, tl: newTally(),
		ipSends: make([][]apiSent, rc.Concurrency), userSends: make([][]apiSent, rc.Concurrency)}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range rc.Concurrency {
		wg.Go(func() { ar.work(runCtx, stop, w) })
	}

	ar.tl.clock(runCtx, r.Report, start.Add(max(rc.Warmup, 0)), rc.Duration, stop, rc.Progress, "calls")
	wg.Wait()
	return ar.report(ctx, r)
}

// prepare fills cfg's workload and rules with their defaults, checks them,
// and returns the run settings (cfg.Run filled, a closed loop) once checked.
func (cfg *APIConfig) prepare() (Config, error) {
	cfg.Workload.fill()
	if err := cfg.Workload.validate(); err != nil {
		return Config{}, err
	}
	if cfg.Rules == (APIRules{}) {
		cfg.Rules = DefaultAPIRules(window.FixedWindow)
	}
	if err := cfg.Rules.Validate(); err != nil {
		return Config{}, err
	}
	rc := cfg.Run
	rc.Rate = 0
	rc.fill()
	if err := rc.validate(); err != nil {
		return Config{}, err
	}
	return rc, nil
}

// apiRun is the state one RunAPI shares between its workers, its clock and
// its report. Its workers run concurrently: tl, byIP and byUser are safe for
// concurrent use, and each worker owns its own ipSends[w] and userSends[w].
type apiRun struct {
	cfg                APIConfig
	rc                 Config // cfg.Run, filled
	target             APITarget
	tl                 *tally
	byIP, byUser       atomic.Int64 // measured calls denied by each key
	ipSends, userSends [][]apiSent  // sends each key recorded, per worker, with Audit
}

// callCounts counts the outcomes of the calls of one request.
type callCounts struct {
	admitted, denied, failed, degraded int64
	deniedByIP, deniedByUser           int64 // denied calls by the key that denied them (both for "ip+user")
}

// work is worker w's loop: one request of Batch calls after another, each
// counted once the warm-up is over, until ctx ends. It calls stop once
// MaxOps calls are decided.
func (ar *apiRun) work(ctx context.Context, stop func(), w int) {
	gen := ar.cfg.Workload.generator(w)
	calls := make([]Call, ar.rc.Batch)
	out := make([]CallResult, ar.rc.Batch)
	for ctx.Err() == nil {
		for i := range calls {
			calls[i] = gen.next()
		}
		began := time.Now()
		cctx, cancel := context.WithTimeout(ctx, ar.rc.CallTimeout)
		err := ar.target.CheckCalls(cctx, calls, out)
		cancel()
		lat := time.Since(began)
		measured := ar.tl.measuring.Load() && ctx.Err() == nil
		c := ar.classify(w, calls, out, err)
		if !measured {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if c.admitted+c.denied > 0 {
			ar.tl.mu.Lock()
			ar.tl.latencyLocked(lat.Microseconds())
			ar.tl.mu.Unlock()
		}
		ar.byIP.Add(c.deniedByIP)
		ar.byUser.Add(c.deniedByUser)
		if n := ar.tl.count(c.admitted, c.denied, c.failed, c.degraded); ar.rc.MaxOps > 0 && n >= ar.rc.MaxOps {
			stop()
		}
	}
}

// classify counts the outcomes of worker w's request of calls, which failed
// with err or answered out. With Audit it keeps what each key recorded,
// whatever the call's outcome (the other key may have failed).
func (ar *apiRun) classify(w int, calls []Call, out []CallResult, err error) callCounts {
	var c callCounts
	for i, call := range calls {
		o := &out[i]
		if err != nil {
			c.failed++
			continue
		}
		if ar.rc.Audit && o.IPRecorded {
			ar.ipSends[w] = append(ar.ipSends[w], apiSent{call.ipKey(), o.IPAt})
		}
		if ar.rc.Audit && o.UserRecorded {
			ar.userSends[w] = append(ar.userSends[w], apiSent{call.userKey(), o.UserAt})
		}
		switch {
		case o.Err != nil:
			c.failed++
		case o.Degraded:
			c.degraded++
		case o.Allowed:
			c.admitted++
		default:
			c.denied++
			switch o.DeniedBy {
			case "ip":
				c.deniedByIP++
			case "user":
				c.deniedByUser++
			case "ip+user":
				c.deniedByIP++
				c.deniedByUser++
			}
		}
	}
	return c
}

// report completes r once the workers have stopped: the totals, the denials
// by key, the target's memory (asked even when ctx has ended) and, with
// Audit, each key's audit. It fails when every call failed.
func (ar *apiRun) report(ctx context.Context, r *APIReport) (*APIReport, error) {
	ar.tl.fill(r.Report)
	r.DeniedByIP, r.DeniedByUser = ar.byIP.Load(), ar.byUser.Load()
	r.setMemory(ar.target.Memory(context.WithoutCancel(ctx)))
	if ar.rc.Audit {
		var err error
		if r.IPAudit, err = auditSent(ar.cfg.Rules.IP, ar.ipSends); err != nil {
			return nil, err
		}
		if r.UserAudit, err = auditSent(ar.cfg.Rules.User, ar.userSends); err != nil {
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
