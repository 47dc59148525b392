package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// TestSweepsChangeNoDecision runs a node through ten simulated days of
// checks on a few recipients a day, with sweeps every simulated minute (which
// reclaim idle records, drop dead content logs and defragment) and a clock
// that now and then steps back by less than SweepSlack, as a batch timed
// before a sweep does. Every decision must equal the engine's on plain
// records that are never swept. (TestSweepSlackKeepsWhatEarlierDecisionsCount
// sets up the case the slack is for, which random steps rarely reach.)
func TestSweepsChangeNoDecision(t *testing.T) {
	clk := &reloadClock{}
	now := int64(1_790_000_000_000)
	clk.ms.Store(now)
	n := openReloadNode(t, string(rules.DefaultYAML()), clk) // window.DefaultRules
	d, err := window.NewDomain("default", window.DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(13, 13))
	plain := map[string][]byte{}
	var ws window.Scratch
	var want window.Decision
	lastSweep, checks := now, 0
	start := now
	for now < start+10*86_400_000 {
		// Bursts and long pauses: records grow, go idle past the content
		// window (and are compacted) and past the day (and are reclaimed).
		switch k := rng.IntN(40); {
		case k == 0:
			now += rng.Int64N(3 * 3_600_000)
		case k == 1: // just past the content window: a sweep compacts the newest records
			now += 59*60_000 + rng.Int64N(60_000)
		case k < 8:
			now += rng.Int64N(10 * 60_000)
		default:
			now += rng.Int64N(20_000)
		}
		at := now
		if rng.IntN(4) == 0 { // timed up to 30 s before the latest sweep: within node.SweepSlack
			at -= rng.Int64N(30_000)
		}
		clk.ms.Store(at)
		rcp := fmt.Sprintf("+447%d%02d", (now-start)/86_400_000, rng.IntN(12)) // a day's recipients go idle after it
		content := uint64(1 + rng.IntN(5))
		mode := pb.Mode_MODE_CHECK_AND_RECORD
		if rng.IntN(6) == 0 {
			mode = pb.Mode_MODE_PEEK
		}
		resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp},
			ContentHashes: []uint64{content}, Modes: []pb.Mode{mode}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("check %d: %v %v", checks, err, resp.GetErrors())
		}
		it := window.Item{Content: content}
		if mode == pb.Mode_MODE_PEEK {
			it.Mode = window.Peek
		}
		out, err := d.Apply(&ws, plain[rcp], 1, at, it, &want)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			plain[rcp] = append(plain[rcp][:0], out...)
		}
		if resp.Admitted[0] != want.Admitted || resp.DecidedAtMs[0] != want.At {
			t.Fatalf("check %d of %s at %d: node admitted %v at %d, engine %v at %d", checks, rcp, at,
				resp.Admitted[0], resp.DecidedAtMs[0], want.Admitted, want.At)
		}
		for i := range want.NumRules {
			if int(resp.Used[i]) != want.Rules[i].Used {
				t.Fatalf("check %d of %s at %d: rule %d counts %d on the node, %d in the engine", checks, rcp, at, i, resp.Used[i], want.Rules[i].Used)
			}
		}
		checks++
		clk.ms.Store(now)
		for ; lastSweep+time.Minute.Milliseconds() <= now; lastSweep += time.Minute.Milliseconds() {
			if now-lastSweep > time.Hour.Milliseconds() { // after a long pause, one sweep
				lastSweep = now - time.Minute.Milliseconds()
			}
			if _, err := n.Sweep(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := n.Stats().Domains[0]
	t.Logf("%d checks; the sweeps compacted %d records, reclaimed %d", checks, s.Compacted, s.Expired)
	if s.Compacted == 0 || s.Expired == 0 {
		t.Fatalf("the sweeps compacted %d and reclaimed %d records; the test wants both", s.Compacted, s.Expired)
	}
}
