package node_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// tenPerHour is one domain with one rule: 10 sends per recipient per hour.
const tenPerHour = `domains:
  - name: default
    rules:
      - {name: ten-per-hour, scope: recipient, limit: 10, window: 1h}
`

// moveCluster starts size nodes on rules, with the system clock.
func moveCluster(t *testing.T, size int, rulesYAML string, inMemory bool, dataDir string) *nodetest.Cluster {
	t.Helper()
	rs, err := rules.Parse("test", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: size, Rules: rs, InMemory: inMemory, DataDir: dataDir,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1; cfg.ForgetDeadAfter = time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sender sends through random running nodes of a cluster as a client
// would: an item that fails as retryable is sent again, with the same
// request id, until it is decided.
type sender struct {
	c      *nodetest.Cluster
	mu     sync.Mutex // guards rng
	rng    *rand.Rand
	nextID atomic.Uint64
}

func newSender(c *nodetest.Cluster, seed uint64) *sender {
	return &sender{c: c, rng: rand.New(rand.NewPCG(seed, 7))}
}

// pick returns a random running member. While none runs (a test stops the
// last one before it restarts it), it waits for one until deadline, then
// fails the test.
func (s *sender) pick(t testing.TB, deadline time.Time) *nodetest.Member {
	for {
		if up := s.c.Up(); len(up) > 0 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return up[s.rng.IntN(len(up))]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no member running")
		}
		time.Sleep(time.Millisecond) // a member is being restarted
	}
}

// send checks-and-records one send to rcp and reports whether it was
// admitted. It fails the test on a non-retryable error or after 20 s.
func (s *sender) send(t testing.TB, rcp string, mode pb.Mode) (admitted bool, used uint32) {
	id := s.nextID.Add(1)
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 0; ; attempt++ {
		m := s.pick(t, deadline)
		req := &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{mode}}
		if mode != pb.Mode_MODE_PEEK {
			req.RequestIds = []uint64{id}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := m.Node.Check(ctx, req)
		cancel()
		retry := err != nil
		if err == nil && len(resp.Errors) > 0 {
			if codes.Code(resp.Errors[0].Code) != codes.Unavailable && codes.Code(resp.Errors[0].Code) != codes.DeadlineExceeded {
				t.Fatalf("%s via %s: %v", rcp, m.Name, resp.Errors[0])
			}
			retry = true
		}
		if !retry {
			return resp.Admitted[0], resp.Used[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no decision in 20 s (%d attempts): %v %v", rcp, attempt, err, resp.GetErrors())
		}
	}
}

// TestRollingRestartKeepsCounts spends 4 of 10 per recipient, restarts
// every node in turn (a graceful stop, then a start with an empty memory),
// and then gets exactly 6 more per recipient: history moved with ownership.
func TestRollingRestartKeepsCounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inMemory bool
		durable  bool
	}{{"in-memory", true, false}, {"grpc", false, false}, {"grpc-wal", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := ""
			if tc.durable {
				dir = t.TempDir()
			}
			c := moveCluster(t, 3, tenPerHour, tc.inMemory, dir)
			s := newSender(c, 1)
			var rcps []string
			for i := range 300 {
				rcps = append(rcps, fmt.Sprintf("+86139%08d", i))
			}
			for _, r := range rcps {
				for k := range 4 {
					if ok, _ := s.send(t, r, pb.Mode_MODE_CHECK_AND_RECORD); !ok {
						t.Fatalf("%s: send %d of the first 4 denied", r, k+1)
					}
				}
			}
			for _, m := range c.Members() {
				if err := c.Stop(m); err != nil {
					t.Fatal(err)
				}
				if err := c.Restart(context.Background(), m); err != nil {
					t.Fatal(err)
				}
				if err := c.WaitConverged(context.Background(), 3); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range rcps {
				if _, used := s.send(t, r, pb.Mode_MODE_PEEK); used != 4 {
					t.Fatalf("%s: after the rolling restart the cluster counts %d sends, want 4", r, used)
				}
				admitted := 0
				for range 10 {
					if ok, _ := s.send(t, r, pb.Mode_MODE_CHECK_AND_RECORD); ok {
						admitted++
					}
				}
				if admitted != 6 {
					t.Fatalf("%s: %d more admitted after the rolling restart, want 6", r, admitted)
				}
			}
		})
	}
}

