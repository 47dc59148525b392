package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/window"
)

// BenchmarkMemoryOverhead measures what a node holds beside its store, the
// figure StoreBudget's reserve stands for: a node with a WAL gets n
// recipients at the seed's steady state, then decides 100 batches of 1000
// items (new and known recipients, with request ids) and writes a snapshot.
// It reports the store's counted bytes and the live heap per recipient
// (after a full GC), the live heap the store does not count, and the bytes
// allocated by the batches and by the snapshot (transients the reserve must
// also hold until the collector frees them).
//
//	go test -run '^$' -bench MemoryOverhead -benchtime 1x ./node
func BenchmarkMemoryOverhead(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	rng := rand.New(rand.NewPCG(42, 1000))
	var templates [][]byte
	for range 1000 {
		rec, err := window.SteadyStateRecord(d, rng, now)
		if err != nil {
			b.Fatal(err)
		}
		templates = append(templates, rec)
	}
	for _, n := range []int{1_000_000, 3_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			for b.Loop() {
				var ms runtime.MemStats
				heap := func() uint64 { runtime.GC(); runtime.ReadMemStats(&ms); return ms.HeapAlloc }
				base := heap()
				clk := &testClock{}
				clk.set(now)
				a := openNode(b, Config{Clock: clk, DataDir: b.TempDir(), SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
				fillSteady(b, a, n, templates)

				runtime.ReadMemStats(&ms)
				allocStart := ms.TotalAlloc
				req := &pb.CheckRequest{Recipients: make([]string, 1000), RequestIds: make([]uint64, 1000)}
				for j := range 100 {
					for i := range req.Recipients {
						req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(2*n))
						req.RequestIds[i] = uint64(j*1000 + i + 1)
					}
					if _, err := a.Check(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
				runtime.ReadMemStats(&ms)
				checkAlloc := ms.TotalAlloc - allocStart
				allocStart = ms.TotalAlloc
				if err := a.snapshot(); err != nil {
					b.Fatal(err)
				}
				runtime.ReadMemStats(&ms)
				snapAlloc := ms.TotalAlloc - allocStart

				live := heap() - base
				held := a.Stats().Memory.HeldBytes
				b.ReportMetric(float64(held)/float64(n), "held-B/recipient")
				b.ReportMetric(float64(live)/float64(n), "heap-B/recipient")
				b.ReportMetric(float64(int64(live)-held)/(1<<20), "uncounted-MiB")
				b.ReportMetric(float64(checkAlloc)/100/(1<<20), "alloc-MiB/batch")
				b.ReportMetric(float64(snapAlloc)/(1<<20), "snapshot-alloc-MiB")
				a.Close()
			}
		})
	}
}
