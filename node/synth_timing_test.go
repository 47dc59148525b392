package node

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// BenchmarkSynthRestart writes n synthetic recipients (Synthesize), then
// opens a node on them and measures the restart, the memory it holds and a
// snapshot of it. It is the in-process form of deploy/scale/restart.sh.
//
//	go test -run '^$' -bench SynthRestart/recipients=1000000 -benchtime 1x ./node
func BenchmarkSynthRestart(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			for b.Loop() {
				dir := filepath.Join(b.TempDir(), "d")
				now := t0 + 86_400_000
				st, err := Synthesize(context.Background(), SynthConfig{DataDir: dir, Recipients: n, Now: now})
				if err != nil {
					b.Fatal(err)
				}
				var before runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)

				clk := &testClock{}
				clk.set(now)
				start := time.Now()
				nd := openNode(b, Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
				restart := time.Since(start)
				rs := nd.Recovery()
				if rs.Records != int64(n) {
					b.Fatalf("restored %d records, want %d", rs.Records, n)
				}
				var after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&after)
				start = time.Now()
				if err := nd.snapshot(); err != nil {
					b.Fatal(err)
				}
				write := time.Since(start)
				crash(b, nd)

				b.ReportMetric(st.Took.Seconds(), "synth-s")
				b.ReportMetric(float64(st.Bytes)/float64(n), "disk-B/recipient")
				b.ReportMetric(restart.Seconds(), "restart-s")
				b.ReportMetric(float64(rs.StoreBytes)/float64(n), "store-B/recipient")
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-B/recipient")
				b.ReportMetric(write.Seconds(), "snapshot-write-s")
			}
		})
	}
}
