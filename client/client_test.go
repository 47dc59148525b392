package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// slack is how far past its deadline a call may return: scheduling on a busy
// 2-core machine under -race, not waiting.
const slack = 150 * time.Millisecond

// patient is the Timeout of tests whose calls must all be decided by a node:
// long enough that a machine shared with other jobs does not degrade them.
const patient = 10 * time.Second

func itoa(i int) string { return strconv.Itoa(i) }

// recipient returns the k-th test recipient.
func recipient(k int) string { return fmt.Sprintf("+86%011d", k) }

// clientGoroutines returns the stacks of goroutines this package started and
// that are still running.
//
// A goroutine that has returned from its function (its deferred
// WaitGroup.Done run, so Close has returned) may not have exited yet: the
// stacks are read again, up to 2 s, until none is left, as goleak does.
func clientGoroutines() string {
	var g string
	for wait := time.Millisecond; ; wait *= 2 {
		if g = clientStacks(); g == "" || wait > time.Second {
			return g
		}
		time.Sleep(wait)
	}
}

// clientStacks returns the stacks of the client's goroutines now.
func clientStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, fn := range []string{"client.(*Client).watchLoop", "client.(*Client).refreshLoop", "client.(*batcher).loop", "client.(*batcher).send.func", "client.(*Client).bootstrap.func"} {
			if strings.Contains(g, fn) {
				out = append(out, g)
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

// TestStableRingRoutesDirect: on a stable 3-node ring, every item of Check
// and CheckBatch goes straight to its owner (no node forwards anything), and
// the decisions are the rules'.
func TestStableRingRoutesDirect(t *testing.T) {
	clk := &testClock{}
	clk.ns.Store(t0 * 1e6)
	c := newCluster(t, 3, clk)
	cl := newClient(t, Config{Rand: rand.NewPCG(3, 3), Timeout: patient}, c.nodes[1].addr)
	if got, want := cl.Ring().Epoch(), c.nodes[0].n.Ring().Epoch(); got != want || cl.Ring().Len() != 3 {
		t.Fatalf("client epoch %016x with %d members, nodes %016x", got, cl.Ring().Len(), want)
	}
	ctx := context.Background()

	// The third identical message within 59s is denied by content-59s.
	rcp, body := recipient(1), []byte("your code is 1234")
	owner := cl.Ring().OwnerString(rcp).Name
	for i, want := range []bool{true, true, false} {
		d, err := cl.Check(ctx, Item{Recipient: rcp, Content: body})
		if err != nil || d.Admitted != want || d.Recorded != want || d.Degraded || d.Node != owner || !d.DecidedAt.Equal(time.UnixMilli(t0)) {
			t.Fatalf("send %d: %+v, %v", i, d, err)
		}
		if len(d.Rules) != 4 || d.Rules[2].Name != "content-59s" || d.Rules[2].Limit != 2 || d.Rules[2].Window != 59*time.Second || d.Rules[2].Used != 2 && i > 0 {
			t.Fatalf("send %d rules: %+v", i, d.Rules)
		}
		if !want && (d.DeniedBy != "content-59s" || d.RetryAfter != 59*time.Second || d.Rules[2].RetryAfter != 59*time.Second || d.Rules[0].Used != 2) {
			t.Fatalf("denial: %+v", d)
		}
	}
	// The same in one batch, for another recipient, and a peek after it.
	rcp2 := recipient(2)
	decs, err := cl.CheckBatch(ctx, []Item{{Recipient: rcp2, Content: body}, {Recipient: rcp2, Content: body}, {Recipient: rcp2, Content: body}, {Recipient: rcp2, Mode: Peek}})
	if err != nil || !decs[0].Admitted || !decs[1].Admitted || decs[2].Admitted || decs[2].DeniedBy != "content-59s" || !decs[3].Admitted || decs[3].Recorded || decs[3].Rules[0].Used != 2 {
		t.Fatalf("batch: %+v, %v", decs, err)
	}

	// Load: single checks from 8 goroutines and batches of 50.
	var wg sync.WaitGroup
	var degraded, failed atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for k := range 100 {
				d, err := cl.Check(ctx, Item{Recipient: recipient(1000 + w*1000 + k), Content: body})
				if err != nil || !d.Admitted {
					failed.Add(1)
				}
				if d.Degraded {
					degraded.Add(1)
				}
			}
		})
	}
	for b := range 20 {
		items := make([]Item, 50)
		for i := range items {
			items[i] = Item{Recipient: recipient(100_000 + b*50 + i), Cost: 1 + i%3}
		}
		decs, err := cl.CheckBatch(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range decs {
			if !d.Admitted || d.Degraded || d.Node != cl.Ring().OwnerString(items[i].Recipient).Name || d.Rules[0].Used != items[i].Cost {
				t.Fatalf("batch %d item %d: %+v", b, i, d)
			}
		}
	}
	wg.Wait()
	if degraded.Load() != 0 || failed.Load() != 0 {
		t.Fatalf("%d degraded, %d failed or denied", degraded.Load(), failed.Load())
	}
	var checks int64
	for _, n := range c.nodes {
		s := n.n.Stats()
		checks += s.Checks
		if s.ForwardedOut != 0 || s.ForwardedIn != 0 {
			t.Fatalf("%s forwarded %d out, %d in: the client routed an item to a node that does not own it", n.name, s.ForwardedOut, s.ForwardedIn)
		}
	}
	s := cl.Stats()
	if checks != s.Items || s.Items != 3+4+800+1000 || s.Retries != 0 || s.Degraded != 0 || s.RingRefreshes != 0 {
		t.Fatalf("nodes decided %d items; client stats %+v", checks, s)
	}
	t.Logf("client stats %+v", s)
}