// loadRecord is what the load saw: every admitted send, for the oracle.
type loadRecord struct {
	mu      sync.Mutex // guards sends
	sends   []bench.Send
	decided atomic.Int64
}

// runLoad sends single checks from workers goroutines over population
// recipients (contents 0 to 3) until stop is closed, retrying retryable
// failures with the same request id. If the test ends first (it failed),
// its cleanup stops the workers and waits for them, so that none reports
// to a finished test.
func runLoad(t *testing.T, s *sender, workers, population int, stop <-chan struct{}, rec *loadRecord) *sync.WaitGroup {
	var wg sync.WaitGroup
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit); wg.Wait() })
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for {
				select {
				case <-stop:
					return
				case <-quit:
					return
				default:
				}
				rcp := fmt.Sprintf("+86137%08d", rng.IntN(population))
				content := uint64(rng.IntN(4))
				admitted, at := s.sendContent(t, rcp, content)
				rec.decided.Add(1)
				if admitted {
					rec.mu.Lock()
					rec.sends = append(rec.sends, bench.Send{Domain: "default", Recipient: rcp, Content: content, Cost: 1, At: at, Checked: true})
					rec.mu.Unlock()
				}
			}
		})
	}
	return &wg
}

// waitDecided waits until the load has decided k more items.
func waitDecided(t *testing.T, rec *loadRecord, k int64) {
	t.Helper()
	target := rec.decided.Load() + k
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for rec.decided.Load() < target {
		if time.Now().After(deadline) {
			t.Fatalf("the load decided %d items, want %d", rec.decided.Load(), target)
		}
		<-tick.C
	}
}

// sendContent is send with a content hash; it returns the decision time.
func (s *sender) sendContent(t testing.TB, rcp string, content uint64) (bool, int64) {
	id := s.nextID.Add(1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := s.pick(t, deadline)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := m.Node.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{content}, RequestIds: []uint64{id}})
		cancel()
		if err == nil && len(resp.Errors) == 0 {
			return resp.Admitted[0], resp.DecidedAtMs[0]
		}
		if err == nil && codes.Code(resp.Errors[0].Code) != codes.Unavailable && codes.Code(resp.Errors[0].Code) != codes.DeadlineExceeded {
			t.Errorf("%s via %s: %v", rcp, m.Name, resp.Errors[0])
			return false, 0
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: no decision in 20 s: %v %v", rcp, err, resp.GetErrors())
			return false, 0
		}
	}
}

// TestMembershipChangesUnderLoad runs 64 concurrent senders against a
// cluster while a node joins, one leaves, one is killed and comes back.
// The oracle must find no over-admission, and a final peek of every
// recipient must count every send the cluster admitted.
func TestMembershipChangesUnderLoad(t *testing.T) {
	for _, inMemory := range []bool{true, false} {
		t.Run(map[bool]string{false: "grpc", true: "in-memory"}[inMemory], func(t *testing.T) {
			testMembershipChangesUnderLoad(t, inMemory)
		})
	}
}

// churnRules keep denying and admitting through a run of seconds; the last
// rule only counts.
const churnRules = `domains:
  - name: default
    rules:
      - {name: r-5-1s, scope: recipient, limit: 5, window: 1s}
      - {name: c-2-500ms, scope: recipient+content, limit: 2, window: 500ms}
      - {name: count-1h, scope: recipient, limit: 1000, window: 1h}
`

func testMembershipChangesUnderLoad(t *testing.T, inMemory bool) {
	rs, err := rules.Parse("churn", []byte(churnRules))
	if err != nil {
		t.Fatal(err)
	}
	c := moveCluster(t, 3, churnRules, inMemory, "")
	s := newSender(c, 2)
	const population = 400
	rec := &loadRecord{}
	stop := make(chan struct{})
	wg := runLoad(t, s, 64, population, stop, rec)
	waitDecided(t, rec, 2000)
	churn(t, c, rec, 2000, false)
	close(stop)
	wg.Wait()

	wantExact(t, rs, s, rec, population)
	// Over gRPC, replication goes on ReplicateStreams; in memory, as unary calls.
	var calls, unary int64
	for _, m := range c.Up() {
		st := m.Node.Stats()
		calls, unary = calls+st.ReplicateCalls, unary+st.ReplicateUnaryCalls
	}
	if want := map[bool]int64{true: calls, false: 0}[inMemory]; calls == 0 || unary != want {
		t.Errorf("%d Replicate calls, %d of them unary: want some, %d unary", calls, unary, want)
	}
}

