package docker_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/window"
)

// peekRetry is how long auditForgotten retries the peeks of recipients
// whose items (or calls) fail as UNAVAILABLE: a partition still being
// acquired after the last ring change.
const peekRetry = 10 * time.Second

// exactness is the forgotten-send audit after the last step: for every
// recipient the load used, the sends the load saw admitted within the
// rule's window (the oracle) against the node's Used count of that rule,
// as a peek through the cluster reports it.
//
// The rule is the domain's recipient rule with the longest window
// (recipient-24h of the default rules: 50 in 24 h). Its Used is the number
// of sends recorded for the recipient during the run as long as
//   - the window covers the run (24 h against a few minutes; checked), and
//   - no recipient reaches the rule's limit, beyond which a record keeps
//     only the newest limit sends and further sends are denied. The load
//     cannot reach it: it uses contents (4) distinct contents per recipient,
//     and draws a recipient during 10 s only (load_test.go), in which
//     content-59s admits at most 2 sends of each content: at most 8 sends
//     reach one recipient (and even without the drift content-59m would
//     stop them at 5 per content, 20, in a run shorter than 59 minutes),
//     under the limit of 50. MostAdmitted reports the highest count, and a
//     count at the limit fails the run as a harness error.
type exactness struct {
	Rule                string   `json:"rule"`
	Limit               int      `json:"limit"`
	Window              string   `json:"window"`
	Recipients          int      `json:"recipients"` // used by the load
	Peeked              int      `json:"peeked"`
	Unpeeked            int      `json:"unpeeked"` // peeks that kept failing
	Admitted            int64    `json:"admitted"` // sends the oracle counts within the window, peeked recipients
	Counted             int64    `json:"counted"`  // the nodes' Used, summed
	Forgotten           int64    `json:"forgotten"`
	ForgottenRecipients int      `json:"forgotten_recipients"`
	Beyond              int64    `json:"counted_beyond_admitted"`
	BeyondRecipients    int      `json:"counted_beyond_admitted_recipients"`
	MostAdmitted        int      `json:"most_admitted_to_one_recipient"`
	Examples            []string `json:"forgotten_examples,omitempty"`
	PeekErrors          []string `json:"peek_errors,omitempty"`
	HarnessErrors       []string `json:"harness_errors,omitempty"`
}

// peeked is one recipient's peek answer.
type peeked struct {
	used uint32 // the rule's Used
	at   int64  // decided_at_ms
}

// auditForgotten peeks every recipient the load used, through the nodes the
// load ended on, and compares their counts with the oracle. The load must
// be stopped.
func (h *harness) auditForgotten() *exactness {
	rule, ok := longestRecipientRule(h.rules["default"])
	if !ok {
		h.t.Fatal("harness: the default domain has no recipient rule")
	}
	x := &exactness{Rule: rule.Name, Limit: rule.Limit, Window: rule.Window.String()}
	recips := h.load.usedRecipients()
	x.Recipients = len(recips)
	ts := *h.load.targets.Load()
	if len(ts) == 0 {
		h.t.Fatal("harness: no node to peek through")
	}
	got, errs := peekAll(h.ctx, ts, recips, rule.Name)
	x.PeekErrors = errs
	x.Peeked, x.Unpeeked = len(got), len(recips)-len(got)

	byRecip := map[string][]bench.Send{}
	var first int64
	for _, s := range h.load.admittedSends() {
		byRecip[s.Recipient] = append(byRecip[s.Recipient], s)
		if first == 0 || s.At < first {
			first = s.At
		}
	}
	// Partitions, to name in the examples of forgotten sends.
	var np uint64
	if rr, err := ts[0].cli.Ring(h.ctx, &pb.RingRequest{}); err == nil && rr.Placement != nil {
		np = uint64(rr.Placement.PartitionCount)
	}
	w := rule.WindowMillis()
	for _, r := range recips {
		p, ok := got[r]
		if !ok {
			continue
		}
		if first != 0 && first <= p.at-w {
			x.HarnessErrors = append(x.HarnessErrors, fmt.Sprintf("the run is longer than the window of %s (%v)", rule.Name, rule.Window))
		}
		admitted := 0
		for _, s := range byRecip[r] {
			if s.At > p.at-w && s.At <= p.at {
				admitted += max(s.Cost, 1)
			}
		}
		x.MostAdmitted = max(x.MostAdmitted, admitted)
		x.Admitted += int64(admitted)
		x.Counted += int64(p.used)
		switch d := admitted - int(p.used); {
		case d > 0:
			x.Forgotten += int64(d)
			x.ForgottenRecipients++
			if len(x.Examples) < 10 {
				part := "?"
				if np > 0 {
					part = fmt.Sprint(ring.HashString(r) % np)
				}
				x.Examples = append(x.Examples, fmt.Sprintf("%s (partition %s): admitted %d, counted %d (peeked at %d); admitted at %v", r, part, admitted, p.used, p.at, sendTimes(byRecip[r])))
			}
		case d < 0:
			x.Beyond += int64(-d)
			x.BeyondRecipients++
		}
	}
	if x.MostAdmitted >= rule.Limit {
		x.HarnessErrors = append(x.HarnessErrors, fmt.Sprintf("a recipient was admitted %d sends, not under the limit %d of %s: its Used no longer counts every send", x.MostAdmitted, rule.Limit, rule.Name))
	}
	x.HarnessErrors = slices.Compact(x.HarnessErrors)
	return x
}