// load runs Check and CheckBatch calls from several goroutines until stop,
// and records each call's duration and outcome, and whether it started after
// the client had the cluster's final ring (after).
type load struct {
	cl    *Client
	after atomic.Bool

	mu        sync.Mutex // guards the fields below
	waiters   []waiter
	calls     int
	slowest   time.Duration
	degraded  int // items
	afterBad  int // items degraded or failed in calls started after
	afterSeen int // items in calls started after
	errs      []error
}

// waiter is closed once cond holds (checked after every call, under mu).
type waiter struct {
	cond func(*load) bool
	ch   chan struct{}
}

// when returns a channel closed once cond holds.
func (l *load) when(cond func(*load) bool) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := waiter{cond, make(chan struct{})}
	l.waiters = append(l.waiters, w)
	return w.ch
}

func (l *load) run(stop <-chan struct{}, workers int, seed uint64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				after := l.after.Load()
				n := 1
				if w%4 == 3 {
					n = 20
				}
				items := make([]Item, n)
				for i := range items {
					items[i] = Item{Recipient: recipient(rng.IntN(1_000_000)), ContentHash: uint64(rng.IntN(16) + 1)}
				}
				start := time.Now()
				var decs []Decision
				var err error
				if n == 1 {
					var d Decision
					d, err = l.cl.Check(context.Background(), items[0])
					decs = []Decision{d}
				} else {
					decs, err = l.cl.CheckBatch(context.Background(), items)
				}
				took := time.Since(start)
				l.mu.Lock()
				l.calls++
				l.slowest = max(l.slowest, took)
				if err != nil {
					l.errs = append(l.errs, err)
				}
				for _, d := range decs {
					if d.Degraded {
						l.degraded++
					}
					if after {
						l.afterSeen++
						if d.Degraded || err != nil {
							l.afterBad++
						}
					}
				}
				l.waiters = slices.DeleteFunc(l.waiters, func(w waiter) bool {
					if w.cond(l) {
						close(w.ch)
						return true
					}
					return false
				})
				l.mu.Unlock()
			}
		})
	}
	return &wg
}

