package node_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
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
)

var (
	nemesisLong = flag.Duration("nemesis.long", 0, "run TestNemesis's schedule for this long (0: the short schedule CI runs)")
	nemesisSeed = flag.Uint64("nemesis.seed", 0, "draw TestNemesis's schedule from this seed (0: a new seed, printed)")
	nemesisOnly = flag.String("nemesis.faults", "", "take only these of TestNemesis's steps, comma-separated: kill, freeze, isolate, cut, join, remove, skew (\"\": all)")
)

// nemesisShort is how long CI's schedule runs.
const nemesisShort = 45 * time.Second

// nemesisBeyondBound is the most sends TestNemesis lets the cluster count
// beyond those admitted, as a share of them.
const nemesisBeyondBound = 0.01

// TestNemesis runs a cluster of 3 to 5 in-process nodes (nodetest with
// Faults: gossip, peer calls and the load on one network that loses
// nothing unless cut) under load, while a schedule drawn from a seed
// kills and restarts nodes (from their WAL), freezes and thaws them, cuts
// the network both ways and one way, heals it, adds members and removes
// them, and skews clocks within and beyond the bound. At the end every
// admitted send is replayed through bench.Audit and
// every recipient peeked: nothing over-admitted, nothing forgotten, and at
// most nemesisBeyondBound counted beyond the admitted (sends nobody was
// told were admitted). A failing run prints its seed: -nemesis.seed=N replays the
// schedule (the interleaving with the load is the machine's).
func TestNemesis(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	seed := *nemesisSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	length := nemesisShort
	if *nemesisLong > 0 {
		length = *nemesisLong
	}
	t.Logf("nemesis seed %d (replay with -run TestNemesis -nemesis.seed=%d), %v", seed, seed, length)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED: replay the schedule with -run TestNemesis -nemesis.seed=%d", seed)
		}
	}()
	rs, err := rules.Parse("churn", []byte(churnRules))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Rules: rs, Faults: true, DataDir: t.TempDir(),
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	ld := &nemesisLoad{c: c, rec: &loadRecord{}}
	const population = 300
	stop := make(chan struct{})
	ld.run(t, 16, population, seed, stop)

	nm := &nemesis{t: t, c: c, rng: rand.New(rand.NewPCG(seed, 0x6e656d)), ld: ld}
	end := time.Now().Add(length)
	for time.Now().Before(end) {
		nm.step(ctx)
	}
	nm.restore(ctx)
	waitDecided(t, ld.rec, 500)
	close(stop)
	ld.wg.Wait()

	v, forgotten, beyond := auditLoadWith(t, rs, c, ld.peek, ld.rec, population)
	admitted := len(ld.rec.sends)
	t.Logf("steps: %s", strings.Join(nm.log, "; "))
	t.Logf("%d decided, %d admitted, %d over-admitted, %d forgotten, %d counted beyond the admitted (%.3f%%), %d unknown outcomes",
		ld.rec.decided.Load(), admitted, len(v), forgotten, beyond, 100*float64(beyond)/float64(max(admitted, 1)), ld.unknown.Load())
	if len(v) > 0 {
		t.Errorf("%d over-admissions, first: %v", len(v), v[0])
	}
	if forgotten > 0 {
		t.Errorf("%d admitted sends forgotten", forgotten)
	}
	// The aim is at most 0.1% counted beyond the admitted, which a
	// 4-minute run of this version meets (0.04%); short runs vary more. The
	// bound here guards against a regression, not the aim.
	if admitted == 0 || float64(beyond) > nemesisBeyondBound*float64(admitted) {
		t.Errorf("%d sends counted beyond the %d admitted: over %.1f%%", beyond, admitted, 100*nemesisBeyondBound)
	}
}

// nemesis draws and takes the fault steps of TestNemesis.
type nemesis struct {
	t   *testing.T
	c   *nodetest.Cluster
	rng *rand.Rand
	ld  *nemesisLoad
	log []string
}