// longestRecipientRule returns the recipient-scoped rule with the longest
// window.
func longestRecipientRule(rs []window.Rule) (window.Rule, bool) {
	var best window.Rule
	found := false
	for _, r := range rs {
		if r.Scope == window.ScopeRecipient && (!found || r.Window > best.Window) {
			best, found = r, true
		}
	}
	return best, found
}

func sendTimes(ss []bench.Send) []int64 {
	var out []int64
	for _, s := range ss {
		out = append(out, s.At)
	}
	slices.Sort(out)
	return out
}

// peekAll peeks recipients in batches of batchSize, round-robin over ts as
// the load sends, and returns the Used count of the named rule and the
// decision time per recipient. Items and calls that fail as UNAVAILABLE
// (or calls past their deadline) are tried again for peekRetry; the kinds
// of the errors that remain are returned.
func peekAll(ctx context.Context, ts []target, recips []string, rule string) (map[string]peeked, []string) {
	got := map[string]peeked{}
	pending := slices.Clone(recips)
	deadline := time.Now().Add(peekRetry)
	var next int
	for {
		var retry []string
		final := map[string]int{} // error kind -> items, of errors not retried
		retried := map[string]int{}
		for off := 0; off < len(pending); off += batchSize {
			batch := pending[off:min(off+batchSize, len(pending))]
			tg := ts[next%len(ts)]
			next++
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			resp, err := tg.cli.Check(cctx, &pb.CheckRequest{Recipients: batch, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
			cancel()
			if err != nil {
				kind := fmt.Sprintf("call to %s: %s", tg.name, status.Code(err))
				if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded {
					retry = append(retry, batch...)
					retried[kind] += len(batch)
				} else {
					final[kind+": "+shorten(status.Convert(err).Message())] += len(batch)
				}
				continue
			}
			idx := -1
			if d := resp.Domains["default"]; d != nil {
				idx = slices.IndexFunc(d.Rules, func(r *pb.Rule) bool { return r.Name == rule })
			}
			if idx < 0 || len(resp.RuleCounts) != len(batch) {
				final[fmt.Sprintf("peek via %s: no rule %q in the response, or %d rule counts for %d items", tg.name, rule, len(resp.RuleCounts), len(batch))] += len(batch)
				continue
			}
			failed := map[uint32]*pb.ItemError{}
			for _, e := range resp.Errors {
				failed[e.Index] = e
			}
			at := 0 // offset of item i's per-rule entries
			for i, r := range batch {
				n := int(resp.RuleCounts[i])
				if e := failed[uint32(i)]; e != nil {
					kind := fmt.Sprintf("item via %s: %s: %s", tg.name, codes.Code(e.Code), shorten(e.Message))
					if codes.Code(e.Code) == codes.Unavailable {
						retry = append(retry, r)
						retried[kind]++
					} else {
						final[kind]++
					}
				} else if idx >= n || at+n > len(resp.Used) || i >= len(resp.DecidedAtMs) {
					final[fmt.Sprintf("peek via %s: item without rule %q", tg.name, rule)]++
				} else {
					got[r] = peeked{used: resp.Used[at+idx], at: resp.DecidedAtMs[i]}
				}
				at += n
			}
		}
		if len(retry) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			var out []string
			for k, n := range final {
				out = append(out, fmt.Sprintf("%d× %s", n, k))
			}
			for k, n := range retried {
				out = append(out, fmt.Sprintf("%d× %s (still failing after %v of retries)", n, k, peekRetry))
			}
			slices.Sort(out)
			return got, out
		}
		pending = retry
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// judge fails the run, after the summary, when a step over-admitted beyond
// its bound or a send was forgotten, and shows the evidence.
func (h *harness) judge() {
	t := h.t
	over := false
	for _, r := range h.rows {
		if r.OverAdmit > r.Bound {
			over = true
			t.Errorf("step %q: %d over-admissions (bench.Audit violations), bound %d (by rule, run so far: %v)", r.Step, r.OverAdmit, r.Bound, r.ByRuleRun)
		}
	}
	if over {
		v, err := bench.Audit(h.rules, h.load.admittedSends())
		if err != nil {
			t.Fatal(err)
		}
		slices.SortStableFunc(v, func(a, b bench.Violation) int { return cmp.Compare(a.Send.At, b.Send.At) })
		for _, x := range v[:min(len(v), 20)] {
			t.Logf("    over-admission: %v", x)
		}
	}
	x := h.exact
	if x == nil {
		return
	}
	for _, e := range x.HarnessErrors {
		t.Errorf("harness: %s", e)
	}
	if x.Unpeeked > 0 {
		t.Errorf("%d of %d recipients could not be peeked after the last step, so their sends are not proven remembered: %v", x.Unpeeked, x.Recipients, x.PeekErrors)
	}
	if x.Forgotten > 0 {
		t.Errorf("forgotten: %d admitted sends of %d recipients are missing from the nodes' %s counts (admitted %d, counted %d)", x.Forgotten, x.ForgottenRecipients, x.Rule, x.Admitted, x.Counted)
		for _, e := range x.Examples {
			t.Logf("    forgotten: %s", e)
		}
	}
}
