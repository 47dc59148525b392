package node_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/usage"
)

// usageKey names one domain's day in one zone.
type usageKey struct{ zone, date, domain string }

// usageOracle tallies, from Check answers alone, what the nodes' usage
// statistics must hold: per zone, day and domain, the items admitted and
// denied (per denying rule) and the distinct recipients, counting neither
// peeks, failed items nor duplicates answered from request ids.
type usageOracle struct {
	zones            []*time.Location
	admitted, denied map[usageKey]int64
	rules            map[usageKey]map[string]int64
	recipients       map[usageKey]map[string]bool
}

func newUsageOracle(zones ...*time.Location) *usageOracle {
	return &usageOracle{zones: zones, admitted: map[usageKey]int64{}, denied: map[usageKey]int64{},
		rules: map[usageKey]map[string]int64{}, recipients: map[usageKey]map[string]bool{}}
}

func (o *usageOracle) tally(t *testing.T, req *pb.CheckRequest, resp *pb.CheckResponse, nowMs int64) {
	t.Helper()
	skip := map[int]bool{}
	for _, e := range resp.Errors {
		skip[int(e.Index)] = true
	}
	for _, d := range resp.Duplicates {
		skip[int(d)] = true
	}
	for i, rcp := range req.Recipients {
		mode := pb.Mode_MODE_CHECK_AND_RECORD
		if len(req.Modes) == 1 {
			mode = req.Modes[0]
		} else if len(req.Modes) > 1 {
			mode = req.Modes[i]
		}
		if skip[i] || mode == pb.Mode_MODE_PEEK {
			continue
		}
		domain := req.Domains[0]
		if len(req.Domains) > 1 {
			domain = req.Domains[i]
		}
		for _, loc := range o.zones {
			k := usageKey{loc.String(), time.UnixMilli(nowMs).In(loc).Format(time.DateOnly), domain}
			if resp.Admitted[i] {
				o.admitted[k]++
			} else {
				o.denied[k]++
				if o.rules[k] == nil {
					o.rules[k] = map[string]int64{}
				}
				o.rules[k][resp.Domains[domain].Rules[resp.DeniedBy[i]].Name]++
			}
			if o.recipients[k] == nil {
				o.recipients[k] = map[string]bool{}
			}
			o.recipients[k][rcp] = true
		}
	}
}

// compare asks every node for its statistics of days days in both zones,
// sums them, and requires the oracle's counts exactly and its distinct
// recipients within three standard errors.
func (o *usageOracle) compare(t *testing.T, nodes []*node.Node, days uint32) {
	t.Helper()
	got := map[usageKey]usage.DomainDay{}
	for _, zone := range []pb.UsageZone{pb.UsageZone_USAGE_ZONE_UTC, pb.UsageZone_USAGE_ZONE_CONFIGURED} {
		var sum []usage.DomainDay
		for _, n := range nodes {
			resp, err := n.Usage(context.Background(), &pb.UsageRequest{Days: days, Zone: zone})
			if err != nil {
				t.Fatal(err)
			}
			dd, err := node.DecodeUsage(resp)
			if err != nil {
				t.Fatal(err)
			}
			sum = usage.Merge(sum, dd)
		}
		for _, d := range sum {
			got[usageKey{d.Zone, d.Date.String(), d.Domain}] = d
		}
	}
	want := map[usageKey]bool{}
	for k := range o.recipients {
		want[k] = true
	}
	if len(got) != len(want) {
		t.Errorf("statistics have %d domain-days, the oracle %d", len(got), len(want))
	}
	for k := range want {
		d := got[k]
		rs := map[string]int64{}
		for _, r := range d.Rules {
			rs[r.Rule] = r.Denied
		}
		wantRules := o.rules[k]
		if wantRules == nil {
			wantRules = map[string]int64{}
		}
		if d.Admitted != o.admitted[k] || d.Denied != o.denied[k] || !reflect.DeepEqual(rs, wantRules) {
			t.Errorf("%v: admitted %d denied %d by %v; the oracle counts %d, %d by %v", k, d.Admitted, d.Denied, rs, o.admitted[k], o.denied[k], wantRules)
		}
		n := float64(len(o.recipients[k]))
		if d.Recipients == nil || math.Abs(d.Recipients.Estimate()-n) > 3*usage.StdError*n+0.5 {
			t.Errorf("%v: distinct recipients %v, the oracle %v", k, d.Recipients, n)
		}
	}
}