// pause returns a duration drawn from [lo, hi).
func (nm *nemesis) pause(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(nm.rng.Int64N(int64(hi-lo)))
}

// victim returns a running member drawn at random.
func (nm *nemesis) victim() *nodetest.Member {
	up := nm.c.Up()
	return up[nm.rng.IntN(len(up))]
}

// step takes one fault step: the fault, a while under it, and its end;
// then a while under no fault, so that the cluster heals between steps.
func (nm *nemesis) step(ctx context.Context) {
	t, c := nm.t, nm.c
	m := nm.victim()
	d := nm.pause(time.Second, 6*time.Second)
	var what string
	k := nm.rng.IntN(9)
	if kind := [...]string{"kill", "freeze", "freeze", "isolate", "cut", "join", "remove", "skew", "skew"}[k]; *nemesisOnly != "" && !slices.Contains(strings.Split(*nemesisOnly, ","), kind) {
		time.Sleep(10 * time.Millisecond)
		return
	}
	switch {
	case k == 0:
		what = fmt.Sprintf("kill %s for %v", m.Name, d.Round(time.Millisecond))
		if err := c.Kill(m); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(d)
		if err := c.Restart(ctx, m); err != nil {
			t.Fatalf("%s: restart: %v", what, err)
		}
	case k == 1 || k == 2:
		d = nm.pause(2*time.Second, 10*time.Second)
		what = fmt.Sprintf("freeze %s for %v", m.Name, d.Round(time.Millisecond))
		c.Freeze(m)
		time.Sleep(d)
		c.Thaw(m)
	case k == 3:
		what = fmt.Sprintf("isolate %s for %v", m.Name, d.Round(time.Millisecond))
		c.Isolate(m)
		time.Sleep(d)
		c.Heal()
	case k == 4:
		o := nm.victim()
		if o == m {
			return
		}
		what = fmt.Sprintf("cut %s to %s one way for %v", m.Name, o.Name, d.Round(time.Millisecond))
		c.Cut(m, o)
		time.Sleep(d)
		c.Heal()
	case k == 5 && len(c.Up()) < 5:
		what = "join"
		if _, err := c.Add(ctx); err != nil {
			t.Fatalf("join: %v", err)
		}
	case k == 6 && len(c.Up()) > 3:
		what = fmt.Sprintf("remove %s", m.Name)
		if err := c.Stop(m); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		nm.ld.removed(m)
	case k == 7 || k == 8:
		// Within the bound (--max-clock-skew, 250ms) the node keeps
		// deciding on its clock; beyond it, it leaves the ring until the
		// clock is back.
		skew := nm.pause(20*time.Millisecond, 200*time.Millisecond)
		if k == 8 {
			skew = nm.pause(time.Second, 5*time.Second)
		}
		if nm.rng.IntN(2) == 0 {
			skew = -skew
		}
		what = fmt.Sprintf("skew %s's clock by %v for %v", m.Name, skew.Round(time.Millisecond), d.Round(time.Millisecond))
		c.SkewClock(m, skew)
		time.Sleep(d)
		c.SkewClock(m, 0)
	default: // no room to join, or too few to remove
		time.Sleep(10 * time.Millisecond)
		return
	}
	start := time.Now()
	if err := c.WaitConverged(ctx, len(c.Up())); err != nil {
		t.Fatalf("after %s: %v", what, err)
	}
	nm.log = append(nm.log, fmt.Sprintf("%s (converged in %v)", what, time.Since(start).Round(time.Millisecond)))
	time.Sleep(nm.pause(500*time.Millisecond, 2*time.Second))
}

// restore ends every fault: the network heals, every member thaws, and
// the cluster settles.
func (nm *nemesis) restore(ctx context.Context) {
	c := nm.c
	c.Heal()
	for _, m := range c.Members() {
		c.Thaw(m)
		c.SkewClock(m, 0)
	}
	if err := c.WaitConverged(ctx, len(c.Up())); err != nil {
		nm.t.Fatalf("restore: %v", err)
	}
	if err := c.WaitSettled(ctx); err != nil {
		nm.t.Fatalf("restore: %v", err)
	}
}