// churn takes c, 3 nodes under load rec, through a join, a leave, a kill and
// the restart of the killed node, waiting after each for the rings to
// converge (and, with settle, for every partition to open) and for the load
// to decide k more items.
func churn(t *testing.T, c *nodetest.Cluster, rec *loadRecord, k int64, settle bool) {
	t.Helper()
	steps := []struct {
		name string
		do   func() error
		size int
	}{
		{"join", func() error { _, err := c.Add(context.Background()); return err }, 4},
		{"leave", func() error { return c.Stop(c.Up()[1]) }, 3},
		{"kill", func() error { return c.Kill(c.Up()[0]) }, 2},
		{"restart", func() error {
			for _, m := range c.Members() {
				if m.Down() && m.Name == "node-0" {
					return c.Restart(context.Background(), m)
				}
			}
			return fmt.Errorf("node-0 is not down")
		}, 3},
	}
	for _, st := range steps {
		start := time.Now()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if err := c.WaitConverged(context.Background(), st.size); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		t.Logf("%s (from unix ms %d): rings converged on %d members in %v", st.name, start.UnixMilli(), st.size, time.Since(start))
		if settle {
			waitSettled(t, c)
		}
		waitDecided(t, rec, k)
	}
}

// wantExact audits the load (auditLoad), logs the counts, and fails the test
// on any over-admission or forgotten send.
func wantExact(t *testing.T, rs *rules.Set, s *sender, rec *loadRecord, population int) {
	t.Helper()
	v, forgotten, extra := auditLoad(t, rs, s, rec, population)
	t.Logf("%d decided, %d admitted, %d over-admitted, %d forgotten, %d counted beyond the admitted (recorded, then failed)",
		rec.decided.Load(), len(rec.sends), len(v), forgotten, extra)
	if len(v) > 0 {
		t.Errorf("%d over-admissions, first: %v", len(v), v[0])
	}
	if forgotten > 0 {
		t.Errorf("%d admitted sends forgotten", forgotten)
	}
}

// auditLoad replays the load's admitted sends through bench.Audit and peeks
// at every recipient of the population: it returns the over-admissions, the
// admitted sends the cluster no longer counts (forgotten) and the sends it
// counts beyond those admitted (recorded, then failed). churnRules' count-1h
// (rule 2) counts every send of a run.
func auditLoad(t *testing.T, rs *rules.Set, s *sender, rec *loadRecord, population int) (v []bench.Violation, forgotten, extra int) {
	t.Helper()
	return auditLoadWith(t, rs, s.c, func(t testing.TB, rcp string, i int) uint32 {
		_, used := s.sendRule(t, rcp, i)
		return used
	}, rec, population)
}

// auditLoadWith is auditLoad with peek, which returns rule i's count for a
// recipient of cluster c.
func auditLoadWith(t *testing.T, rs *rules.Set, c *nodetest.Cluster, peek func(t testing.TB, rcp string, i int) uint32, rec *loadRecord, population int) (v []bench.Violation, forgotten, extra int) {
	t.Helper()
	v, err := bench.Audit(map[string][]window.Rule{"default": rs.Domain("default").Rules()}, rec.sends)
	if err != nil {
		t.Fatal(err)
	}
	admitted := map[string]uint32{}
	for _, snd := range rec.sends {
		admitted[snd.Recipient]++
	}
	for i := range population {
		rcp := fmt.Sprintf("+86137%08d", i)
		switch used := peek(t, rcp, 2); {
		case used < admitted[rcp]:
			forgotten += int(admitted[rcp] - used)
			if forgotten <= 10 { // what the cluster forgot, for the failure's reader
				var at []int64
				for _, snd := range rec.sends {
					if snd.Recipient == rcp {
						at = append(at, snd.At)
					}
				}
				key, _ := node.KeyOf(rcp)
				t.Logf("%s (partition %d of %s's ring) counts %d of %d admitted at %v", rcp,
					c.Up()[0].Node.Ring().PartitionHash(key), c.Up()[0].Name, used, admitted[rcp], at)
			}
		case used > admitted[rcp]:
			extra += int(used - admitted[rcp])
		}
	}
	return v, forgotten, extra
}

