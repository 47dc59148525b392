package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/rules"
)

// clusterRules are two domains, one with the default rules and one with
// windows of seconds.
const clusterRules = `domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 15, window: 1m}
      - {name: recipient-24h, scope: recipient, limit: 50, window: 24h}
      - {name: content-59s, scope: recipient+content, limit: 2, window: 59s}
      - {name: content-59m, scope: recipient+content, limit: 5, window: 59m}
  - name: fast
    rules:
      - {name: r-3-2s, scope: recipient, limit: 3, window: 2s}
      - {name: c-1-1s, scope: recipient+content, limit: 1, window: 1s}
`

// clusterClock is a settable clock shared by a cluster's nodes, unix ns.
type clusterClock struct{ ns atomic.Int64 }

func (c *clusterClock) Now() int64              { return c.ns.Load() }
func (c *clusterClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

var clusterRecipients = func() []string {
	var r []string
	for i := range 40 {
		r = append(r, fmt.Sprintf("+86138%08d", i))
	}
	return r
}()

// clusterBatch is a random batch over clusterRecipients in one domain.
func clusterBatch(rng *rand.Rand) *pb.CheckRequest {
	req := &pb.CheckRequest{Domains: []string{[]string{"default", "fast"}[rng.IntN(2)]}}
	for range 1 + rng.IntN(20) {
		req.Recipients = append(req.Recipients, clusterRecipients[rng.IntN(len(clusterRecipients))])
		req.ContentHashes = append(req.ContentHashes, uint64(rng.IntN(3)))
		cost := uint32(1)
		if rng.IntN(10) == 0 {
			cost = 2
		}
		req.Costs = append(req.Costs, cost)
	}
	if rng.IntN(10) == 0 {
		req.Modes = []pb.Mode{pb.Mode_MODE_RECORD_ONLY}
	}
	return req
}

// startCluster starts size nodes on clusterRules and a shared clock, over
// loopback gRPC or (inMemory) a node.LocalNetwork, stopped at the end of the
// test.
func startCluster(t *testing.T, size int, inMemory bool) (*nodetest.Cluster, *clusterClock) {
	t.Helper()
	rs, err := rules.Parse("test", []byte(clusterRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clusterClock{}
	clk.ns.Store(1_790_000_000_000 * 1e6)
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: size, Rules: rs, Clock: clk, InMemory: inMemory,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c, clk
}

func TestClusterAgreesOnOwners(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			c, _ := startCluster(t, size, false)
			rings := make([]*ring.Ring, size)
			for i, m := range c.Members() {
				rings[i] = m.Node.Ring()
			}
			for k := range 100_000 {
				key := fmt.Sprintf("+86%011d", k)
				want := rings[0].OwnerString(key)
				for i := 1; i < size; i++ {
					if got := rings[i].OwnerString(key); got != want {
						t.Fatalf("%s: node-0 says %v, node-%d says %v", key, want, i, got)
					}
				}
			}
			counts := rings[0].Counts()
			t.Logf("partitions per member: %v", counts)
			if len(counts) != size {
				t.Fatalf("%d members own partitions, want %d", len(counts), size)
			}
		})
	}
}

// TestClusterDecidesAsOneNode sends random batches to random nodes of a
// 3-node cluster and the same batches to one standalone node: the decisions
// must be identical, and each recipient's record must live on exactly one
// node, its owner.
func TestClusterDecidesAsOneNode(t *testing.T) {
	for _, inMemory := range []bool{false, true} {
		t.Run(map[bool]string{false: "grpc", true: "in-memory"}[inMemory], func(t *testing.T) {
			testClusterDecidesAsOneNode(t, inMemory)
		})
	}
}

