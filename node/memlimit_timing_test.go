package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/wal"
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
	templates := steadyTemplates(b, d, now)
	rng := rand.New(rand.NewPCG(42, 1001)) // recipients of the batches
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

// BenchmarkFillToLimit sends batches of 1000 new recipients (one send
// each) to a node with MaxMemory 256 MiB, which is also the Go memory limit
// for the run, until 10 batches in a row are refused whole, then a second
// send of 1000 known recipients (answered where their record's slot holds
// it, RESOURCE_EXHAUSTED where it would grow: known-refused) and peeks of
// them (all answered). As serve does, it keeps the Go limit at the
// budget less what the store mapped outside the heap and the binary's
// resident pages (GoMemoryLimit, ResidentOutsideGo). It reports the
// recipients admitted, the store's bytes against its limit, and the peak of
// the Go runtime's mapped memory (runtime/metrics) plus the store's
// (MemoryStats.MappedBytes), sampled after each batch, against the budget.
//
//	go test -run '^$' -bench FillToLimit -benchtime 1x ./node
func BenchmarkFillToLimit(b *testing.B) {
	const budget = 256 << 20
	old := debug.SetMemoryLimit(budget)
	defer debug.SetMemoryLimit(old)
	samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	goMemory := func() int64 {
		metrics.Read(samples)
		return int64(samples[0].Value.Uint64() - samples[1].Value.Uint64())
	}
	for b.Loop() {
		runtime.GC()
		debug.SetMemoryLimit(budget)
		clk := &testClock{}
		clk.set(t0)
		a := openNode(b, Config{Clock: clk, MaxMemory: budget, SweepInterval: -1})
		req := &pb.CheckRequest{Recipients: make([]string, 1000)}
		var admitted, peak, peakMapped int64
		next := 0
		for refusedRun := 0; refusedRun < 10; {
			for i := range req.Recipients {
				req.Recipients[i] = fmt.Sprintf("+86%011d", next)
				next++
			}
			resp, err := a.Check(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Errors) == len(req.Recipients) {
				refusedRun++
			} else {
				refusedRun = 0
			}
			admitted += int64(len(req.Recipients) - len(resp.Errors))
			mapped := a.StoreMemory().MappedBytes
			debug.SetMemoryLimit(GoMemoryLimit(budget, mapped+ResidentOutsideGo()))
			if total := goMemory() + mapped; total > peak {
				peak, peakMapped = total, mapped
			}
		}
		for i := range req.Recipients {
			req.Recipients[i] = fmt.Sprintf("+86%011d", i) // known
		}
		resp, err := a.Check(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range resp.Errors {
			if codes.Code(e.Code) != codes.ResourceExhausted {
				b.Fatalf("a known recipient's send at the limit: %v", e)
			}
		}
		knownRefused := len(resp.Errors)
		req.Modes = make([]pb.Mode, len(req.Recipients))
		for i := range req.Modes {
			req.Modes[i] = pb.Mode_MODE_PEEK
		}
		if resp, err := a.Check(context.Background(), req); err != nil || len(resp.Errors) != 0 {
			b.Fatalf("peeks of known recipients at the limit: %v %v", resp.Errors, err)
		}
		m := a.Stats().Memory
		b.ReportMetric(float64(admitted), "admitted")
		b.ReportMetric(float64(m.Refused), "refused")
		b.ReportMetric(float64(knownRefused), "known-refused")
		b.ReportMetric(float64(m.HeldBytes)/(1<<20), "store-MiB")
		b.ReportMetric(float64(m.MaxBytes)/(1<<20), "store-limit-MiB")
		b.ReportMetric(float64(peak)/(1<<20), "peak-MiB")
		b.ReportMetric(float64(peakMapped)/(1<<20), "peak-store-mapped-MiB")
		a.Close()
	}
}

// BenchmarkMemoryBound drives a node with MaxMemory 128 MiB (also the Go
// memory limit, followed after each batch as serve follows it each second)
// and a WAL, as the safety
// review did, under two loads. fill=new: new recipients (one send each)
// until the store refuses them, then 60 rounds in which 50,000 of those
// known recipients send once each with one of 20 contents, the clock 5 s on
// per round, so that their records grow towards the day's 50 sends.
// fill=growth: 100,000 recipients from an empty store send so for 60
// rounds, with request ids (as package client sends them), and the node
// sweeps every simulated minute (12 rounds), as serve does. In both a
// snapshot runs beside the checks every 10 rounds. A goroutine samples the
// process's resident set (VmRSS), the store's account and the Go runtime's
// memory every 2 ms. It reports the peaks against the budget: the resident
// set over all and during snapshots, the store's held bytes against its
// limit, and the Go runtime's memory; the resident set before the node
// opened is the test binary's own (base-rss-MiB).
//
//	go test -run '^$' -bench MemoryBound -benchtime 1x ./node
func BenchmarkMemoryBound(b *testing.B) {
	for _, load := range []string{"new", "growth"} {
		b.Run("fill="+load, func(b *testing.B) {
			for b.Loop() {
				memoryBound(b, load == "new")
			}
		})
	}
}

// memoryBound runs one BenchmarkMemoryBound: with fillFirst, fill=new,
// else fill=growth.
func memoryBound(b *testing.B, fillFirst bool) {
	const budget = 128 << 20
	old := debug.SetMemoryLimit(budget)
	defer debug.SetMemoryLimit(old)
	samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"}}
	runtime.GC()
	debug.FreeOSMemory()
	baseRSS, _ := processMemory()
	clk := &testClock{}
	clk.set(t0)
	a := openNode(b, Config{Clock: clk, MaxMemory: budget, DataDir: b.TempDir(), Sync: wal.SyncNone,
		SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
	defer a.Close()

	var (
		mu                                     sync.Mutex
		peakRSS, peakSnapRSS, peakHeld, peakGo int64
		atPeak                                 string
		inSnapshot                             atomic.Bool
		stop                                   = make(chan struct{})
		sampler                                sync.WaitGroup
	)
	sample := func() {
		rss, _ := processMemory()
		m := a.StoreMemory()
		metrics.Read(samples)
		goMem := int64(samples[0].Value.Uint64() - samples[1].Value.Uint64())
		mu.Lock()
		defer mu.Unlock()
		if rss > peakRSS {
			peakRSS = rss
			atPeak = fmt.Sprintf("rss %.1f MiB: store held %.1f mapped %.1f free %.1f MiB, Go %.1f MiB (heap objects %.1f), snapshot %v",
				mib(rss), mib(m.HeldBytes), mib(m.MappedBytes), mib(m.FreeBytes), mib(goMem), mib(int64(samples[2].Value.Uint64())), inSnapshot.Load())
		}
		if inSnapshot.Load() {
			peakSnapRSS = max(peakSnapRSS, rss)
		}
		peakHeld = max(peakHeld, m.HeldBytes)
		peakGo = max(peakGo, goMem)
	}
	sampler.Go(func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			sample()
		}
	})
	follow := func() { debug.SetMemoryLimit(GoMemoryLimit(budget, a.StoreMemory().MappedBytes+ResidentOutsideGo())) }

	known := make([]string, 0, 100_000)
	filled := 0
	if fillFirst {
		// New recipients until 10 batches in a row are refused whole; the
		// first 50,000 admitted send in the rounds.
		known = known[:0:50_000]
		req := &pb.CheckRequest{Recipients: make([]string, 1000)}
		for refusedRun, next := 0, 0; refusedRun < 10; {
			for i := range req.Recipients {
				req.Recipients[i] = fmt.Sprintf("+86%011d", next)
				next++
			}
			resp, err := a.Check(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			failed := map[uint32]bool{}
			for _, e := range resp.Errors {
				failed[e.Index] = true
			}
			for i, r := range req.Recipients {
				if !failed[uint32(i)] {
					filled++
					if len(known) < cap(known) {
						known = append(known, r)
					}
				}
			}
			if len(resp.Errors) == len(req.Recipients) {
				refusedRun++
			} else {
				refusedRun = 0
			}
			follow()
		}
	} else {
		for i := range cap(known) {
			known = append(known, fmt.Sprintf("+86%011d", i))
		}
	}

	// The recipients send, their records growing; snapshots beside.
	contents := make([][]byte, 20)
	for i := range contents {
		contents[i] = fmt.Appendf(nil, "template %d: your code is %06d", i, i*7919)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var snaps sync.WaitGroup
	var refused, admitted int64
	id := uint64(0)
	for round := range 60 {
		rng.Shuffle(len(known), func(i, j int) { known[i], known[j] = known[j], known[i] })
		if round%10 == 5 {
			snaps.Wait()
			snaps.Go(func() {
				inSnapshot.Store(true)
				defer inSnapshot.Store(false)
				if err := a.snapshot(); err != nil {
					b.Error(err)
				}
			})
		}
		if !fillFirst && round%12 == 11 {
			if _, err := a.Sweep(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		for start := 0; start < len(known); start += 1000 {
			part := known[start:min(start+1000, len(known))]
			r := &pb.CheckRequest{Recipients: part, Contents: make([][]byte, len(part))}
			if !fillFirst {
				r.RequestIds = make([]uint64, len(part))
			}
			for i := range r.Contents {
				r.Contents[i] = contents[rng.IntN(len(contents))]
				if r.RequestIds != nil {
					id++
					r.RequestIds[i] = id
				}
			}
			resp, err := a.Check(context.Background(), r)
			if err != nil {
				b.Fatal(err)
			}
			refused += int64(len(resp.Errors))
			for _, ok := range resp.Admitted {
				if ok {
					admitted++
				}
			}
			clk.advance(5 * time.Second / time.Duration((len(known)+999)/1000))
			follow()
		}
	}
	snaps.Wait()
	inSnapshot.Store(true)
	if err := a.snapshot(); err != nil {
		b.Fatal(err)
	}
	inSnapshot.Store(false)
	close(stop)
	sampler.Wait()
	sample()
	m := a.Stats().Memory
	b.Logf("%d recipients filled the store, %d sent in the rounds: %d admitted, %d refused (%d of them growths); peak %s",
		filled, len(known), admitted, refused, m.RefusedGrowth, atPeak)
	b.ReportMetric(float64(filled), "filled")
	b.ReportMetric(mib(m.HeldBytes), "store-MiB")
	b.ReportMetric(mib(peakHeld), "peak-store-MiB")
	b.ReportMetric(mib(m.MaxBytes), "store-limit-MiB")
	b.ReportMetric(mib(peakGo), "peak-go-MiB")
	b.ReportMetric(mib(baseRSS), "base-rss-MiB")
	b.ReportMetric(mib(peakRSS), "peak-rss-MiB")
	b.ReportMetric(mib(peakSnapRSS), "peak-snapshot-rss-MiB")
	b.ReportMetric(float64(peakRSS)*100/budget, "peak-rss-%")
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
