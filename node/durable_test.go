package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/wal"
)

const durableRules = `domains:
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

// testClock is a settable clock that can also step on every reading.
type testClock struct{ ns, step atomic.Int64 }

func (c *testClock) Now() int64              { return c.ns.Add(c.step.Load()) }
func (c *testClock) set(ms int64)            { c.ns.Store(ms * 1e6) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func durableConfig(t testing.TB, dir string, clk Clock) Config {
	t.Helper()
	rs, err := rules.Parse("test", []byte(durableRules))
	if err != nil {
		t.Fatal(err)
	}
	return Config{Rules: rs, Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1}
}

func openNode(t testing.TB, cfg Config) *Node {
	t.Helper()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	return n
}

// crash stops n as kill -9 would leave it: whatever Check acknowledged is
// written to the OS, nothing else happens (no final snapshot).
func crash(t testing.TB, n *Node) {
	t.Helper()
	n.ready.Store(false)
	n.stopLoops()
	n.loops.Wait()
	if err := n.dur.log.Close(); err != nil {
		t.Fatal(err)
	}
	n.dur.lock.unlock() // the kernel releases a dead process's flock
}

var testRecipients = func() []string {
	var r []string
	for i := range 40 {
		r = append(r, fmt.Sprintf("+86138%08d", i))
	}
	return r
}()

// randomBatch is a batch over testRecipients in one domain.
func randomBatch(rng *rand.Rand) *pb.CheckRequest {
	req := &pb.CheckRequest{Domains: []string{[]string{"default", "fast"}[rng.IntN(2)]}}
	for range 1 + rng.IntN(20) {
		req.Recipients = append(req.Recipients, testRecipients[rng.IntN(len(testRecipients))])
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

// peekAll asks n about every test recipient, domain and content without
// changing anything.
func peekAll(t testing.TB, n *Node) []*pb.CheckResponse {
	t.Helper()
	var out []*pb.CheckResponse
	for _, d := range []string{"default", "fast"} {
		for content := range uint64(3) {
			resp, err := n.Check(context.Background(), &pb.CheckRequest{
				Recipients: testRecipients, Domains: []string{d}, ContentHashes: []uint64{content},
				Modes: []pb.Mode{pb.Mode_MODE_PEEK},
			})
			if err != nil {
				t.Fatal(err)
			}
			resp.DecidedAtMs = nil // the two nodes' clocks are read separately
			out = append(out, resp)
		}
	}
	return out
}

func samePeeks(t *testing.T, what string, a, b *Node) {
	t.Helper()
	pa, pb := peekAll(t, a), peekAll(t, b)
	for i := range pa {
		if !reflect.DeepEqual(pa[i].Used, pb[i].Used) || !reflect.DeepEqual(pa[i].RuleRetryAfterMs, pb[i].RuleRetryAfterMs) || !reflect.DeepEqual(pa[i].Admitted, pb[i].Admitted) {
			t.Fatalf("%s: peek %d differs:\nbefore used %v retry %v\n after used %v retry %v", what, i, pa[i].Used, pa[i].RuleRetryAfterMs, pb[i].Used, pb[i].RuleRetryAfterMs)
		}
	}
}

func TestRestartRecoversEverySend(t *testing.T) {
	for _, tc := range []struct {
		name      string
		snapshot  bool // take one snapshot halfway
		graceful  bool // Close (final snapshot) instead of crashing
		syncEvery wal.SyncPolicy
	}{
		{"wal only, crash", false, false, wal.SyncBatch},
		{"snapshot and tail, crash", true, false, wal.SyncBatch},
		{"graceful", true, true, wal.SyncBatch},
		{"sync none, crash", true, false, wal.SyncNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := &testClock{}
			clk.set(t0)
			cfg := durableConfig(t, dir, clk)
			cfg.Sync = tc.syncEvery
			cfg.SegmentBytes = 4 << 10 // many segments
			a := openNode(t, cfg)
			rng := rand.New(rand.NewPCG(1, 1))
			for i := range 600 {
				clk.advance(time.Duration(rng.IntN(400)) * time.Millisecond)
				if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
					t.Fatal(err)
				}
				if tc.snapshot && i == 300 {
					if err := a.snapshot(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.graceful {
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				crash(t, a)
			}
			b := openNode(t, cfg)
			defer b.Close()
			a.ready.Store(true) // to peek at what a remembers
			a.dur = nil         // and to decide on from memory
			samePeeks(t, "after restart", a, b)
			rs := b.Recovery()
			t.Logf("%+v", rs)
			switch {
			case tc.graceful && (rs.Snapshot == "" || rs.Replayed != 0):
				t.Fatalf("graceful restart replayed %d sends, snapshot %q; want only a snapshot", rs.Replayed, rs.Snapshot)
			case !tc.graceful && rs.Replayed == 0:
				t.Fatal("crash restart replayed nothing")
			case tc.snapshot && rs.Snapshot == "":
				t.Fatal("no snapshot loaded")
			}
			// And it goes on deciding as a would have.
			rng2 := rand.New(rand.NewPCG(2, 2))
			for range 100 {
				req := randomBatch(rng2)
				ra, err1 := a.Check(context.Background(), req)
				rb, err2 := b.Check(context.Background(), req)
				if err1 != nil || err2 != nil || !reflect.DeepEqual(ra.Admitted, rb.Admitted) {
					t.Fatalf("after restart: %v %v\n%v\n%v", err1, err2, ra.GetAdmitted(), rb.GetAdmitted())
				}
			}
		})
	}
}

// TestSnapshotsDuringConcurrentChecks: snapshots taken while goroutines
// record sends must, with the WAL after them, rebuild exactly the state the
// node had: no send lost and none counted twice.
func TestSnapshotsDuringConcurrentChecks(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	clk.step.Store(int64(3 * time.Millisecond))
	cfg := durableConfig(t, dir, clk)
	a := openNode(t, cfg)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 30 {
		if err := a.snapshot(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	crash(t, a)
	clk.step.Store(0)
	b := openNode(t, cfg)
	defer b.Close()
	a.ready.Store(true)
	samePeeks(t, "after snapshots under load", a, b)
	if rs := b.Recovery(); rs.Covered == 0 && rs.Replayed == 0 {
		t.Fatalf("recovery %+v: the test did not exercise the snapshot boundary", rs)
	}
	t.Logf("%d checks; recovery %+v", a.Stats().Checks, b.Recovery())
}

// TestRetentionExpiresOldSegments runs the node's own loops on synctest's
// fake clock: after a day and a margin, WAL segments from before are gone
// and a restart still agrees with the node.
func TestRetentionExpiresOldSegments(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		cfg := durableConfig(t, dir, nil) // the system clock: fake inside the bubble
		cfg.SegmentBytes = 2 << 10
		cfg.RetentionMargin = time.Minute
		a := openNode(t, cfg)
		crashed := false
		defer func() {
			if !crashed {
				crash(t, a) // stop its loops, so that a failing test ends cleanly
			}
		}()
		rng := rand.New(rand.NewPCG(4, 4))
		send := func(batches int) {
			for range batches {
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
					t.Fatal(err)
				}
			}
		}
		send(300)
		before := a.dur.log.Segments()
		time.Sleep(24*time.Hour + 2*time.Minute) // the durable loop ticks meanwhile
		send(50)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		after := a.dur.log.Segments()
		// Every segment sealed before the day is gone; the one active then
		// also holds new sends and stays.
		if len(before) < 5 || after[0].Seq < before[len(before)-1].Seq {
			t.Fatalf("segments before %d (last %d), after the day: first %d; want the sealed ones gone", len(before), before[len(before)-1].Seq, after[0].Seq)
		}
		crash(t, a)
		crashed = true
		b := openNode(t, cfg)
		defer b.Close()
		a.ready.Store(true)
		a.dur = nil
		samePeeks(t, "after retention", a, b)
	})
}

func TestDamagedSnapshotRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, dir, clk)
	a := openNode(t, cfg)
	rng := rand.New(rand.NewPCG(5, 5))
	for range 50 {
		a.Check(context.Background(), randomBatch(rng))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	snaps, _ := listSnapshots(dir)
	if len(snaps) != 1 {
		t.Fatalf("snapshots %v", snaps)
	}
	path := filepath.Join(dir, snaps[0])
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 0xff
	os.WriteFile(path, b, 0o644)

	n, _ := New(cfg)
	err := n.Open(context.Background())
	if !errors.Is(err, ErrCorruptSnapshot) || !strings.Contains(err.Error(), path+" offset ") {
		t.Fatalf("Open: %v, want ErrCorruptSnapshot naming %s and an offset", err, path)
	}
	cfg.SkipCorrupt = true
	n = openNode(t, cfg)
	if n.Recovery().Snapshot != "" {
		t.Fatal("loaded the damaged snapshot")
	}
	n.Close()
}

func TestCheckBeforeOpenIsUnavailable(t *testing.T) {
	n, err := New(durableConfig(t, t.TempDir(), nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"r"}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Check before Open: %v, want Unavailable", err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"r"}}); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"r"}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Check after Close: %v, want Unavailable", err)
	}
}

// canceledAfterAdmit is a context that its caller cancels once the node has
// admitted the call: Err reports nothing the first time (admit's check) and
// context.Canceled afterwards, as a client deadline that expires while the
// batch is decided would.
type canceledAfterAdmit struct {
	context.Context
	calls atomic.Int32
}

func (c *canceledAfterAdmit) Err() error {
	if c.calls.Add(1) == 1 {
		return nil
	}
	return context.Canceled
}

// TestDecidedSendsReachTheWALAfterTheCallerLeaves: a batch decided and
// recorded in memory is written to the WAL even if its caller gives up
// meanwhile. Before, the WAL append saw the canceled context and skipped the
// record: the node counted the send in memory and forgot it at the next
// crash.
func TestDecidedSendsReachTheWALAfterTheCallerLeaves(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, dir, clk)
	a := openNode(t, cfg)
	req := &pb.CheckRequest{Recipients: []string{"+8613800000001"}}
	if _, err := a.Check(&canceledAfterAdmit{Context: context.Background()}, req); err != nil {
		t.Fatalf("check whose caller left after admission: %v", err)
	}
	crash(t, a)
	b := openNode(t, cfg)
	defer b.Close()
	resp, err := b.Check(context.Background(), &pb.CheckRequest{Recipients: req.Recipients, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Used[0] != 1 {
		t.Fatalf("after a crash the send counts %d, want 1", resp.Used[0])
	}
}

func TestSnapshotLeast(t *testing.T) {
	for _, tc := range []struct {
		size  int64
		ratio float64
		want  int64
	}{
		{12_700_000_000, 3, 4_233_333_333},
		{127 << 20, 3, 127 << 20 / 3},
		{0, 3, 0},
		{12_700_000_000, -1, 0},
	} {
		if got := snapshotLeast(tc.size, tc.ratio); got != tc.want {
			t.Errorf("snapshotLeast(%d, %v) = %d, want %d", tc.size, tc.ratio, got, tc.want)
		}
	}
}

func TestSnapshotDue(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name     string
		interval time.Duration
		walBytes int64
		least    int64
		grown    int64
		age      time.Duration
		took     time.Duration
		want     bool
	}{
		{"wal grew", time.Minute, 64 * mib, 0, 64 * mib, time.Second, 50 * time.Millisecond, true},
		{"interval passed", time.Minute, 64 * mib, 0, 1, time.Minute, 50 * time.Millisecond, true},
		{"interval passed, nothing new", time.Minute, 64 * mib, 0, 0, time.Minute, 0, false},
		{"neither", time.Minute, 64 * mib, 0, mib, 30 * time.Second, 0, false},
		{"wal grew, the last snapshot took 25 s", time.Minute, 64 * mib, 0, 700 * mib, 3 * time.Minute, 25 * time.Second, false},
		{"then ten times its duration passed", time.Minute, 64 * mib, 0, 900 * mib, 250 * time.Second, 25 * time.Second, true},
		{"disabled", -1, -1, 0, 900 * mib, time.Hour, 0, false},
		{"interval passed, the WAL short of a third of the last snapshot", time.Minute, 64 * mib, 4000 * mib, 3000 * mib, time.Hour, 25 * time.Second, false},
		{"the WAL grew by a third of the last snapshot", time.Minute, 64 * mib, 4000 * mib, 4000 * mib, time.Hour, 25 * time.Second, true},
	} {
		if got := snapshotDue(tc.interval, tc.walBytes, tc.least, tc.grown, tc.age, tc.took); got != tc.want {
			t.Errorf("%s: snapshotDue = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSnapshotWaitsForTheWALRatio runs the node's own loops on synctest's
// fake clock: once the interval has passed, a snapshot still waits until
// the WAL has grown by a third of the last snapshot's size, and no longer;
// with the cap off it does not wait.
func TestSnapshotWaitsForTheWALRatio(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ratio float64
		early bool // a snapshot before the WAL grew by a third of the last one
	}{{"default ratio", 0, false}, {"no cap", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			synctest.Test(t, func(t *testing.T) {
				cfg := durableConfig(t, dir, nil) // the system clock: fake inside the bubble
				cfg.SnapshotInterval = time.Minute
				cfg.SnapshotWALRatio = tc.ratio
				a := openNode(t, cfg)
				defer crash(t, a)
				next := 0
				send := func(n int) { // n new recipients, one send each
					req := &pb.CheckRequest{}
					for range n {
						req.Recipients = append(req.Recipients, fmt.Sprintf("+1%010d", next))
						next++
					}
					if _, err := a.Check(context.Background(), req); err != nil {
						t.Fatal(err)
					}
				}
				for range 100 {
					send(100)
				}
				if err := a.snapshot(); err != nil {
					t.Fatal(err)
				}
				// The durable loop writes these under the lock.
				a.dur.mu.Lock()
				size, taken := a.dur.snapSize, a.snapshots.Load()
				a.dur.mu.Unlock()
				grown := func() int64 {
					a.dur.mu.Lock()
					defer a.dur.mu.Unlock()
					return a.dur.log.Stats().Bytes - a.dur.snapBytes
				}
				for grown() < size/6 {
					send(10)
				}
				time.Sleep(2 * time.Minute) // the durable loop ticks meanwhile
				synctest.Wait()
				if got := a.snapshots.Load() - taken; (got > 0) != tc.early {
					t.Fatalf("%d snapshots after the WAL grew by %d of the last one's %d bytes; want one: %v", got, grown(), size, tc.early)
				}
				if tc.early {
					return
				}
				for grown() < size/3 {
					send(10)
				}
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if got := a.snapshots.Load() - taken; got != 1 {
					t.Fatalf("%d snapshots once the WAL grew by a third of the last one's %d bytes, want 1", got, size)
				}
			})
		})
	}
}
