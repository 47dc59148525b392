package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
)

var (
	failoverRuns = flag.Int("failover.runs", 0, "TestFailover: kill -9 one of three freqring serve processes under load this many times and report the median failover (0: skip)")
	failoverSoak = flag.Duration("failover.soak", 0, "TestFalseSuspicion: run three freqring serve processes under load, with a busy loop on every core, this long, and count members wrongly declared gone (0: skip)")
)

// failoverAim is the most seconds of the killed node's share of traffic
// that may go undecided (the median of the runs).
const failoverAim = 1.0

// TestFailover measures failover as an operator sees it: three `freqring
// serve` processes on 127.0.0.1, single-item checks sent by 8 workers to the
// two that will survive (senders that are not ring-aware: the survivors
// forward to the owner), and a SIGKILL of the third. It reports, per run
// and as the median, the items that failed after the kill in seconds of the
// killed node's share of the traffic (failed items / (rate / 3)), and the
// time from the kill to the last failed item. It fails if the median is
// above failoverAim. Run it with -failover.runs=5; CI runs the in-process
// TestKilledOwnerFailsOverFast instead.
func TestFailover(t *testing.T) {
	if *failoverRuns <= 0 {
		t.Skip("a measurement: run with -failover.runs=N")
	}
	bin := buildBinary(t)
	var shares, lasts []float64
	for run := range *failoverRuns {
		share, last, rate, failed := failoverRun(t, bin)
		t.Logf("run %d: %d items failed at %.0f decisions/s: %.3f s of the killed node's share; the last %.3f s after the kill", run+1, failed, rate, share, last)
		shares, lasts = append(shares, share), append(lasts, last)
	}
	slices.Sort(shares)
	slices.Sort(lasts)
	med := shares[len(shares)/2]
	t.Logf("median of %d runs: %.3f s of the killed node's share undecided (runs %.3f); last failure %.3f s after the kill (median; runs %.3f)",
		len(shares), med, shares, lasts[len(lasts)/2], lasts)
	if med > failoverAim {
		t.Errorf("median failover %.3f s of the killed node's share, aim %.1f s", med, failoverAim)
	}
}

// checkLoad sends single-item checks from workers goroutines to clis until
// stop closes, each with a 1 s deadline, and calls done with each result.
func checkLoad(clis []pb.LimiterClient, workers int, stop <-chan struct{}, done func(resp *pb.CheckResponse, err error)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 47))
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				resp, err := clis[rng.IntN(len(clis))].Check(ctx, &pb.CheckRequest{Recipients: []string{fmt.Sprintf("+86135%08d", rng.IntN(100000))}})
				cancel()
				done(resp, err)
			}
		})
	}
	return &wg
}

// failoverRun runs one cluster, kills one node under load and returns the
// failed items in seconds of its share, the time from the kill to the last
// failure, the rate before the kill and the failed items.
func failoverRun(t *testing.T, bin string) (share, last, rate float64, failed int64) {
	c := startThree(t, bin)
	var decided, failures atomic.Int64
	var killedAt, lastFail atomic.Int64 // unix ns
	var errMu sync.Mutex
	var errs []string // some failures after the kill, for the log
	stop := make(chan struct{})
	wg := checkLoad([]pb.LimiterClient{c.clis[0], c.clis[2]}, 8, stop, func(resp *pb.CheckResponse, err error) {
		if err == nil && len(resp.Errors) == 0 {
			decided.Add(1)
			return
		}
		k := killedAt.Load()
		if k == 0 {
			return // a start's transient retryable failures: not failover
		}
		failures.Add(1)
		now := time.Now().UnixNano()
		lastFail.Store(now)
		msg := fmt.Sprint(err)
		if err == nil {
			msg = resp.Errors[0].Message
		}
		errMu.Lock()
		if len(errs) < 3 || now-k > int64(500*time.Millisecond) && len(errs) < 6 {
			errs = append(errs, fmt.Sprintf("+%v: %s", time.Duration(now-k).Round(time.Millisecond), msg))
		}
		errMu.Unlock()
	})
	time.Sleep(time.Second) // past the start's transient failures
	d0 := decided.Load()
	time.Sleep(2 * time.Second)
	rate = float64(decided.Load()-d0) / 2
	kill := time.Now()
	killedAt.Store(kill.UnixNano())
	c.procs[1].Process.Kill()
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	failed = failures.Load()
	for _, e := range errs {
		t.Logf("    %s", e)
	}
	if lf := lastFail.Load(); lf != 0 {
		last = time.Duration(lf - kill.UnixNano()).Seconds()
	}
	return float64(failed) / (rate / 3), last, rate, failed
}

// TestFalseSuspicion runs three `freqring serve` processes under load
// while a busy loop holds every core, for -failover.soak, and counts the
// members each node's gossip saw fail or took out of its ring for refusing
// connections: none of them stopped, so every one is a false suspicion.
func TestFalseSuspicion(t *testing.T) {
	if *failoverSoak <= 0 {
		t.Skip("a measurement: run with -failover.soak=D")
	}
	bin := buildBinary(t)
	c := startThree(t, bin)
	stop := make(chan struct{})
	var decided, failed atomic.Int64
	wg := checkLoad(c.clis, 8, stop, func(resp *pb.CheckResponse, err error) {
		if err == nil && len(resp.Errors) == 0 {
			decided.Add(1)
		} else {
			failed.Add(1)
		}
	})
	var busy []*exec.Cmd
	for range 2 {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		busy = append(busy, cmd)
	}
	time.Sleep(*failoverSoak)
	for _, cmd := range busy {
		cmd.Process.Kill()
		cmd.Wait()
	}
	close(stop)
	wg.Wait()
	failures, marks := 0, 0
	for _, l := range c.logs {
		failures += strings.Count(l.String(), "gossip: member left or failed")
		marks += strings.Count(l.String(), "gossip: member refuses connections")
	}
	t.Logf("%v with two busy loops: %d decided, %d failed; %d members declared failed by gossip, %d marked down for refusing connections",
		*failoverSoak, decided.Load(), failed.Load(), failures, marks)
	if marks > 0 {
		t.Errorf("%d live members marked down for refusing connections", marks)
	}
}
