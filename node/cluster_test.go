package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
	"github.com/freqring/freqring/rules"
)

// testNode is one node of an in-process cluster on 127.0.0.1.
type testNode struct {
	*Node
	srv  *grpc.Server
	addr string
	cli  pb.LimiterClient
	conn *grpc.ClientConn
	down bool
}

// testCluster runs nodes in this process, each with its own gRPC server and
// gossip port on 127.0.0.1, sharing one clock.
type testCluster struct {
	t     *testing.T
	clk   *testClock
	nodes []*testNode
}

func newTestCluster(t *testing.T, size int) *testCluster {
	t.Helper()
	clk := &testClock{}
	clk.set(t0)
	c := &testCluster{t: t, clk: clk}
	for i := range size {
		c.add(fmt.Sprintf("node-%d", i))
	}
	c.waitConverged(size, 20*time.Second)
	t.Cleanup(func() {
		for _, n := range c.nodes {
			c.stop(n, false)
		}
	})
	return c
}

// add starts a node that joins the first one.
func (c *testCluster) add(name string) *testNode {
	t := c.t
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gc := &gossip.Config{BindAddr: "127.0.0.1", DeadNodeReclaimTime: 200 * time.Millisecond}
	if len(c.nodes) > 0 {
		gc.Join = []string{c.nodes[0].clus.Load().ms.GossipAddr()}
	}
	rs, _ := rules.Parse("test", []byte(durableRules))
	n, err := New(Config{Rules: rs, Clock: c.clk, Name: name, AdvertiseAddr: lis.Addr().String(), Cluster: gc, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv, hs := n.NewGRPCServer()
	go srv.Serve(lis)
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	setHealth(hs, healthpb.HealthCheckResponse_SERVING)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{Node: n, srv: srv, addr: lis.Addr().String(), cli: pb.NewLimiterClient(conn), conn: conn}
	c.nodes = append(c.nodes, tn)
	return tn
}

// stop takes a node down: gracefully (leave, then stop) or as a crash
// (its server and gossip stop without a word).
func (c *testCluster) stop(n *testNode, graceful bool) {
	if n.down {
		return
	}
	n.down = true
	if graceful {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.Leave(ctx)
		cancel()
		n.srv.GracefulStop()
	} else {
		n.srv.Stop()
	}
	n.Close()
	n.conn.Close()
}

// up returns the nodes that are running.
func (c *testCluster) up() []*testNode {
	var out []*testNode
	for _, n := range c.nodes {
		if !n.down {
			out = append(out, n)
		}
	}
	return out
}

// waitConverged waits, through each node's ring watch, until every running
// node sees the same ring of want members, and returns how long it took.
func (c *testCluster) waitConverged(want int, timeout time.Duration) time.Duration {
	t := c.t
	t.Helper()
	start := time.Now()
	deadline := time.After(timeout)
	for {
		// Subscribe before looking, so that no change slips between the two.
		changed := make(chan struct{}, len(c.nodes))
		var cancels []func()
		for _, n := range c.up() {
			ch, cancel := n.clus.Load().ms.Watch()
			cancels = append(cancels, cancel)
			<-ch // the ring as of now
			go func() {
				if _, ok := <-ch; ok {
					changed <- struct{}{}
				}
			}()
		}
		var epoch uint64
		ok := true
		for _, n := range c.up() {
			r := n.Ring()
			if r.Len() != want || (epoch != 0 && r.Epoch() != epoch) {
				ok = false
				break
			}
			epoch = r.Epoch()
		}
		if ok {
			for _, cancel := range cancels {
				cancel()
			}
			return time.Since(start)
		}
		select {
		case <-changed:
		case <-deadline:
			for _, n := range c.up() {
				t.Logf("%s sees %v", n.cfg.Name, n.Ring().Members())
			}
			t.Fatalf("rings did not converge on %d members in %v", want, timeout)
		}
		for _, cancel := range cancels {
			cancel()
		}
	}
}

func TestClusterAgreesOnOwners(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			c := newTestCluster(t, size)
			rings := make([]*ring.Ring, size)
			for i, n := range c.nodes {
				rings[i] = n.Ring()
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
	c := newTestCluster(t, 3)
	rs, _ := rules.Parse("test", []byte(durableRules))
	ref, err := New(Config{Rules: rs, Clock: c.clk, Name: "reference", SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	rng := rand.New(rand.NewPCG(8, 8))
	for b := range 300 {
		c.clk.advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		req := randomBatch(rng)
		entry := c.nodes[rng.IntN(3)]
		got, err := entry.cli.Check(context.Background(), req)
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
			{"admitted", got.Admitted, want.Admitted}, {"denied_by", got.DeniedBy, want.DeniedBy},
			{"retry_after_ms", got.RetryAfterMs, want.RetryAfterMs}, {"decided_at_ms", got.DecidedAtMs, want.DecidedAtMs},
			{"used", got.Used, want.Used}, {"remaining", got.Remaining, want.Remaining},
			{"rule_retry_after_ms", got.RuleRetryAfterMs, want.RuleRetryAfterMs}, {"rule_counts", got.RuleCounts, want.RuleCounts},
			{"errors", fmt.Sprint(got.Errors), fmt.Sprint(want.Errors)},
		} {
			if !reflect.DeepEqual(f.got, f.want) {
				t.Fatalf("batch %d via %s: %s differs\ncluster %v\n single %v", b, entry.cfg.Name, f.name, f.got, f.want)
			}
		}
	}
	var out, in int64
	for _, n := range c.nodes {
		s := n.Stats()
		out, in = out+s.ForwardedOut, in+s.ForwardedIn
	}
	if out == 0 || in != out {
		t.Fatalf("forwarded out %d, in %d: want some, and every forward received once", out, in)
	}
	// Each recipient's record lives on its owner only: every partition's
	// records are on the node that owns it, and no recipient has more than
	// one per domain.
	r := c.nodes[0].Ring()
	var records int64
	for _, n := range c.nodes {
		s := n.Stats()
		for p, cnt := range s.Partitions {
			if owner := r.PartitionOwner(p); cnt > 0 && owner.Name != n.cfg.Name {
				t.Fatalf("partition %d has %d records on %s, its owner is %s", p, cnt, n.cfg.Name, owner.Name)
			}
			records += cnt
		}
	}
	if most := int64(2 * len(testRecipients)); records == 0 || records > most { // two domains
		t.Fatalf("%d records for %d recipients in 2 domains", records, len(testRecipients))
	}
}

// TestClusterLeaveAndKill: a node leaves, then another is killed, while
// checks keep flowing through the survivors. Every call returns; items fail
// only with a retryable code, only until the ring converges; no item is ever
// forwarded twice.
func TestClusterLeaveAndKill(t *testing.T) {
	c := newTestCluster(t, 4)
	entry := c.nodes[0]
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
			req := randomBatch(rng)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := entry.cli.Check(ctx, req)
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
		c.stop(c.nodes[step.victim], step.graceful)
		c.waitConverged(len(c.up()), 20*time.Second)
		took := time.Since(start)
		close(stop)
		wg.Wait()
		t.Logf("%s: ring converged on %d members in %v", step.name, len(c.up()), took)

		// After convergence: everything is answered, without errors.
		for range 50 {
			resp, err := entry.cli.Check(context.Background(), randomBatch(rand.New(rand.NewPCG(1, 2))))
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
	for _, n := range c.nodes {
		s := n.Stats()
		out, in = out+s.ForwardedOut, in+s.ForwardedIn
	}
	if in > out {
		t.Fatalf("forwarded in %d > out %d: something forwarded twice", in, out)
	}
}