// sendRule peeks at rcp and returns whether it would be admitted and rule
// i's used count.
func (s *sender) sendRule(t testing.TB, rcp string, i int) (bool, uint32) {
	for {
		up := s.c.Up()
		m := up[0]
		resp, err := m.Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err == nil && len(resp.Errors) == 0 {
			return resp.Admitted[0], resp.Used[i]
		}
		if err == nil && codes.Code(resp.Errors[0].Code) != codes.Unavailable {
			t.Fatalf("peek %s: %v", rcp, resp.Errors[0])
		}
	}
}

// waitSettled waits until every move is done (nodetest's WaitSettled).
func waitSettled(t testing.TB, c *nodetest.Cluster) {
	t.Helper()
	if err := c.WaitSettled(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestInterruptedMoves kills, under load, the side of a move that is
// taking partitions over (a node that just joined) and the side that is
// handing them over (an old member, right after a join): afterwards each
// partition is open on exactly one node, its owner, the oracle finds no
// over-admission and nothing admitted is forgotten.
func TestInterruptedMoves(t *testing.T) {
	rs, err := rules.Parse("churn", []byte(churnRules))
	if err != nil {
		t.Fatal(err)
	}
	c := moveCluster(t, 3, churnRules, true, "")
	s := newSender(c, 3)
	const population = 400
	rec := &loadRecord{}
	stop := make(chan struct{})
	wg := runLoad(t, s, 32, population, stop, rec)
	waitDecided(t, rec, 1000)

	// The new owner dies while it acquires.
	j, err := c.Add(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(j); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	waitDecided(t, rec, 1000)

	// The old owner dies while a new node acquires from it.
	if _, err := c.Add(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(c.Up()[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	waitDecided(t, rec, 1000)
	close(stop)
	wg.Wait()

	v, forgotten, _ := auditLoad(t, rs, s, rec, population)
	t.Logf("%d decided, %d admitted, %d over-admitted, %d forgotten", rec.decided.Load(), len(rec.sends), len(v), forgotten)
	if len(v) > 0 || forgotten > 0 {
		t.Fatalf("%d over-admissions (first %v), %d forgotten", len(v), v, forgotten)
	}
}

// TestPeersAreChecked sends a node peer messages it must refuse: from a
// node outside the ring, for another epoch, for partitions the caller does
// not own or the node does not back, and malformed. Each is refused with a
// clear error and changes nothing.
func TestPeersAreChecked(t *testing.T) {
	c := moveCluster(t, 3, tenPerHour, true, "")
	waitSettled(t, c)
	ms := c.Members()
	a, b := ms[0], ms[1]
	r := a.Node.Ring()
	s := newSender(c, 4)
	for i := range 50 {
		s.send(t, fmt.Sprintf("r%d", i), pb.Mode_MODE_CHECK_AND_RECORD)
	}
	// A partition b owns and a backs, and one b owns that a does not back.
	backed, notBacked := -1, -1
	for p := range 271 {
		if r.PartitionOwner(p).Name != b.Name {
			continue
		}
		if rep, _ := r.PartitionReplica(p); rep.Name == a.Name && backed < 0 {
			backed = p
		} else if rep.Name != a.Name && notBacked < 0 {
			notBacked = p
		}
	}
	owned := -1
	for p := range 271 {
		if r.PartitionOwner(p).Name == a.Name {
			owned = p
			break
		}
	}
	if backed < 0 || notBacked < 0 || owned < 0 {
		t.Fatalf("placement: backed %d, not backed %d, owned %d", backed, notBacked, owned)
	}
	before := a.Node.Stats()
	ctx := context.Background()
	f := func(name string, err error, want codes.Code, substr string) {
		t.Helper()
		if status.Code(err) != want || !strings.Contains(err.Error(), substr) {
			t.Fatalf("%s: %v, want %v with %q", name, err, want, substr)
		}
	}
	_, err := a.Node.PeerRPC().Acquire(ctx, &pb.AcquireRequest{Node: b.Name, RingEpoch: r.Epoch() + 1, Partitions: []uint32{uint32(backed)}})
	f("acquire, other epoch", err, codes.FailedPrecondition, "ring epoch")
	_, err = a.Node.PeerRPC().Acquire(ctx, &pb.AcquireRequest{Node: "stranger", RingEpoch: r.Epoch(), Partitions: []uint32{uint32(owned)}})
	f("acquire, stranger", err, codes.FailedPrecondition, "not in the ring")
	_, err = a.Node.PeerRPC().Acquire(ctx, &pb.AcquireRequest{Node: b.Name, RingEpoch: r.Epoch(), Partitions: []uint32{uint32(owned)}})
	f("acquire, not the owner", err, codes.FailedPrecondition, "is owned by "+a.Name)
	_, err = a.Node.PeerRPC().Acquire(ctx, &pb.AcquireRequest{Node: b.Name, RingEpoch: r.Epoch(), Partitions: []uint32{9999}})
	f("acquire, no such partition", err, codes.InvalidArgument, "9999 out of range")
	_, err = a.Node.PeerRPC().Replicate(ctx, &pb.ReplicateRequest{Node: b.Name, RingEpoch: r.Epoch(), Sends: []byte{2, 1, 2, 3}})
	f("replicate, malformed", err, codes.InvalidArgument, "bad wal payload")
	_, err = a.Node.PeerRPC().Fill(ctx, &pb.FillRequest{Node: b.Name, RingEpoch: r.Epoch(), Images: [][]byte{{1, 2, 3}}})
	f("fill, malformed", err, codes.InvalidArgument, "bad partition image")
	// A real image of a partition a does not back, and one from a node
	// that does not own it.
	img, _ := b.Node.Image(notBacked)
	_, err = a.Node.PeerRPC().Fill(ctx, &pb.FillRequest{Node: b.Name, RingEpoch: r.Epoch(), Images: [][]byte{img}})
	f("fill, not the backup", err, codes.FailedPrecondition, "is not backed by "+a.Name)
	img, _ = b.Node.Image(backed)
	_, err = a.Node.PeerRPC().Fill(ctx, &pb.FillRequest{Node: ms[2].Name, RingEpoch: r.Epoch(), Images: [][]byte{img}})
	f("fill, not the owner", err, codes.FailedPrecondition, "is owned by "+b.Name)

	// The same refusals on a ReplicateStream: each answered by an ack of its
	// call id with Replicate's code and message; the stream goes on, and
	// ends without error when the caller closes its side.
	refused := []*pb.ReplicateRequest{
		{Node: b.Name, RingEpoch: r.Epoch(), Sends: []byte{2, 1, 2, 3}, CallId: 11},
		{Node: "stranger", RingEpoch: r.Epoch(), CallId: 12},
		{Node: b.Name, RingEpoch: r.Epoch() + 1, CallId: 13},
	}
	in := make(chan *pb.ReplicateRequest, len(refused))
	for _, req := range refused {
		in <- req
	}
	close(in)
	var acks []*pb.ReplicateAck
	err = a.Node.ServeReplicateStream(ctx, func() (*pb.ReplicateRequest, error) {
		if req, ok := <-in; ok {
			return req, nil
		}
		return nil, io.EOF
	}, func(ack *pb.ReplicateAck) error { acks = append(acks, ack); return nil })
	if err != nil || len(acks) != len(refused) {
		t.Fatalf("stream: %v after %d acks, want nil after %d", err, len(acks), len(refused))
	}
	for i, req := range refused {
		_, uerr := a.Node.PeerRPC().Replicate(ctx, req)
		st := status.Convert(uerr)
		if got := acks[i]; got.CallId != req.CallId || got.Code != uint32(st.Code()) || got.Code == 0 || got.Message != st.Message() {
			t.Errorf("stream ack %v for %v, want call id %d and Replicate's %v", got, req, req.CallId, uerr)
		}
	}

	after := a.Node.Stats()
	if !reflect.DeepEqual(before.Open, after.Open) || !reflect.DeepEqual(before.Partitions, after.Partitions) {
		t.Fatal("a refused message changed partitions")
	}
}

// TestAsyncReplicationBound kills a node under load with asynchronous
// replication (AsyncBound 4): the oracle may find over-admissions, at most
// the bound per partition the dead node owned, and as many forgotten sends.
func TestAsyncReplicationBound(t *testing.T) {
	testKillWithin(t, "", func(cfg *node.Config) { cfg.Replication = node.ReplicationAsync }, true)
}

// TestDurabilityClassesSurviveOwnerKill kills a node under load, with WALs,
// once for each durability a domain can name (the node's replication
// sync): fsync and replicated lose and over-admit nothing; async at most
// AsyncBound (4) sends per partition the dead node owned.
func TestDurabilityClassesSurviveOwnerKill(t *testing.T) {
	for _, d := range []rules.Durability{rules.DurabilityFsync, rules.DurabilityReplicated, rules.DurabilityAsync} {
		t.Run(d.String(), func(t *testing.T) {
			testKillWithin(t, d.String(), func(cfg *node.Config) { cfg.DataDir = filepath.Join(t.TempDir(), cfg.Name) }, d == rules.DurabilityAsync)
		})
	}
}

// testKillWithin kills one of three in-memory nodes under 32 senders, on
// churnRules with the domain's durability (none: the node's), cfg adjusted
// by adjust, and audits every send admitted: with bounded, at most
// AsyncBound (4) over-admitted and forgotten per partition the dead node
// owned; otherwise none.
func testKillWithin(t *testing.T, durability string, adjust func(cfg *node.Config), bounded bool) {
	const bound = 4
	yaml := churnRules
	if durability != "" {
		yaml = strings.Replace(yaml, "  - name: default\n", "  - name: default\n    durability: "+durability+"\n", 1)
	}
	rs, err := rules.Parse("churn", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if durability != "" && rs.Durability("default").String() != durability {
		t.Fatalf("the rules name durability %v, want %s", rs.Durability("default"), durability)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 3, Rules: rs, InMemory: true,
		Node: func(cfg *node.Config) {
			cfg.SweepInterval, cfg.ForgetDeadAfter = -1, time.Second
			cfg.AsyncBound = bound
			adjust(cfg)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newSender(c, 5)
	const population = 400
	rec := &loadRecord{}
	stop := make(chan struct{})
	wg := runLoad(t, s, 32, population, stop, rec)
	waitDecided(t, rec, 2000)
	victim := c.Up()[0]
	r := victim.Node.Ring()
	owned := 0
	for p := range 271 {
		if r.PartitionOwner(p).Name == victim.Name {
			owned++
		}
	}
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	waitDecided(t, rec, 2000)
	close(stop)
	wg.Wait()
	v, forgotten, _ := auditLoad(t, rs, s, rec, population)
	limit := 0
	if bounded {
		limit = bound * owned
	}
	t.Logf("%d admitted, %d over-admitted, %d forgotten; bound %d (%d per partition, %d partitions on the dead node)",
		len(rec.sends), len(v), forgotten, limit, bound, owned)
	if len(v) > limit || forgotten > limit {
		t.Fatalf("%d over-admissions and %d forgotten, beyond the bound of %d", len(v), forgotten, limit)
	}
}

// TestAcquireAnswersTheCallersImageVersion: a caller that asks for no image
// version (a release before image version 2) gets version 1 images, whose
// records hold the same sends; one that asks for 2 gets 2.
func TestAcquireAnswersTheCallersImageVersion(t *testing.T) {
	c := moveCluster(t, 3, string(rules.DefaultYAML()), true, "")
	waitSettled(t, c)
	ms := c.Members()
	a, b := ms[0], ms[1]
	r := a.Node.Ring()
	s := newSender(c, 6)
	for i := range 1200 { // content logs are what formats 1 and 2 write differently
		s.sendContent(t, fmt.Sprintf("r%d", i%600), uint64(i%3+1))
	}
	// The partition owned by b and backed by a that holds the most records
	// on a.
	backed, most := -1, int64(0)
	for p := range r.Config().PartitionCount {
		rep, _ := r.PartitionReplica(p)
		if r.PartitionOwner(p).Name != b.Name || rep.Name != a.Name {
			continue
		}
		if _, n := a.Node.Image(p); n > most {
			backed, most = p, n
		}
	}
	if backed < 0 {
		t.Fatal("no partition owned by b and backed by a holds records")
	}
	want, _ := a.Node.Image(backed)
	if _, n := a.Node.Image(backed); n == 0 {
		t.Fatal("no records to convert")
	}
	for _, tc := range []struct{ ask, got int }{{0, 1}, {1, 1}, {2, 2}, {9, store.ImageVersion}} {
		resp, err := a.Node.PeerRPC().Acquire(context.Background(), &pb.AcquireRequest{Node: b.Name, RingEpoch: r.Epoch(), Partitions: []uint32{uint32(backed)}, ImageVersion: uint32(tc.ask)})
		if err != nil {
			t.Fatal(err)
		}
		img := resp.Images[0]
		h, err := store.CheckImage(img)
		if err != nil || h.Version != tc.got {
			t.Fatalf("asked for version %d: image version %d, %v; want %d", tc.ask, h.Version, err, tc.got)
		}
		// Both versions carry the same sends: merged into empty stores,
		// they answer the same.
		now := time.Now().UnixMilli()
		if got, w := answers(t, img, now), answers(t, want, now); !reflect.DeepEqual(got, w) || len(w) == 0 {
			t.Fatalf("asked for version %d: the image answers %v, want %v", tc.ask, got, w)
		}
	}
}

// answers merges img into an empty store of the default rules and returns
// what a peek with each of the contents 1-3 answers for each of its
// recipients, by key.
func answers(t *testing.T, img []byte, now int64) map[uint64]string {
	t.Helper()
	st, err := store.New(store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := window.NewDomain("default", window.DefaultRules())
	ref := st.Bind(d)
	if _, _, err := st.MergeImage(img, now, func(string) (store.Ref, bool) { return ref, true }); err != nil {
		t.Fatal(err)
	}
	type rcp struct {
		key uint64
		tag uint16
	}
	var rcps []rcp
	for p := range st.Partitions() {
		st.ForEach(p, func(_ string, key uint64, rec []byte) bool {
			rcps = append(rcps, rcp{key, window.RecordTag(rec)})
			return true
		})
	}
	out := map[uint64]string{}
	for _, r := range rcps {
		for content := range uint64(3) {
			var dec window.Decision
			if _, _, err := st.Apply(st.PartitionOf(r.key), ref, r.key, r.tag, now, window.Item{Content: content + 1, Mode: window.Peek}, 0, &dec); err != nil {
				t.Fatal(err)
			}
			out[r.key] += fmt.Sprint(dec.Rules[:dec.NumRules])
		}
	}
	return out
}

// TestMovesInParts moves partitions whose images exceed a peer message
// (Limits.MaxRequestBytes of 4 KiB here, 16 MiB in production: 100,000
// recipients a partition) through a join, a leave, a kill and a restart,
// over gRPC with WALs, under load: images travel in parts and Fill in
// several calls, and the oracle finds every admitted send counted and none
// over-admitted. Before parts, a Fill of 16 partitions over the bound was
// refused and the partitions never opened.
func TestMovesInParts(t *testing.T) {
	rs, err := rules.Parse("churn", []byte(churnRules))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 3, Rules: rs, DataDir: t.TempDir(),
		Node: func(cfg *node.Config) {
			cfg.SweepInterval, cfg.ForgetDeadAfter = -1, time.Second
			cfg.Limits.MaxRequestBytes = 4 << 10 // parts of 1 KiB
			cfg.Limits.MaxContentBytes = 1 << 10
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newSender(c, 7)
	const population = 8000
	rec := &loadRecord{}
	for i := range population { // a record for every recipient: ~30 per partition
		rcp := fmt.Sprintf("+86137%08d", i)
		if admitted, at := s.sendContent(t, rcp, 1); admitted {
			rec.sends = append(rec.sends, bench.Send{Domain: "default", Recipient: rcp, Content: 1, Cost: 1, At: at, Checked: true})
		}
	}
	big := 0
	for p := range 271 {
		if img, _ := c.Up()[0].Node.Image(p); len(img) > 1<<10 {
			big++
		}
	}
	if big == 0 {
		t.Fatal("no partition image on node-0 exceeds a part: the test moves nothing in parts")
	}
	stop := make(chan struct{})
	wg := runLoad(t, s, 16, population, stop, rec)
	waitDecided(t, rec, 500)
	churn(t, c, rec, 500, true)
	close(stop)
	wg.Wait()
	wantExact(t, rs, s, rec, population)
}
