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
		tl           = newTally()
		byIP, byUser atomic.Int64
		ipSends      = make([][]apiSent, rc.Concurrency)
		userSends    = make([][]apiSent, rc.Concurrency)
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
				measured := tl.measuring.Load() && runCtx.Err() == nil
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
					tl.mu.Lock()
					tl.latencyLocked(lat.Microseconds())
					tl.mu.Unlock()
				}
				byIP.Add(bi)
				byUser.Add(bu)
				if n := tl.count(a, d, e, g); rc.MaxOps > 0 && n >= rc.MaxOps {
					stop()
				}
			}
		})
	}

	tl.clock(runCtx, r.Report, start.Add(max(rc.Warmup, 0)), rc.Duration, stop, rc.Progress, "calls")
	wg.Wait()

	tl.fill(r.Report)
	r.DeniedByIP, r.DeniedByUser = byIP.Load(), byUser.Load()
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
