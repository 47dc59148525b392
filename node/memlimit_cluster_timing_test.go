package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// BenchmarkClusterMemoryBound measures what replication adds to a store at
// its limit: in-process clusters of 2 and 3 nodes with MaxMemory 128 MiB
// each (store limit 32 MiB) and synchronous backups get 40 rounds of
// 150,000 recipients sending once each, with one of 20 contents and a
// request id, through every node in turn. An owner refuses what would grow
// its store past its limit, but its backups record every send it admits:
// the benchmark reports the most any node's store held against its limit
// (peak-store-%), the records backups, merges and replay created or grew
// past it (overshoots), and the items admitted and refused.
//
//	go test -run '^$' -bench ClusterMemoryBound -benchtime 1x ./node
func BenchmarkClusterMemoryBound(b *testing.B) {
	for _, size := range []int{2, 3} {
		b.Run(fmt.Sprintf("nodes=%d", size), func(b *testing.B) {
			for b.Loop() {
				clusterMemoryBound(b, size)
			}
		})
	}
}

func clusterMemoryBound(b *testing.B, size int) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: size, InMemory: true, Node: func(cfg *node.Config) { cfg.MaxMemory = node.MinMaxMemory }})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ms := c.Members()
	contents := make([][]byte, 20)
	for i := range contents {
		contents[i] = fmt.Appendf(nil, "template %d: your code is %06d", i, i*7919)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const recipients, batch = 150_000, 1000
	var id uint64
	var admitted, failed int64
	peak := 0.0
	req := &pb.CheckRequest{Recipients: make([]string, batch), Contents: make([][]byte, batch), RequestIds: make([]uint64, batch)}
	for range 40 {
		for start := 0; start < recipients; start += batch {
			for i := range req.Recipients {
				req.Recipients[i] = fmt.Sprintf("+86%011d", start+i)
				req.Contents[i] = contents[rng.IntN(len(contents))]
				id++
				req.RequestIds[i] = id
			}
			resp, err := ms[(start/batch)%len(ms)].Node.Check(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			failed += int64(len(resp.Errors))
			for _, a := range resp.Admitted {
				if a {
					admitted++
				}
			}
			for _, m := range ms {
				mem := m.Node.StoreMemory()
				peak = max(peak, float64(mem.HeldBytes)*100/float64(mem.MaxBytes))
			}
		}
	}
	var overshoots int64
	for _, m := range ms {
		mem := m.Node.StoreMemory()
		overshoots += mem.Overshoots
		b.Logf("%s: store held %d of %d bytes, %d refused (%d growths), %d overshoots", m.Name, mem.HeldBytes, mem.MaxBytes, mem.Refused, mem.RefusedGrowth, mem.Overshoots)
	}
	b.ReportMetric(peak, "peak-store-%")
	b.ReportMetric(float64(overshoots), "overshoots")
	b.ReportMetric(float64(admitted), "admitted")
	b.ReportMetric(float64(failed), "failed")
}
