package node

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// counterRules is a domain of every algorithm, with windows short enough
// for a test's clock to cross them.
const counterRules = `domains:
  - name: api
    rules:
      - {name: log-5-2s, scope: recipient, limit: 5, window: 2s}
      - {name: counter-50-10s, algorithm: sliding-counter, limit: 50, window: 10s, buckets: 10}
      - {name: token-20-5s, algorithm: token-bucket, limit: 20, window: 5s, capacity: 30}
      - {name: funnel-10-2s, algorithm: leaky-bucket, limit: 10, window: 2s}
      - {name: gcra-5-1s, algorithm: gcra, limit: 5, window: 1s, capacity: 8}
      - {name: fixed-40-7s, algorithm: fixed-window, limit: 40, window: 7s}
      - {name: big-hour, algorithm: sliding-counter, limit: 1000000, window: 1h}
`

// TestRestartRecoversCounterStates: the counting algorithms' states come
// back after a crash, from a snapshot (record format 3 in image version 3)
// and the WAL tail replayed after it, so the node goes on deciding as
// before the crash.
func TestRestartRecoversCounterStates(t *testing.T) {
	rs, err := rules.Parse("counters", []byte(counterRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := &testClock{}
	clk.set(t0)
	cfg := Config{Rules: rs, Clock: clk, DataDir: t.TempDir(), SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1, SegmentBytes: 4 << 10}
	keys := testRecipients[:12]
	batch := func(rng *rand.Rand) *pb.CheckRequest {
		req := &pb.CheckRequest{Domains: []string{"api"}}
		for range 1 + rng.IntN(6) {
			req.Recipients = append(req.Recipients, keys[rng.IntN(len(keys))])
			req.Costs = append(req.Costs, uint32(1+rng.IntN(3)))
		}
		if rng.IntN(12) == 0 {
			req.Modes = []pb.Mode{pb.Mode_MODE_RECORD_ONLY}
		}
		return req
	}
	peek := func(n *Node) *pb.CheckResponse {
		resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: keys, Domains: []string{"api"}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil {
			t.Fatal(err)
		}
		resp.DecidedAtMs = nil
		return resp
	}
	a := openNode(t, cfg)
	rng := rand.New(rand.NewPCG(4, 4))
	denied := 0
	for i := range 800 {
		clk.advance(time.Duration(rng.IntN(60)) * time.Millisecond)
		resp, err := a.Check(context.Background(), batch(rng))
		if err != nil {
			t.Fatal(err)
		}
		for _, ok := range resp.Admitted {
			if !ok {
				denied++
			}
		}
		if i == 400 {
			if err := a.snapshot(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if denied == 0 {
		t.Fatal("no check was denied: the rules were never tested")
	}
	crash(t, a)
	b := openNode(t, cfg)
	defer b.Close()
	if rec := b.Recovery(); rec.Snapshot == "" || rec.Replayed == 0 {
		t.Fatalf("recovery %+v: want a snapshot and a replayed tail", rec)
	}
	a.ready.Store(true) // to peek at what a remembers
	a.dur = nil         // and to decide on from memory
	if pa, pb := peek(a), peek(b); !reflect.DeepEqual(pa.Used, pb.Used) || !reflect.DeepEqual(pa.RuleRetryAfterMs, pb.RuleRetryAfterMs) {
		t.Fatalf("after restart:\nbefore used %v retry %v\n after used %v retry %v", pa.Used, pa.RuleRetryAfterMs, pb.Used, pb.RuleRetryAfterMs)
	}
	rng2 := rand.New(rand.NewPCG(5, 5))
	for range 200 {
		clk.advance(time.Duration(rng2.IntN(60)) * time.Millisecond)
		req := batch(rng2)
		ra, err1 := a.Check(context.Background(), req)
		rb, err2 := b.Check(context.Background(), req)
		if err1 != nil || err2 != nil || !reflect.DeepEqual(ra.Admitted, rb.Admitted) || !reflect.DeepEqual(ra.Used, rb.Used) {
			t.Fatalf("after restart: %v %v\n%v %v\n%v %v", err1, err2, ra.GetAdmitted(), ra.GetUsed(), rb.GetAdmitted(), rb.GetUsed())
		}
	}
}