// await waits for ch, 20 seconds at most.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestFollowsJoinAndLeave: when a node joins and when one leaves, the client
// takes the nodes' new ring, routes new traffic to the new owners directly,
// and closes the connection of the member that left.
func TestFollowsJoinAndLeave(t *testing.T) {
	c := newCluster(t, 3, nil)
	cl := newClient(t, Config{Timeout: patient}, c.nodes[0].addr)
	traffic := func(step string, base int) {
		t.Helper()
		before := c.forwardedOut()
		nodes := map[string]int{}
		for b := range 10 {
			items := make([]Item, 40)
			for i := range items {
				items[i] = Item{Recipient: recipient(base + b*40 + i)}
			}
			decs, err := cl.CheckBatch(context.Background(), items)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range decs {
				if d.Degraded || !d.Admitted {
					t.Fatalf("%s: %+v", step, d)
				}
				nodes[d.Node]++
			}
			d, err := cl.Check(context.Background(), Item{Recipient: recipient(base + 10_000 + b)})
			if err != nil || d.Degraded {
				t.Fatalf("%s: %+v, %v", step, d, err)
			}
		}
		after := c.forwardedOut()
		for name, n := range after {
			if n != before[name] {
				t.Fatalf("%s: %s forwarded %d items of new traffic", step, name, n-before[name])
			}
		}
		t.Logf("%s: items per node %v", step, nodes)
		if len(nodes) != len(c.up()) {
			t.Fatalf("%s: items went to %v, want every one of %d members", step, nodes, len(c.up()))
		}
	}
	traffic("3 members", 0)

	c.add("n3")
	epoch := c.waitConverged(4)
	waitClientEpoch(t, cl, epoch)
	traffic("after n3 joined", 100_000)

	gone := c.byName("n1")
	c.leave(gone)
	epoch = c.waitConverged(3)
	waitClientEpoch(t, cl, epoch)
	traffic("after n1 left", 200_000)
	cl.mu.Lock()
	_, open := cl.peers[gone.addr]
	cl.mu.Unlock()
	if open {
		t.Fatalf("the connection to %s (%s) is still open after it left the ring", gone.name, gone.addr)
	}
	// With no traffic between a change and waitClientEpoch, the watch alone
	// brought each ring.
	if s := cl.Stats(); s.RingChanges < 3 || s.RingRefreshes != 0 {
		t.Fatalf("stats %+v: want at least 3 ring changes, all from the watch", s)
	}
}

// TestKillUnderLoad: a node crashes, the one the client's ring watch is on,
// while calls flow. No call takes longer than its deadline; items of the
// dead node are answered by the policy until the ring converges, and every
// call started after the client has the new ring is decided by a node.
func TestKillUnderLoad(t *testing.T) {
	c := newCluster(t, 3, nil)
	const timeout = time.Second // calls after convergence must not degrade on a busy machine
	cl := newClient(t, Config{Timeout: timeout}, c.addrs()...)
	l := &load{cl: cl}
	warm := l.when(func(l *load) bool { return l.calls >= 200 })
	stop := make(chan struct{})
	wg := l.run(stop, 8, 1)

	// Kill the node the ring watch is on, once some load has gone through.
	await(t, warm, "200 calls")
	watched := cl.watching.Load()
	if watched == nil {
		t.Fatal("the client watches no node")
	}
	var victim *tnode
	for _, n := range c.nodes {
		if n.addr == *watched {
			victim = n
		}
	}
	start := time.Now()
	c.kill(victim)
	epoch := c.waitConverged(2)
	converged := time.Since(start)
	waitClientEpoch(t, cl, epoch)
	enough := l.when(func(l *load) bool { return l.afterSeen >= 2000 })
	l.after.Store(true)
	followed := time.Since(start)
	await(t, enough, "2000 items after convergence")
	close(stop)
	wg.Wait()

	s := cl.Stats()
	t.Logf("killed %s; nodes converged after %v, the client after %v; %d calls, slowest %v, %d items degraded; client stats %+v",
		victim.name, converged, followed, l.calls, l.slowest, l.degraded, s)
	if len(l.errs) > 0 {
		t.Fatalf("%d calls failed, first: %v", len(l.errs), l.errs[0])
	}
	if l.slowest > timeout+slack {
		t.Fatalf("slowest call took %v, deadline %v", l.slowest, timeout)
	}
	if l.afterBad > 0 {
		t.Fatalf("%d of %d items in calls started after the client converged were not decided by a node", l.afterBad, l.afterSeen)
	}
	if w := cl.watching.Load(); w == nil || *w == victim.addr {
		t.Fatalf("the ring watch is on %v, the dead node was %s", w, victim.addr)
	}
}

