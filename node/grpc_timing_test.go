package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

// BenchmarkGRPCCheck measures decisions/s and call latency of one node on
// 127.0.0.1 under the README's load: batches of 100 items of the default
// rules, recipients uniform over 1M, content from 16 templates, 64
// concurrent callers over 4 connections, load generator in the same process.
//
//	go test -run '^$' -bench GRPCCheck -benchtime 400000x ./node
func BenchmarkGRPCCheck(b *testing.B) {
	const (
		batch      = 100
		callers    = 64
		conns      = 4
		recipients = 1_000_000
	)
	n, err := node.New(node.Config{})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go n.Serve(ctx, lis)
	var clients []pb.LimiterClient
	for range conns {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
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

	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(callers / 2) // 64 goroutines on the 2 Ps of this machine
	b.ResetTimer()
	start := time.Now()
	var next sync.Mutex
	seed := uint64(0)
	b.RunParallel(func(pb_ *testing.PB) {
		next.Lock()
		seed++
		rng := rand.New(rand.NewPCG(seed, 1))
		cli := clients[seed%conns]
		next.Unlock()
		req := &pb.CheckRequest{Recipients: make([]string, batch), ContentHashes: make([]uint64, batch)}
		var mine []time.Duration
		for pb_.Next() {
			for i := range batch {
				req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(recipients))
				req.ContentHashes[i] = templates[rng.IntN(len(templates))]
			}
			t := time.Now()
			resp, err := cli.Check(context.Background(), req)
			mine = append(mine, time.Since(t))
			if err != nil || len(resp.Errors) > 0 {
				b.Error(err, resp.GetErrors())
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	s := n.Stats()
	b.ReportMetric(float64(s.Denied)/float64(s.Checks)*100, "denied-%")
}
