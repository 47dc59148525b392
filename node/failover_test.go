package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestKilledOwnerFailsOverFast kills one of three in-process nodes under
// load: the survivors' forwards to it fail, its address refuses (nodetest
// says so for a member down), and they take it out of their rings at once
// (gossip.Membership.Suspect) rather than after gossip's failure detection
// (about 2 s with nodetest's timings), so its partitions are decided by
// their backups again within a fraction of that. It logs the time from the
// kill to rings of two and the items the load could not decide meanwhile.
func TestKilledOwnerFailsOverFast(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Faults: true,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	victim := c.Members()[1]
	survivors := []*nodetest.Member{c.Members()[0], c.Members()[2]}

	var decided, failed atomic.Int64
	var lastFail atomic.Int64 // unix ns of the last failed item
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 46))
			for {
				select {
				case <-stop:
					return
				default:
				}
				via := survivors[rng.IntN(2)]
				rcp := fmt.Sprintf("+86136%08d", rng.IntN(10000))
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				resp, err := c.Check(cctx, via, &pb.CheckRequest{Recipients: []string{rcp}})
				cancel()
				if err != nil || len(resp.Errors) > 0 {
					failed.Add(1)
					lastFail.Store(time.Now().UnixNano())
					time.Sleep(time.Millisecond)
					continue
				}
				decided.Add(1)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	for decided.Load() < 2000 {
		time.Sleep(10 * time.Millisecond)
	}
	before := decided.Load()
	t0 := time.Now()
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConvergedOn(ctx, survivors, 2); err != nil {
		t.Fatal(err)
	}
	converged := time.Since(t0)
	time.Sleep(time.Second)
	rate := float64(decided.Load()-before) / time.Since(t0).Seconds()
	lost := time.Duration(0)
	if lf := lastFail.Load(); lf > t0.UnixNano() {
		lost = time.Duration(lf - t0.UnixNano())
	}
	t.Logf("kill to rings of two: %v; %d items failed (%.2f s of the victim's third of %.0f decisions/s); the last %v after the kill",
		converged.Round(time.Millisecond), failed.Load(), float64(failed.Load())/(rate/3), rate, lost.Round(time.Millisecond))
	marked := int64(0)
	for _, m := range survivors {
		marked += m.Node.Stats().Gossip.MarkedDown
	}
	if marked == 0 {
		t.Fatalf("no survivor marked %s down: the rings converged by failure detection alone (in %v)", victim.Name, converged)
	}
}