// nemesisLoad sends single checks through the fault network to random
// running members, the frozen ones too, as senders that do not know a
// member froze would, retrying a failed item with the same request id
// until it is answered; each attempt names its deadline (not_after_ms), as
// the Go client's do.
type nemesisLoad struct {
	c       *nodetest.Cluster
	rec     *loadRecord
	wg      sync.WaitGroup
	nextID  atomic.Uint64
	unknown atomic.Int64 // sends given up without an answer

	mu   sync.Mutex // guards gone
	gone map[string]bool
}

// removed notes that m left for good: the load no longer picks it.
func (ld *nemesisLoad) removed(m *nodetest.Member) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.gone == nil {
		ld.gone = map[string]bool{}
	}
	ld.gone[m.Name] = true
}

// pick returns a running member drawn with rng, waiting while none runs.
func (ld *nemesisLoad) pick(rng *rand.Rand) *nodetest.Member {
	for {
		if up := ld.c.Up(); len(up) > 0 {
			return up[rng.IntN(len(up))]
		}
		time.Sleep(time.Millisecond)
	}
}

// nemesisAttempt bounds one attempt of the load; nemesisGiveUp, a send.
const nemesisAttempt, nemesisGiveUp = time.Second, 60 * time.Second

func (ld *nemesisLoad) run(t *testing.T, workers, population int, seed uint64, stop <-chan struct{}) {
	quit := make(chan struct{})
	t.Cleanup(func() { close(quit); ld.wg.Wait() })
	for w := range workers {
		ld.wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
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
				admitted, at, ok := ld.send(t, rng, rcp, content, quit)
				if !ok {
					continue
				}
				ld.rec.decided.Add(1)
				if admitted {
					ld.rec.mu.Lock()
					ld.rec.sends = append(ld.rec.sends, bench.Send{Domain: "default", Recipient: rcp, Content: content, Cost: 1, At: at, Checked: true})
					ld.rec.mu.Unlock()
				}
			}
		})
	}
}

// send checks-and-records one send until a member answers it; ok is false
// if none did in nemesisGiveUp (an unknown outcome) or the test ended.
func (ld *nemesisLoad) send(t *testing.T, rng *rand.Rand, rcp string, content uint64, quit <-chan struct{}) (admitted bool, at int64, ok bool) {
	id := ld.nextID.Add(1)
	deadline := time.Now().Add(nemesisGiveUp)
	for time.Now().Before(deadline) {
		select {
		case <-quit:
			return false, 0, false
		default:
		}
		m := ld.pick(rng)
		ctx, cancel := context.WithTimeout(context.Background(), nemesisAttempt)
		dl, _ := ctx.Deadline()
		resp, err := ld.c.Check(ctx, m, &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{content}, RequestIds: []uint64{id}, NotAfterMs: dl.UnixMilli()})
		cancel()
		if err == nil && len(resp.Errors) == 0 {
			return resp.Admitted[0], resp.DecidedAtMs[0], true
		}
		code := status.Code(err)
		if err == nil {
			code = codes.Code(resp.Errors[0].Code)
		}
		if code != codes.Unavailable && code != codes.DeadlineExceeded && code != codes.Canceled {
			t.Errorf("%s via %s: %v %v", rcp, m.Name, err, resp.GetErrors())
			return false, 0, false
		}
		time.Sleep(time.Duration(1+rng.IntN(20)) * time.Millisecond)
	}
	ld.unknown.Add(1)
	return false, 0, false
}

// peek returns rule i's count for rcp, asked of a running member.
func (ld *nemesisLoad) peek(t testing.TB, rcp string, i int) uint32 {
	deadline := time.Now().Add(30 * time.Second)
	for {
		up := ld.c.Up()
		resp, err := ld.c.Check(context.Background(), up[0], &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err == nil && len(resp.Errors) == 0 {
			return resp.Used[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("peek %s: %v %v", rcp, err, resp.GetErrors())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
