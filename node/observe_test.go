package node

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

const observeRules = `
domains:
  - name: a
    rules:
      - {name: r1, scope: recipient, limit: 2, window: 1m}
      - {name: r2, scope: recipient, limit: 3, window: 1h}
  - name: b
    rules:
      - {name: q, scope: recipient, limit: 1, window: 1m}
`

// observeRulesReloaded keeps domain a's r1, drops r2, adds r3; b is unchanged.
const observeRulesReloaded = `
domains:
  - name: a
    rules:
      - {name: r3, scope: recipient, limit: 1, window: 1h}
      - {name: r1, scope: recipient, limit: 2, window: 1m}
  - name: b
    rules:
      - {name: q, scope: recipient, limit: 1, window: 1m}
`

// domainCounts is the decision part of a DomainStats.
type domainCounts struct {
	admitted, denied int64
	rules            map[string]int64 // rule -> denied
}

func countsOf(s Stats) map[string]domainCounts {
	m := map[string]domainCounts{}
	for _, d := range s.Domains {
		dc := domainCounts{admitted: d.Admitted, denied: d.Denied, rules: map[string]int64{}}
		for _, r := range d.Rules {
			dc.rules[r.Name] = r.Denied
		}
		m[d.Name] = dc
	}
	return m
}

// TestDecisionCounters runs a known sequence of checks and compares every
// decision counter with the count worked out by hand, across a rebinding of
// the rules (what a reload does) that drops a rule and brings it back.
func TestDecisionCounters(t *testing.T) {
	clk := &fixedClock{ns: t0 * 1e6}
	n, err := New(Config{Clock: clk, Name: "test", Rules: mustParseRules(t, observeRules), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	check := func(req *pb.CheckRequest) *pb.CheckResponse {
		t.Helper()
		resp, err := n.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	x := &pb.CheckRequest{Recipients: []string{"x"}, Domains: []string{"a"}}
	// x: admitted, admitted, denied by r1 (2 a minute).
	check(&pb.CheckRequest{Recipients: []string{"x", "x", "x"}, Domains: []string{"a"}})
	clk.ns += int64(time.Minute)
	check(x) // admitted: r2 holds 3
	clk.ns += int64(time.Minute)
	if resp := check(x); resp.Admitted[0] || resp.DeniedBy[0] != 1 {
		t.Fatalf("x's 5th send: admitted %v denied by %d, want denied by r2 (1)", resp.Admitted[0], resp.DeniedBy[0])
	}
	// y in b: admitted, then its retry is a duplicate (answered as admitted),
	// then y's request id reused in domain a fails AlreadyExists, an unknown domain
	// fails InvalidArgument (twice).
	yb := &pb.CheckRequest{Recipients: []string{"y"}, Domains: []string{"b"}, RequestIds: []uint64{7}}
	check(yb)
	if resp := check(yb); len(resp.Duplicates) != 1 {
		t.Fatalf("retry of y: duplicates %v, want [0]", resp.Duplicates)
	}
	check(&pb.CheckRequest{Recipients: []string{"y"}, Domains: []string{"a"}, RequestIds: []uint64{7}})
	check(&pb.CheckRequest{Recipients: []string{"u", "v"}, Domains: []string{"nope"}})

	want := map[string]domainCounts{
		"a": {admitted: 3, denied: 2, rules: map[string]int64{"r1": 1, "r2": 1}},
		"b": {admitted: 2, denied: 0, rules: map[string]int64{"q": 0}},
	}
	s := n.Stats()
	if got := countsOf(s); !reflect.DeepEqual(got, want) {
		t.Fatalf("counters:\n got %+v\nwant %+v", got, want)
	}
	if wantFailed := map[string]int64{"AlreadyExists": 1, "InvalidArgument": 2}; !reflect.DeepEqual(s.FailedByCode, wantFailed) {
		t.Fatalf("FailedByCode %v, want %v", s.FailedByCode, wantFailed)
	}
	if s.Duplicates != 1 || s.Failed != 3 || s.Admitted != 5 || s.Denied != 2 {
		t.Fatalf("duplicates %d failed %d admitted %d denied %d, want 1 3 5 2", s.Duplicates, s.Failed, s.Admitted, s.Denied)
	}

	// Rebind as a reload does: r1 keeps its count, r3 starts at 0, r2 is
	// not shown; w is denied by r3 at its second send.
	n.view.Store(n.bind(mustParseRules(t, observeRulesReloaded)))
	check(&pb.CheckRequest{Recipients: []string{"w", "w"}, Domains: []string{"a"}})
	want["a"] = domainCounts{admitted: 4, denied: 3, rules: map[string]int64{"r3": 1, "r1": 1}}
	if got := countsOf(n.Stats()); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the reload:\n got %+v\nwant %+v", got, want)
	}
	// Back to the first rules: r2 comes back with its count.
	n.view.Store(n.bind(mustParseRules(t, observeRules)))
	want["a"] = domainCounts{admitted: 4, denied: 3, rules: map[string]int64{"r1": 1, "r2": 1}}
	if got := countsOf(n.Stats()); !reflect.DeepEqual(got, want) {
		t.Fatalf("after reloading the first rules:\n got %+v\nwant %+v", got, want)
	}
}

// TestDecisionCountersMatchAnswers checks the counters against the answers
// themselves over random batches: per domain, admitted and denied items,
// and per rule, the items whose denied_by names it.
func TestDecisionCountersMatchAnswers(t *testing.T) {
	clk := &fixedClock{ns: t0 * 1e6}
	n, err := New(Config{Clock: clk, Name: "test", Rules: mustParseRules(t, observeRules), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	want := map[string]domainCounts{
		"a": {rules: map[string]int64{"r1": 0, "r2": 0}},
		"b": {rules: map[string]int64{"q": 0}},
	}
	ruleNames := map[string][]string{"a": {"r1", "r2"}, "b": {"q"}}
	seed := uint64(1)
	next := func(k uint64) uint64 { seed = seed*6364136223846793005 + 1442695040888963407; return (seed >> 33) % k }
	for range 200 {
		req := &pb.CheckRequest{}
		for range 1 + next(20) {
			req.Recipients = append(req.Recipients, string(rune('a'+next(8))))
			req.Domains = append(req.Domains, []string{"a", "b"}[next(2)])
		}
		resp, err := n.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range req.Domains {
			c := want[d]
			if resp.Admitted[i] {
				c.admitted++
			} else {
				c.denied++
				c.rules[ruleNames[d][resp.DeniedBy[i]]]++
			}
			want[d] = c
		}
		clk.ns += int64(time.Duration(next(20)) * time.Second)
	}
	if got := countsOf(n.Stats()); !reflect.DeepEqual(got, want) {
		t.Fatalf("counters:\n got %+v\nwant %+v", got, want)
	}
}

// recordingObserver records what a node reports.
type recordingObserver struct {
	mu                       sync.Mutex
	checks                   []int // items per call
	fsyncs, snaps, recovered int
	stages                   map[string]int // observations by "call/stage"
}

func (o *recordingObserver) CheckDone(items int, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checks = append(o.checks, items)
}
func (o *recordingObserver) Fsync(time.Duration)    { o.mu.Lock(); o.fsyncs++; o.mu.Unlock() }
func (o *recordingObserver) Snapshot(time.Duration) { o.mu.Lock(); o.snaps++; o.mu.Unlock() }
func (o *recordingObserver) Recovery(time.Duration) { o.mu.Lock(); o.recovered++; o.mu.Unlock() }
func (o *recordingObserver) Stage(c Call, s Stage, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stages == nil {
		o.stages = map[string]int{}
	}
	o.stages[c.String()+"/"+s.String()]++
}

func TestObserverHooks(t *testing.T) {
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, t.TempDir(), clk)
	obs := &recordingObserver{}
	cfg.Observer = obs
	n := openNode(t, cfg)
	if obs.recovered != 1 {
		t.Fatalf("Recovery called %d times by Open, want 1", obs.recovered)
	}
	fsyncsAtOpen := obs.fsyncs
	for _, req := range []*pb.CheckRequest{
		{Recipients: []string{"a", "b", "c"}},
		{Recipients: []string{"d"}},
		{}, // fails whole: reported too
	} {
		n.Check(context.Background(), req)
	}
	if !reflect.DeepEqual(obs.checks, []int{3, 1, 0}) {
		t.Fatalf("CheckDone items %v, want [3 1 0]", obs.checks)
	}
	if obs.fsyncs <= fsyncsAtOpen {
		t.Fatalf("no Fsync reported for two recorded batches under SyncBatch (%d at Open, %d after)", fsyncsAtOpen, obs.fsyncs)
	}
	// Called in process, with no gRPC around it: no queue or respond.
	for _, s := range []string{"check/decode", "check/judge", "check/store", "check/wal_queue", "check/wal_write", "check/wal_fsync", "check/persist"} {
		if obs.stages[s] != 2 {
			t.Errorf("stage %s observed %d times, want 2 (once per check that decided)", s, obs.stages[s])
		}
	}
	if len(obs.stages) != 7 {
		t.Errorf("stages observed: %v, want the 7 of an in-process check", obs.stages)
	}
	if got := n.Stats().WAL.Fsyncs; int64(obs.fsyncs) != got {
		t.Fatalf("Fsync called %d times, WAL counted %d fsyncs", obs.fsyncs, got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if obs.snaps != 1 {
		t.Fatalf("Snapshot called %d times by Close, want 1", obs.snaps)
	}
}

func TestServingFollowsLifecycle(t *testing.T) {
	n, err := New(Config{Name: "test", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if n.Serving() || n.Stats().Serving {
		t.Fatal("serving before Open")
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !n.Serving() || !n.Stats().Serving {
		t.Fatal("not serving after Open")
	}
	n.shuttingDown.Store(true) // what Serve does first when its context ends
	if n.Serving() {
		t.Fatal("serving while shutting down")
	}
	n.Close()
}

func mustParseRules(t *testing.T, src string) *rules.Set {
	t.Helper()
	rs, err := rules.Parse("test", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestForwardFailuresCountedByCode: items whose owner does not answer a
// forward are counted once, at the node that answered them, under the
// code of their error; those decided locally are counted as decisions.
func TestForwardFailuresCountedByCode(t *testing.T) {
	ln := NewLocalNetwork()
	a := startLocal(t, ln, "node-a")
	b := startLocal(t, ln, "node-b", a.clus.Load().ms.GossipAddr())
	poll(t, "two nodes settle", settledTwo(a, b))
	r := a.Ring()
	req := &pb.CheckRequest{}
	onB := 0
	for i := range 40 {
		rcp := fmt.Sprintf("+86152%08d", i)
		key, _ := KeyOf(rcp)
		if r.PartitionOwner(r.PartitionHash(key)).Name == "node-b" {
			onB++
		}
		req.Recipients = append(req.Recipients, rcp)
	}
	if onB == 0 || onB == 40 {
		t.Fatalf("%d of 40 recipients on node-b: want both nodes in the batch", onB)
	}
	ln.Unregister(b.cfg.AdvertiseAddr) // b stays in the ring but does not answer
	defer ln.Register(b.cfg.AdvertiseAddr, b)
	resp, err := a.Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Errors) != onB {
		t.Fatalf("%d item errors, want %d (the items b owns)", len(resp.Errors), onB)
	}
	sa, sb := a.Stats(), b.Stats()
	if want := map[string]int64{"Unavailable": int64(onB)}; !reflect.DeepEqual(sa.FailedByCode, want) {
		t.Fatalf("node-a FailedByCode %v, want %v", sa.FailedByCode, want)
	}
	if len(sb.FailedByCode) != 0 || sb.Checks != 0 {
		t.Fatalf("node-b counted %v failures and %d checks for a call it never received", sb.FailedByCode, sb.Checks)
	}
	if got := sa.Domains[0].Admitted; got != int64(40-onB) {
		t.Fatalf("node-a admitted %d, want %d (the items it owns)", got, 40-onB)
	}
}
