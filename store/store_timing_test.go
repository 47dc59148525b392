package store

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// steadyTemplates returns k distinct records of the seed's steady state as of
// now (window.SteadyStateRecord).
func steadyTemplates(tb testing.TB, d *window.Domain, k int, now int64) [][]byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(42, uint64(k)))
	out := make([][]byte, k)
	for i := range out {
		rec, err := window.SteadyStateRecord(d, rng, now)
		if err != nil {
			tb.Fatal(err)
		}
		out[i] = rec
	}
	return out
}

// benchKey returns the key and tag of benchmark recipient i: a mix of i, so
// that the benchmark loop reads no table of its own (which would add cache
// misses to what it measures).
func benchKey(i int) (uint64, uint16) {
	z := uint64(i) + 0x9e3779b97f4a7c15 // splitmix64
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return z | 1, uint16(z >> 20)
}

// fillSteady puts n recipients (benchKey(0..n-1)) into st, each with a copy
// of one of the templates.
func fillSteady(tb testing.TB, st *Store, r Ref, n int, templates [][]byte) {
	tb.Helper()
	buf := make([]byte, 0, 512)
	for i := range n {
		key, tag := benchKey(i)
		rec := append(buf[:0], templates[i%len(templates)]...)
		binary.LittleEndian.PutUint16(rec, tag)
		pt := &st.parts[st.PartitionOf(key)]
		sp := pt.space(r.id, true)
		pos, _, other := sp.lookup(key, tag)
		if err := sp.put(key, pos, rec, other); err != nil {
			tb.Fatal(err)
		}
	}
}

var benchMode = window.CheckAndRecord

// sweepAll sweeps every partition of st with cutoff.
func sweepAll(tb testing.TB, st *Store, ref Ref, cutoff int64) (reclaimed int) {
	for p := range st.Partitions() {
		for pos := 0; pos >= 0; {
			var r int
			var err error
			if pos, r, err = st.Sweep(p, ref, pos, cutoff, 2048); err != nil {
				tb.Fatal(err)
			}
			reclaimed += r
		}
	}
	return reclaimed
}

// BenchmarkStoreCheck measures one 4-rule check-and-record through the store
// (index lookup, decode, decide, encode, slot write) on recipients at the
// seed's steady state, chosen uniformly at random among n.
//
//	go test -run '^$' -bench StoreCheck -benchtime 3s ./store
func BenchmarkStoreCheck(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, 1000, now)
	for _, n := range []int{10_000, 1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			st, ref := newTestStore(b, d, 0)
			fillSteady(b, st, ref, n, templates)
			rng := rand.New(rand.NewPCG(3, 3))
			var dec window.Decision
			// Time moves as in the steady state: 30 sends per recipient
			// per day, so appends and expiry balance.
			step := float64(86_400_000) / float64(30*n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				key, tag := benchKey(rng.IntN(n))
				at := now + int64(float64(i)*step)
				if _, _, err := apply(st, ref, key, tag, at, window.Item{Content: uint64(i&7) + 1, Mode: benchMode}, 0, &dec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSteadyStateMemory builds n recipients at the seed's steady state,
// each record from its own 30 sends through the store, and reports heap bytes
// per recipient (runtime.MemStats, after a full GC), the wall time of a forced
// full GC cycle (mark and sweep) with all of them live, and its stop-the-world
// pause.
//
//	go test -run '^$' -bench SteadyStateMemory -benchtime 1x ./store
func BenchmarkSteadyStateMemory(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	for _, tc := range []struct {
		n      int
		unique bool // each record from its own sends; else copies of 1000 templates
	}{{1_000_000, true}, {10_000_000, false}} {
		b.Run(fmt.Sprintf("recipients=%d", tc.n), func(b *testing.B) {
			for b.Loop() {
				var templates [][]byte
				if !tc.unique {
					templates = steadyTemplates(b, d, 1000, now)
				}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				st, ref := newTestStore(b, d, 0)
				if tc.unique {
					rng := rand.New(rand.NewPCG(9, 9))
					var dec window.Decision
					for i := range tc.n {
						key, tag := keyOf(fmt.Sprintf("+86%011d", i))
						for _, snd := range window.SteadyStateSends(rng, now) {
							if _, _, err := apply(st, ref, key, tag, snd.At, window.Item{Content: snd.Content}, 0, &dec); err != nil {
								b.Fatal(err)
							}
						}
					}
				} else {
					fillSteady(b, st, ref, tc.n, templates)
				}
				sweepAll(b, st, ref, 0) // reclaims nothing: trims empty slabs, as Serve's sweep does
				runtime.GC()
				runtime.ReadMemStats(&after)
				start := time.Now()
				runtime.GC()
				gc := time.Since(start)
				var final runtime.MemStats
				runtime.ReadMemStats(&final)
				pause := final.PauseNs[(final.NumGC+255)%256]
				s := st.Stats(ref)
				heap := float64(after.HeapAlloc - before.HeapAlloc)
				b.ReportMetric(heap/float64(tc.n), "heap-B/recipient")
				b.ReportMetric(float64(s.IndexBytes)/float64(tc.n), "index-B/recipient")
				b.ReportMetric(float64(s.LiveBytes)/float64(tc.n), "slot-B/recipient")
				b.ReportMetric(float64(s.SlabBytes)/float64(tc.n), "slab-B/recipient")
				b.ReportMetric(float64(st.Memory().HeldBytes)/float64(tc.n), "held-B/recipient")
				b.ReportMetric(float64(gc.Microseconds())/1000, "gc-ms")
				b.ReportMetric(float64(pause)/1000, "gc-pause-µs")
				if s.Records != int64(tc.n) {
					b.Fatalf("%d records, want %d", s.Records, tc.n)
				}
				runtime.KeepAlive(st)
			}
		})
	}
}