// TestAllNodesDown: with no node up, calls answer by the policy (FailOpen
// admits, FailClosed denies, both Degraded) within their deadline, and bad
// items are still the caller's errors.
func TestAllNodesDown(t *testing.T) {
	c := newCluster(t, 2, nil)
	const timeout = 250 * time.Millisecond
	open := newClient(t, Config{Timeout: timeout, FailurePolicy: FailOpen}, c.addrs()...)
	closed := newClient(t, Config{Timeout: timeout, FailurePolicy: FailClosed}, c.addrs()...)
	for _, cl := range []*Client{open, closed} {
		if d, err := cl.Check(context.Background(), Item{Recipient: recipient(1)}); err != nil || d.Degraded {
			t.Fatalf("before: %+v, %v", d, err)
		}
	}
	for _, n := range c.up() {
		c.kill(n)
	}
	for _, tc := range []struct {
		name  string
		cl    *Client
		admit bool
	}{{"FailOpen", open, true}, {"FailClosed", closed, false}} {
		t.Run(tc.name, func(t *testing.T) {
			for k := range 5 {
				start := time.Now()
				d, err := tc.cl.Check(context.Background(), Item{Recipient: recipient(k)})
				if took := time.Since(start); took > timeout+slack {
					t.Fatalf("Check took %v", took)
				}
				if err != nil || !d.Degraded || d.Admitted != tc.admit || d.Recorded {
					t.Fatalf("Check: %+v, %v", d, err)
				}
				start = time.Now()
				decs, err := tc.cl.CheckBatch(context.Background(), []Item{{Recipient: recipient(k)}, {Recipient: recipient(k + 100)}, {Recipient: ""}})
				if took := time.Since(start); took > timeout+slack {
					t.Fatalf("CheckBatch took %v", took)
				}
				var ie ItemErrors
				if !errors.As(err, &ie) || len(ie) != 1 || ie[0].Index != 2 {
					t.Fatalf("CheckBatch error %v", err)
				}
				if !decs[0].Degraded || decs[0].Admitted != tc.admit || !decs[1].Degraded || decs[1].Admitted != tc.admit || decs[2].Degraded {
					t.Fatalf("CheckBatch: %+v", decs)
				}
			}
			// A caller's shorter deadline is kept.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			if d, err := tc.cl.Check(ctx, Item{Recipient: recipient(7)}); err != nil || !d.Degraded || time.Since(start) > 50*time.Millisecond+slack {
				t.Fatalf("Check with a 50ms deadline: %+v, %v, took %v", d, err, time.Since(start))
			}
			if _, err := tc.cl.Check(context.Background(), Item{Recipient: recipient(1), Cost: -3}); err == nil {
				t.Fatal("a bad item got no error")
			}
		})
	}
}

// TestIdempotent: an item sent twice with the same request id, first
// straight to its owner, then through a node that forwards it, and then a
// third time through the client, is recorded once.
func TestIdempotent(t *testing.T) {
	clk := &testClock{}
	clk.ns.Store(t0 * 1e6)
	c := newCluster(t, 3, clk)
	cl := newClient(t, Config{Timeout: patient}, c.addrs()...)
	ctx := context.Background()
	rcp := recipient(42)
	owner := cl.Ring().OwnerString(rcp).Name
	var entry *tnode
	for _, n := range c.nodes {
		if n.name != owner {
			entry = n
			break
		}
	}
	const id = 0x5eed
	item := Item{Recipient: rcp, Content: []byte("hello"), RequestID: id}
	first, err := cl.Check(ctx, item)
	if err != nil || !first.Admitted || !first.Recorded || first.Node != owner {
		t.Fatalf("first: %+v, %v", first, err)
	}
	// The same item through a node that does not own it.
	clk.advance(time.Second)
	conn := dial(t, entry.addr)
	defer conn.Close()
	resp, err := pb.NewLimiterClient(conn).Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Contents: [][]byte{[]byte("hello")}, RequestIds: []uint64{id}})
	if err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] || !reflect.DeepEqual(resp.Duplicates, []uint32{0}) || resp.DecidedAtMs[0] != first.DecidedAt.UnixMilli() {
		t.Fatalf("forwarded repeat: %v %v", resp, err)
	}
	if got := c.forwardedOut()[entry.name]; got != 1 {
		t.Fatalf("%s forwarded %d items, want 1", entry.name, got)
	}
	// And once more straight to the owner.
	again, err := cl.Check(ctx, item)
	if err != nil || !again.Admitted || !again.Recorded || !again.Duplicate || first.Duplicate || !again.DecidedAt.Equal(first.DecidedAt) {
		t.Fatalf("repeat: %+v, %v; first %+v", again, err, first)
	}
	if s := cl.Stats(); s.Duplicates != 1 {
		t.Fatalf("stats %+v: want 1 duplicate", s)
	}
	peek, err := cl.Check(ctx, Item{Recipient: rcp, Content: []byte("hello"), Mode: Peek})
	if err != nil || peek.Rules[0].Used != 1 || peek.Rules[2].Used != 1 {
		t.Fatalf("after three sends of one id: %+v, %v; want used 1", peek.Rules, err)
	}
}

