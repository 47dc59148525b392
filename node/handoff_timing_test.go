package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// BenchmarkMove fills one node with n recipients (one send each, default
// rules), then starts a second: it acquires the partitions it now owns and
// fills the backups of the others. It reports the time from the start of the
// second node to every partition open on its owner, the records moved, the
// latency of the first check on a partition the new node is acquiring, and
// the longest time a partition was closed on its owner.
//
//	go test -run '^$' -bench Move -benchtime 1x ./node
func BenchmarkMove(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			for b.Loop() {
				benchMove(b, n)
			}
		})
	}
}

func benchMove(b *testing.B, n int) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 1, Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	a := c.Members()[0]
	const batch = 1000
	req := &pb.CheckRequest{Recipients: make([]string, batch)}
	for i := 0; i < n; i += batch {
		for j := range batch {
			req.Recipients[j] = fmt.Sprintf("+86%011d", i+j)
		}
		if _, err := a.Node.Check(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	m, err := c.Add(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// The first check on a recipient the new node owns, as soon as it serves.
	r := m.Node.Ring()
	var rcp string
	for i := 0; ; i++ {
		rcp = fmt.Sprintf("+86%011d", i)
		if r.OwnerString(rcp).Name == m.Name {
			break
		}
	}
	first := time.Now()
	resp, err := m.Node.Check(ctx, &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	firstAccess := time.Since(first)
	if err != nil || len(resp.Errors) > 0 || resp.Used[0] != 1 {
		b.Fatalf("first check of %s on %s: %v %v used %v", rcp, m.Name, err, resp.GetErrors(), resp.GetUsed())
	}
	if err := c.WaitConverged(ctx, 2); err != nil {
		b.Fatal(err)
	}
	waitSettled(b, c)
	took := time.Since(start)
	var moved, pause int64
	for _, x := range c.Members() {
		st, err := x.Node.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			b.Fatal(err)
		}
		moved += st.AcquiredRecords
		pause = max(pause, st.LongestPauseMs)
	}
	bs, _ := m.Node.Status(ctx, &pb.StatusRequest{})
	var onB int64
	for _, d := range bs.Domains {
		onB += d.Records
	}
	b.ReportMetric(took.Seconds(), "move-s")
	b.ReportMetric(float64(moved), "records-acquired")
	b.ReportMetric(float64(onB), "records-on-new-node")
	b.ReportMetric(float64(firstAccess.Microseconds())/1000, "first-access-ms")
	b.ReportMetric(float64(pause), "longest-pause-ms")
}
