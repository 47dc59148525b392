package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// The benchmarks below send the node benchmark's load (package node,
// BenchmarkGRPCCheck: the default rules, recipients uniform over 1M, content
// from 16 templates) from 64 goroutines to a 3-node cluster on 127.0.0.1, in
// this process, and report decisions/s and the p50/p99 latency of a call.
// Nodes, gossip and load share the machine's cores.
//
//	go test -run '^$' -bench 'Client|EntryNode' -benchtime 20000x ./client
const (
	benchCallers    = 64
	benchBatch      = 100
	benchRecipients = 1_000_000
	// benchTimeout is long: the benchmarks measure decisions, not the
	// failure policy, on a machine that other jobs share.
	benchTimeout = 5 * time.Second
)

// BenchmarkClientCheck: every goroutine calls Check with one item; the
// client coalesces concurrent calls per owner, on a CheckStream per owner
// (unary: as unary Check RPCs).
func BenchmarkClientCheck(b *testing.B) {
	for _, tc := range []struct {
		name     string
		inflight int
		delay    time.Duration
		unary    bool
	}{{"inflight=2", 0, 0, false}, {"inflight=1", 1, 0, false}, {"inflight=2,delay=1ms", 0, time.Millisecond, false}, {"inflight=2,unary", 0, 0, true}} {
		b.Run(tc.name, func(b *testing.B) {
			c := newCluster(b, 3, nil)
			cl := newClient(b, Config{MaxInFlight: tc.inflight, MaxDelay: tc.delay, UnaryChecks: tc.unary, Timeout: benchTimeout}, c.addrs()...)
			benchLoad(b, c, 1, func(ctx context.Context, items []Item) error {
				_, err := cl.Check(ctx, items[0])
				return err
			})
			reportClient(b, cl)
		})
	}
}

// BenchmarkClientCheckBatch: every goroutine calls CheckBatch with 100
// items, which the client splits by owner.
func BenchmarkClientCheckBatch(b *testing.B) {
	c := newCluster(b, 3, nil)
	cl := newClient(b, Config{Timeout: benchTimeout}, c.addrs()...)
	benchLoad(b, c, benchBatch, func(ctx context.Context, items []Item) error {
		_, err := cl.CheckBatch(ctx, items)
		return err
	})
	reportClient(b, cl)
}

// reportClient reports the items per RPC and the share of items the client
// answered by its failure policy (0 unless the machine stalls for seconds).
func reportClient(b *testing.B, cl *Client) {
	s := cl.Stats()
	b.ReportMetric(float64(s.Items)/float64(s.RPCs), "items/rpc")
	b.ReportMetric(float64(s.Degraded)/float64(s.Items)*100, "degraded-%")
	if s.Retries > 0 || s.RingRefreshes > 0 {
		b.Logf("stats %+v", s)
	}
}

// BenchmarkEntryNodeBatch is the load of BenchmarkClientCheckBatch sent
// without the client, as batches of 100 to one node over 4 connections: the
// node forwards the items it does not own (about 2/3) to their owners.
func BenchmarkEntryNodeBatch(b *testing.B) {
	c := newCluster(b, 3, nil)
	var clis []pb.LimiterClient
	for range 4 {
		conn := dial(b, c.nodes[0].addr)
		b.Cleanup(func() { conn.Close() })
		clis = append(clis, pb.NewLimiterClient(conn))
	}
	var mu sync.Mutex
	next := 0
	benchLoad(b, c, benchBatch, func(ctx context.Context, items []Item) error {
		mu.Lock()
		cli := clis[next%len(clis)]
		next++
		mu.Unlock()
		req := &pb.CheckRequest{Recipients: make([]string, len(items)), ContentHashes: make([]uint64, len(items))}
		for i, it := range items {
			req.Recipients[i], req.ContentHashes[i] = it.Recipient, it.ContentHash
		}
		resp, err := cli.Check(ctx, req)
		if err == nil && len(resp.Errors) > 0 {
			err = fmt.Errorf("%d item errors, first %v", len(resp.Errors), resp.Errors[0])
		}
		return err
	})
}

// benchLoad runs b.N calls of call, with batch items each, from
// benchCallers goroutines, and reports decisions/s, the p50 and p99 latency
// of a call, and the share of items the nodes forwarded.
func benchLoad(b *testing.B, c *tcluster, batch int, call func(context.Context, []Item) error) {
	templates := make([]uint64, 16)
	for i := range templates {
		templates[i] = ContentHash(fmt.Appendf(nil, "template %d: your code is ####", i))
	}
	var before int64
	for _, n := range c.nodes {
		before += n.n.Stats().ForwardedOut
	}
	var mu sync.Mutex
	var lat []time.Duration
	seed := uint64(0)
	b.SetParallelism(benchCallers / 2) // 64 goroutines on the 2 Ps of the build machine
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(p *testing.PB) {
		mu.Lock()
		seed++
		rng := rand.New(rand.NewPCG(seed, 2))
		mu.Unlock()
		items := make([]Item, batch)
		var mine []time.Duration
		for p.Next() {
			for i := range items {
				items[i] = Item{Recipient: fmt.Sprintf("+86%011d", rng.IntN(benchRecipients)), ContentHash: templates[rng.IntN(len(templates))]}
			}
			t := time.Now()
			err := call(context.Background(), items)
			mine = append(mine, time.Since(t))
			if err != nil {
				b.Error(err)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	var fwd int64
	for _, n := range c.nodes {
		fwd += n.n.Stats().ForwardedOut
	}
	b.ReportMetric(float64(fwd-before)/float64(b.N*batch)*100, "forwarded-%")
}
