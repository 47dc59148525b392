package metrics_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/metrics"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// BenchmarkGRPCCheckMetrics is node's BenchmarkGRPCCheck (one node on
// 127.0.0.1, batches of 100 items of the default rules, recipients uniform
// over 1M, 16 content templates, 64 callers over 4 connections) without
// metrics and with them: the Observer's histograms on every call and a
// scrape (Gather of the node's registry) every second, 15 times as often as
// Prometheus' default. Repeat whole runs so that a shared machine's load
// hits both alike, and compare medians:
//
//	for i in 1 2 3 4 5 6; do go test -run '^$' -bench 'GRPCCheckMetrics' -benchtime 20000x ./metrics; done
func BenchmarkGRPCCheckMetrics(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("metrics=%v", on), func(b *testing.B) { benchGRPC(b, on) })
	}
}

func benchGRPC(b *testing.B, withMetrics bool) {
	const (
		batch      = 100
		callers    = 64
		conns      = 4
		recipients = 1_000_000
	)
	var cfg node.Config
	var obs *metrics.Observer
	if withMetrics {
		obs = metrics.NewObserver()
		cfg.Observer = obs
	}
	n, err := node.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, lis) }()
	defer func() { cancel(); <-served }()
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	var clients []pb.LimiterClient
	for range conns {
		conn, err := grpc.NewClient(lis.Addr().String(), creds)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, pb.NewLimiterClient(conn))
	}
	templates := make([]uint64, 16)
	for i := range templates {
		templates[i] = node.ContentHash(fmt.Appendf(nil, "template %d: your code is ####", i))
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := nodetest.WaitServingWith(wctx, lis.Addr().String(), creds); err != nil {
		b.Fatal(err)
	}
	if withMetrics {
		reg := metrics.NewRegistry(n, obs)
		stop := make(chan struct{})
		var scraper sync.WaitGroup
		scraper.Go(func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if _, err := reg.Gather(); err != nil {
						b.Error(err)
					}
				}
			}
		})
		defer func() { close(stop); scraper.Wait() }()
	}
	b.SetParallelism(callers / 2) // 64 goroutines on the 2 Ps of this machine
	b.ResetTimer()
	start := time.Now()
	var next sync.Mutex
	seed := uint64(0)
	b.RunParallel(func(p *testing.PB) {
		next.Lock()
		seed++
		rng := rand.New(rand.NewPCG(seed, 1))
		cli := clients[seed%conns]
		next.Unlock()
		req := &pb.CheckRequest{Recipients: make([]string, batch), ContentHashes: make([]uint64, batch)}
		for p.Next() {
			for i := range batch {
				req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(recipients))
				req.ContentHashes[i] = templates[rng.IntN(len(templates))]
			}
			resp, err := cli.Check(context.Background(), req)
			if err != nil || len(resp.Errors) > 0 {
				b.Error(err, resp.GetErrors())
				return
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "decisions/s")
}

// BenchmarkCheckMetrics is the in-process cost of metrics per Check call of
// 100 items (no gRPC, so less noise than BenchmarkGRPCCheckMetrics):
// Node.Check without an Observer and with the Prometheus one, recipients
// uniform over 100k, a fixed clock. The decision counters are always on.
//
//	go test -run '^$' -bench '^BenchmarkCheckMetrics$' -count 6 ./metrics
func BenchmarkCheckMetrics(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("metrics=%v", on), func(b *testing.B) {
			const batch, recipients = 100, 100_000
			var cfg node.Config
			cfg.SweepInterval = -1
			cfg.Clock = &clock{ns: t0 * 1e6}
			if on {
				cfg.Observer = metrics.NewObserver()
			}
			n, err := node.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := n.Open(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			reqs := make([]*pb.CheckRequest, 64)
			for k := range reqs {
				reqs[k] = &pb.CheckRequest{Recipients: make([]string, batch), Modes: []pb.Mode{pb.Mode_MODE_PEEK}}
				for i := range batch {
					reqs[k].Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(recipients))
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			k := 0
			for b.Loop() {
				if _, err := n.Check(context.Background(), reqs[k%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				k++
			}
		})
	}
}

// BenchmarkObserverCheckDone is what the Observer adds to each Check call:
// two histogram observations, from parallel goroutines.
//
//	go test -run '^$' -bench 'ObserverCheckDone' ./metrics
func BenchmarkObserverCheckDone(b *testing.B) {
	obs := metrics.NewObserver()
	b.ReportAllocs()
	b.RunParallel(func(p *testing.PB) {
		for p.Next() {
			obs.CheckDone(100, 750*time.Microsecond)
		}
	})
}

// BenchmarkScrape is one Gather of a node's registry (the Collector reading
// Stats, the histograms, the Go and process collectors): the work of one
// Prometheus scrape, without HTTP.
//
//	go test -run '^$' -bench 'Scrape' ./metrics
func BenchmarkScrape(b *testing.B) {
	obs := metrics.NewObserver()
	n, err := node.New(node.Config{SweepInterval: -1, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	reg := metrics.NewRegistry(n, obs)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