// TestCoalescing: concurrent single Checks to one node share RPCs, and each
// caller gets its own item's decision; with the default (no delay, 2 RPCs in
// flight) and with a delay.
func TestCoalescing(t *testing.T) {
	for _, delay := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(fmt.Sprint("delay=", delay), func(t *testing.T) { testCoalescing(t, delay) })
	}
}

func testCoalescing(t *testing.T, delay time.Duration) {
	clk := &testClock{}
	clk.ns.Store(t0 * 1e6)
	c := newCluster(t, 1, clk)
	cl := newClient(t, Config{MaxDelay: delay, Timeout: patient}, c.addrs()...)
	const recipients, sends = 67, 3 // 201 calls: each recipient gets one message 3 times
	type result struct {
		k int
		d Decision
	}
	results := make(chan result, recipients*sends)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range recipients {
		for range sends {
			wg.Go(func() {
				<-start
				d, err := cl.Check(context.Background(), Item{Recipient: recipient(k), Content: []byte("same")})
				if err != nil {
					t.Error(err)
				}
				results <- result{k, d}
			})
		}
	}
	before := cl.Stats()
	close(start)
	wg.Wait()
	close(results)
	admitted := make([]int, recipients)
	for r := range results {
		if r.d.Degraded || r.d.Node != "n0" {
			t.Fatalf("recipient %d: %+v", r.k, r.d)
		}
		if r.d.Admitted {
			admitted[r.k]++
		} else if r.d.DeniedBy != "content-59s" {
			t.Fatalf("recipient %d denied by %q", r.k, r.d.DeniedBy)
		}
	}
	for k, n := range admitted {
		if n != 2 {
			t.Fatalf("recipient %d: %d of 3 identical messages admitted, want 2", k, n)
		}
	}
	s := cl.Stats()
	rpcs, coalesced := s.RPCs-before.RPCs, s.Coalesced-before.Coalesced
	t.Logf("%d calls in %d RPCs, %d items coalesced", recipients*sends, rpcs, coalesced)
	if rpcs > recipients*sends/10 || coalesced < recipients*sends*9/10 {
		t.Fatalf("%d calls took %d RPCs (%d items coalesced): want far fewer RPCs", recipients*sends, rpcs, coalesced)
	}
}

// TestBadInput: bad items are the caller's errors, named by field, with
// INVALID_ARGUMENT, whether the client or the node finds them; they are not
// degraded, and the other items of a batch are decided.
func TestBadInput(t *testing.T) {
	c := newCluster(t, 1, nil)
	cl := newClient(t, Config{Timeout: patient}, c.addrs()...)
	ctx := context.Background()
	_, err := cl.Check(ctx, Item{Recipient: ""})
	var ie *ItemError
	if !errors.As(err, &ie) || ie.Code != codes.InvalidArgument || ie.Index != 0 || !strings.Contains(ie.Message, "Recipient") {
		t.Fatalf("empty recipient: %v", err)
	}
	_, err = cl.Check(ctx, Item{Recipient: "a", Domain: "nope"})
	if !errors.As(err, &ie) || ie.Code != codes.InvalidArgument || !strings.Contains(ie.Message, `domains[0]: unknown domain "nope"`) {
		t.Fatalf("unknown domain: %v", err)
	}
	items := []Item{{Recipient: "ok-1"}, {Recipient: ""}, {Recipient: "x", Domain: "nope"}, {Recipient: "y", Cost: 16}, {Recipient: "ok-2", Cost: 15}}
	decs, err := cl.CheckBatch(ctx, items)
	var errs ItemErrors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Fatalf("batch: %v", err)
	}
	for i, want := range map[int]string{0: "Recipient: empty recipient", 1: `domains[2]: unknown domain "nope"`, 2: "cost 16"} {
		if e := errs[i]; e.Index != i+1 || e.Code != codes.InvalidArgument || !strings.Contains(e.Message, want) {
			t.Fatalf("error %d: %v, want item %d %q", i, e, i+1, want)
		}
	}
	if !decs[0].Admitted || !decs[4].Admitted || decs[4].Rules[0].Used != 15 || !reflect.DeepEqual(decs[1], Decision{}) || decs[2].Admitted || decs[3].Admitted {
		t.Fatalf("decisions %+v", decs)
	}
	if s := cl.Stats(); s.ItemErrors != 5 || s.Degraded != 0 || s.Retries != 0 {
		t.Fatalf("stats %+v", s)
	}
}