func testClusterDecidesAsOneNode(t *testing.T, inMemory bool) {
	c, clk := startCluster(t, 3, inMemory)
	rs, _ := rules.Parse("test", []byte(clusterRules))
	ref, err := node.New(node.Config{Rules: rs, Clock: clk, Name: "reference", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rng := rand.New(rand.NewPCG(8, 8))
	for b := range 300 {
		clk.advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		req := clusterBatch(rng)
		entry := c.Members()[rng.IntN(3)]
		got, err := entry.Node.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			name      string
			got, want any
		}{
			{"errors", fmt.Sprint(got.Errors), fmt.Sprint(want.Errors)}, // first: a failed item is also "not admitted"
			{"admitted", got.Admitted, want.Admitted}, {"denied_by", got.DeniedBy, want.DeniedBy},
			{"retry_after_ms", got.RetryAfterMs, want.RetryAfterMs}, {"decided_at_ms", got.DecidedAtMs, want.DecidedAtMs},
			{"used", got.Used, want.Used}, {"remaining", got.Remaining, want.Remaining},
			{"rule_retry_after_ms", got.RuleRetryAfterMs, want.RuleRetryAfterMs}, {"rule_counts", got.RuleCounts, want.RuleCounts},
		} {
			if !reflect.DeepEqual(f.got, f.want) {
				t.Fatalf("batch %d via %s: %s differs\ncluster %v\n single %v", b, entry.Name, f.name, f.got, f.want)
			}
		}
	}
	var out, in int64
	for _, m := range c.Members() {
		s := m.Node.Stats()
		out, in = out+s.ForwardedOut, in+s.ForwardedIn
	}
	if out == 0 || in != out {
		t.Fatalf("forwarded out %d, in %d: want some, and every forward received once", out, in)
	}
	// Each recipient's record lives on its owner and its backup only, and no
	// recipient has more than one per domain on its owner.
	r := c.Members()[0].Node.Ring()
	var records int64
	for _, m := range c.Members() {
		s := m.Node.Stats()
		for p, cnt := range s.Partitions {
			owner := r.PartitionOwner(p)
			backup, _ := r.PartitionReplica(p)
			if cnt > 0 && owner.Name != m.Name && backup.Name != m.Name {
				t.Fatalf("partition %d has %d records on %s, its owner is %s and its backup %s", p, cnt, m.Name, owner.Name, backup.Name)
			}
			if owner.Name == m.Name {
				records += cnt
			}
		}
	}
	if most := int64(2 * len(clusterRecipients)); records == 0 || records > most { // two domains
		t.Fatalf("%d records for %d recipients in 2 domains", records, len(clusterRecipients))
	}
}

// TestClusterLeaveAndKill: a node leaves, then another is killed, while
// checks keep flowing through the survivors. Every call returns; items fail
// only with a retryable code, only until the ring converges; no item is ever
// forwarded twice.
func TestClusterLeaveAndKill(t *testing.T) {
	c, _ := startCluster(t, 4, false)
	entry := c.Members()[0].Node
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	var calls, items int
	load := func(stop <-chan struct{}, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 1))
		for {
			select {
			case <-stop:
				return
			default:
			}
			req := clusterBatch(rng)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := entry.Check(ctx, req)
			cancel()
			mu.Lock()
			calls++
			if err != nil {
				codesSeen[codes.Code(99)]++ // a failed call: must not happen
			} else {
				items += len(req.Recipients)
				for _, e := range resp.Errors {
					codesSeen[codes.Code(e.Code)]++
				}
			}
			mu.Unlock()
		}
	}
	for _, step := range []struct {
		name     string
		victim   int
		graceful bool
	}{{"leave", 3, true}, {"kill", 2, false}} {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() { load(stop, uint64(w)) })
		}
		start := time.Now()
		victim := c.Members()[step.victim]
		var err error
		if step.graceful {
			err = c.Stop(victim)
		} else {
			err = c.Kill(victim)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WaitConverged(context.Background(), len(c.Up())); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		close(stop)
		wg.Wait()
		t.Logf("%s: ring converged on %d members in %v", step.name, len(c.Up()), took)
		// A converged ring may still be moving partitions (a check waits
		// MoveWait for one, then fails as retryable): wait until it is done.
		if err := c.WaitSettled(context.Background()); err != nil {
			t.Fatal(err)
		}

		// After the moves: everything is answered, without errors.
		for range 50 {
			resp, err := entry.Check(context.Background(), clusterBatch(rand.New(rand.NewPCG(1, 2))))
			if err != nil || len(resp.Errors) > 0 {
				t.Fatalf("%s: after convergence: %v %v", step.name, err, resp.GetErrors())
			}
		}
	}
	t.Logf("%d calls, %d items, item error codes during the changes: %v", calls, items, codesSeen)
	for code, n := range codesSeen {
		// InvalidArgument: randomBatch asks for cost 2 against limit 1 at times.
		if code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.InvalidArgument {
			t.Fatalf("%d items failed with %v: want only retryable failures", n, code)
		}
	}
	var out, in int64
	for _, m := range c.Members() {
		s := m.Node.Stats()
		out, in = out+s.ForwardedOut, in+s.ForwardedIn
	}
	if in > out {
		t.Fatalf("forwarded in %d > out %d: something forwarded twice", in, out)
	}
}

func TestRetryIsRecordedOnceThroughAForwardingNode(t *testing.T) {
	c, _ := startCluster(t, 3, false)
	ms := c.Members()
	// A recipient that node-0 does not own.
	var rcp string
	for i := 0; ; i++ {
		rcp = "+86" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if ms[0].Node.Ring().OwnerString(rcp).Name != ms[0].Name {
			break
		}
	}
	req := &pb.CheckRequest{Recipients: []string{rcp}, RequestIds: []uint64{777}}
	check := func(n *node.Node) *pb.CheckResponse {
		t.Helper()
		resp, err := n.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	check(ms[0].Node)
	if again := check(ms[0].Node); !reflect.DeepEqual(again.Duplicates, []uint32{0}) {
		t.Fatalf("retry through %s: duplicates %v", ms[0].Name, again.Duplicates)
	}
	// And sent once more to the owner directly.
	owner := ms[0].Node.Ring().OwnerString(rcp).Name
	for _, m := range ms {
		if m.Name == owner {
			if resp := check(m.Node); !reflect.DeepEqual(resp.Duplicates, []uint32{0}) {
				t.Fatalf("retry at the owner: duplicates %v", resp.GetDuplicates())
			}
		}
	}
	peek, err := ms[1].Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || peek.Used[0] != 1 {
		t.Fatalf("three sends of one item counted %v times (%v)", peek.GetUsed(), err)
	}
}
