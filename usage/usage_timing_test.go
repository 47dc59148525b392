package usage

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkCount counts items of one domain from parallel goroutines, in UTC
// and Asia/Kolkata: the hot path a node takes once per decided item.
func BenchmarkCount(b *testing.B) {
	tr := newTracker(b, Config{Zone: mustZone(b, "Asia/Kolkata")})
	ms := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		e := Event{Domain: "default", Admitted: true}
		for pb.Next() {
			e.Key = e.Key*6364136223846793005 + 1442695040888963407
			tr.Count(ms, e)
		}
	})
}

// BenchmarkMemoryPerDomainDay reports the heap one domain holds on one day
// in one zone (bytes/domain-day), from 200 domains counted in UTC alone:
//
//	go test -run XXX -bench MemoryPerDomainDay -benchtime 1x ./usage
func BenchmarkMemoryPerDomainDay(b *testing.B) {
	const domains = 200
	ms := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var per float64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := newTracker(b, Config{})
		for d := range domains {
			tr.Count(ms, Event{Domain: fmt.Sprint("domain-", d), Key: uint64(d), DeniedBy: "recipient-1m"})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / domains
		runtime.KeepAlive(tr)
	}
	b.ReportMetric(per, "bytes/domain-day")
	b.ReportMetric(per*float64(DefaultDays)*2/(1<<20), "MiB/domain(35d,2zones)")
}