// TestUsageEqualsOracle runs a seeded workload (check-and-record,
// record-only and peek items, retries with request ids) on an in-process
// 3-node cluster across midnight in UTC and in Asia/Kolkata, and requires
// the summed statistics to equal what the oracle counts from the answers;
// then a fourth node joins and takes partitions over, and the sum is still
// exact after more of the workload.
func TestUsageEqualsOracle(t *testing.T) {
	rs, err := rules.Parse("test", []byte(clusterRules))
	if err != nil {
		t.Fatal(err)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	clk := &clusterClock{}
	clk.ns.Store(time.Date(2026, 9, 21, 18, 0, 0, 0, time.UTC).UnixNano()) // Kolkata's midnight at 18:30, UTC's at 24:00
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Rules: rs, Clock: clk, InMemory: true,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1; cfg.StatsZone = kolkata }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	oracle := newUsageOracle(time.UTC, kolkata)
	rng := rand.New(rand.NewPCG(14, 4))
	nextID := uint64(1)
	run := func(batches int) {
		for b := range batches {
			clk.advance(time.Duration(rng.IntN(120_000)) * time.Millisecond) // 400 batches: about 6.7 hours
			req := clusterBatch(rng)
			switch rng.IntN(6) {
			case 0:
				req.Modes = []pb.Mode{pb.Mode_MODE_PEEK}
			case 1: // request ids, and a retry of the batch through another node
				for range req.Recipients {
					req.RequestIds = append(req.RequestIds, nextID)
					nextID++
				}
			}
			members := c.Members()
			tries := 1
			if len(req.RequestIds) > 0 {
				tries = 2
			}
			recorded := 0
			for try := range tries {
				resp, err := members[(b+try)%len(members)].Node.Check(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range resp.Errors {
					if e.Code != uint32(codes.InvalidArgument) { // a cost above a limit of 1
						t.Fatalf("batch %d: item error %v", b, e)
					}
				}
				if try == 0 {
					recorded = len(resp.Errors)
					for _, r := range resp.Recorded {
						if r {
							recorded++
						}
					}
					for _, e := range resp.Errors {
						if resp.Recorded[e.Index] {
							t.Fatalf("batch %d: item %d failed and was recorded: %v", b, e.Index, e)
						}
					}
				} else if len(resp.Duplicates)+len(resp.Errors) != recorded {
					t.Fatalf("batch %d: a retry with request ids answered %d duplicates, want the %d items recorded\n%v\n%v", b, len(resp.Duplicates)+len(resp.Errors), recorded, req, resp)
				}
				oracle.tally(t, req, resp, clk.Now()/1e6)
			}
		}
	}
	run(400)
	nodes := func() []*node.Node {
		var ns []*node.Node
		for _, m := range c.Members() {
			ns = append(ns, m.Node)
		}
		return ns
	}
	oracle.compare(t, nodes(), 2)
	if len(oracle.recipients) != 8 { // 2 domains, 2 days in each zone: the 400 batches cross both midnights
		t.Fatalf("the workload spans %d domain-days, want 8", len(oracle.recipients))
	}

	// A fourth node takes partitions over: the items of those recipients are
	// decided, and counted, there from now on; the sum stays exact.
	before := c.Members()[0].Node.Ring().Counts()
	if _, err := c.Add(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitSettled(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("partitions before %v, after %v", before, c.Members()[0].Node.Ring().Counts())
	run(200)
	oracle.compare(t, nodes(), 2)
	var newcomer int64
	days, _ := c.Members()[3].Node.Usage(ctx, &pb.UsageRequest{Days: 2})
	for _, d := range days.Days {
		newcomer += d.Admitted + d.Denied
	}
	if newcomer == 0 {
		t.Error("the node that joined counted nothing: the test moved no partition")
	}
}

// TestUsageRestart keeps statistics across a restart of a durable node:
// Close saves them, Open restores them, and counting goes on.
func TestUsageRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &clusterClock{}
	clk.ns.Store(time.Date(2026, 9, 21, 12, 0, 0, 0, time.UTC).UnixNano())
	open := func() *node.Node {
		n, err := node.New(node.Config{Clock: clk, DataDir: dir, SweepInterval: -1, SnapshotInterval: -1, SnapshotWALBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := open()
	check := func(n *node.Node, rcps ...string) {
		if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: rcps, ContentHashes: []uint64{7}}); err != nil {
			t.Fatal(err)
		}
	}
	check(n, "a", "a", "a", "b") // the third "a" is denied by content-59s
	want := n.UsageDays()
	if len(want) != 1 || want[0].Admitted != 3 || want[0].Denied != 1 || want[0].Rules[0] != (usage.RuleCount{Rule: "content-59s", Denied: 1}) {
		t.Fatalf("before the restart: %+v", want)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = open()
	if got := n.UsageDays(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the restart: %+v, want %+v", got, want)
	}
	clk.advance(time.Hour)
	check(n, "c")
	got := n.UsageDays()
	if got[0].Admitted != 4 || math.Round(got[0].Recipients.Estimate()) != 3 {
		t.Fatalf("counting after the restart: admitted %d, recipients %.1f; want 4, 3", got[0].Admitted, got[0].Recipients.Estimate())
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	// A damaged file: the node starts, counts afresh, and the file is moved aside, not deleted.
	path := filepath.Join(dir, "usage")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	n = open()
	defer n.Close()
	if got := n.UsageDays(); len(got) != 0 {
		t.Fatalf("after a damaged file: %+v, want nothing", got)
	}
	ents, _ := os.ReadDir(dir)
	var aside []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "usage.corrupt-") {
			aside = append(aside, e.Name())
		}
	}
	if len(aside) != 1 {
		t.Fatalf("files moved aside: %v, want one usage.corrupt-TIME", aside)
	}
	if kept, _ := os.ReadFile(filepath.Join(dir, aside[0])); string(kept) != string(b) {
		t.Fatal("the file moved aside is not the damaged file")
	}
	check(n, "d")
	if got := n.UsageDays(); len(got) != 1 || got[0].Admitted != 1 {
		t.Fatalf("counting afresh: %+v", got)
	}
}

// TestUsageRequest checks the Usage RPC's answers to bad requests and its
// zone choice on a node without a zone.
func TestUsageRequest(t *testing.T) {
	n, err := node.New(node.Config{SweepInterval: -1, StatsDays: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, c := range []struct {
		req  *pb.UsageRequest
		want string
	}{
		{&pb.UsageRequest{Days: 4}, "days: 4, more than the 3 days"},
		{&pb.UsageRequest{Zone: 7}, "zone: unknown zone 7"},
	} {
		if _, err := n.Usage(context.Background(), c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.req, err, c.want)
		}
	}
	resp, err := n.Usage(context.Background(), &pb.UsageRequest{Zone: pb.UsageZone_USAGE_ZONE_CONFIGURED, Days: 3})
	if err != nil || resp.Zone != "UTC" || resp.RetentionDays != 3 {
		t.Fatalf("configured zone without one: %v, %v; want UTC and 3 days", resp, err)
	}
	if _, err := node.New(node.Config{StatsDays: -1}); err == nil || !strings.Contains(err.Error(), "StatsDays -1") {
		t.Errorf("StatsDays -1: %v", err)
	}
}
