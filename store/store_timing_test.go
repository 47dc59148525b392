package store

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
		if err := sp.put(key, pos, rec, other, false); err != nil {
			tb.Fatal(err)
		}
	}
}

// benchMode is the mode of the items BenchmarkStoreCheck and
// BenchmarkStoreBatch decide: check-and-record, or peek when the
// environment sets FREQRING_BENCH_MODE=peek (to tell the read path's cost
// from the write path's).
var benchMode = func() window.Mode {
	if os.Getenv("FREQRING_BENCH_MODE") == "peek" {
		return window.Peek
	}
	return window.CheckAndRecord
}()

// benchIDs reports whether the items of BenchmarkStoreCheck and
// BenchmarkStoreBatch carry request ids, as every item from the client
// does: FREQRING_BENCH_IDS=1. Without, they measure the records alone.
var benchIDs = os.Getenv("FREQRING_BENCH_IDS") == "1"

// benchID returns a random request id when benchIDs asks for them, else 0.
func benchID(rng *rand.Rand) uint64 {
	if !benchIDs {
		return 0
	}
	return rng.Uint64() | 1
}

// benchPartitions is the partition count of BenchmarkStoreBatch's stores:
// FREQRING_BENCH_PARTITIONS, or the default (0) when unset.
func benchPartitions(tb testing.TB) int {
	v := os.Getenv("FREQRING_BENCH_PARTITIONS")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPartitions {
		tb.Fatalf("FREQRING_BENCH_PARTITIONS=%q: want a partition count in [1, %d]", v, MaxPartitions)
	}
	return n
}

// sweepAll sweeps every partition of st as of cutoff plus the domain's
// longest window: it reclaims the records whose newest send is at or before
// cutoff, and compacts the others that it can.
func sweepAll(tb testing.TB, st *Store, ref Ref, cutoff int64) (reclaimed int) {
	now := cutoff + ref.rules.Longest()
	for p := range st.Partitions() {
		for pos := 0; pos >= 0; {
			var r int
			var err error
			if pos, r, err = st.Sweep(p, ref, pos, now, 2048); err != nil {
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
	for _, n := range withHundredMillion(10_000, 1_000_000, 10_000_000) {
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
				if _, _, err := apply(st, ref, key, tag, at, window.Item{Content: uint64(i&7) + 1, Mode: benchMode}, benchID(rng), &dec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSteadyStateMemory builds n recipients at the seed's steady state,
// each record from its own 30 sends through the store, and reports memory
// per recipient and a forced full GC with them live (see measureMemory).
//
//	go test -run '^$' -bench SteadyStateMemory -benchtime 1x ./store
func BenchmarkSteadyStateMemory(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	for _, tc := range []struct {
		n      int
		unique bool // each record from its own sends; else copies of 1000 templates
	}{{1_000_000, true}, {10_000_000, false}, {100_000_000, false}} {
		if tc.n > 10_000_000 && !hundredMillion() {
			continue
		}
		b.Run(fmt.Sprintf("recipients=%d", tc.n), func(b *testing.B) {
			for b.Loop() {
				measureMemory(b, d, tc.n, func(st *Store, ref Ref) {
					if !tc.unique {
						fillSteady(b, st, ref, tc.n, steadyTemplates(b, d, 1000, now))
						return
					}
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
				})
			}
		})
	}
}

// BenchmarkRecipientMemory reports memory per recipient, as
// BenchmarkSteadyStateMemory does, for recipients lighter and heavier than
// the steady state's 30 sends a day: sends=k gives each of 10M recipients
// (copies of 1000 templates) k sends at uniformly random times in the last
// 24 hours, each with its own content, recorded through Apply (sends=50 is
// the default rules' daily limit). swept=true stores each record as the
// sweep leaves it once its newest send is older than the content window
// (Domain.Compact): what a recipient that sends nothing more holds. The
// size-class histogram is logged.
//
//	go test -run '^$' -bench RecipientMemory -benchtime 1x ./store
func BenchmarkRecipientMemory(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	for _, n := range withHundredMillion(10_000_000) {
		for _, sends := range []int{1, 3, 10, 30, 50} {
			for _, swept := range []bool{false, true} {
				b.Run(fmt.Sprintf("recipients=%d/sends=%d/swept=%v", n, sends, swept), func(b *testing.B) {
					templates := spreadTemplates(b, d, 1000, sends, now)
					if swept {
						compactTemplates(b, d, templates, now)
					}
					for b.Loop() {
						measureMemory(b, d, n, func(st *Store, ref Ref) {
							fillSteady(b, st, ref, n, templates)
						})
					}
				})
			}
		}
	}
}

// compactTemplates replaces each record with what the sweep at now leaves
// of it (window.Domain.Compact): without its content logs when its newest
// send is older than the content window.
func compactTemplates(tb testing.TB, d *window.Domain, templates [][]byte, now int64) {
	tb.Helper()
	var s window.Scratch
	for i, rec := range templates {
		out, ok, err := d.Compact(&s, rec, now)
		if err != nil || ok && out == nil {
			tb.Fatalf("template %d: %v", i, err)
		}
		if ok {
			templates[i] = append([]byte(nil), out...)
		}
	}
}

// spreadTemplates returns k records of d, each holding what Apply admits of
// sends sends at uniformly random times in the day before now, each with its
// own content.
func spreadTemplates(tb testing.TB, d *window.Domain, k, sends int, now int64) [][]byte {
	tb.Helper()
	rng := rand.New(rand.NewPCG(43, uint64(sends)))
	out := make([][]byte, k)
	at := make([]int64, sends)
	var s window.Scratch
	var dec window.Decision
	for i := range out {
		for j := range at {
			at[j] = now - rng.Int64N(86_400_000)
		}
		slices.Sort(at)
		var rec []byte
		for _, t := range at {
			r, err := d.Apply(&s, rec, 0, t, window.Item{Content: rng.Uint64() | 1}, &dec)
			if err != nil {
				tb.Fatal(err)
			}
			if r != nil {
				rec = append(rec[:0], r...)
			}
		}
		out[i] = rec
	}
	return out
}

// measureMemory fills an empty store of domain d with n recipients by fill
// and reports bytes per recipient: Go heap (runtime.MemStats, after a full
// GC), what the store mapped outside the heap for its slabs, and mem-B, the
// sum; the store's own accounts (index, slots in use, slabs, held); the wall
// time of a forced full GC cycle (mark and sweep) with all of them live and
// its stop-the-world pause. It logs the size-class histogram.
func measureMemory(b *testing.B, d *window.Domain, n int, fill func(*Store, Ref)) {
	b.Helper()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	st, ref := newTestStore(b, d, 0)
	fill(st, ref)
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
	mapped := float64(st.Memory().MappedBytes)
	b.ReportMetric(heap/float64(n), "heap-B/recipient")
	b.ReportMetric(mapped/float64(n), "mapped-B/recipient")
	b.ReportMetric((heap+mapped)/float64(n), "mem-B/recipient")
	b.ReportMetric(float64(s.IndexBytes)/float64(n), "index-B/recipient")
	b.ReportMetric(float64(s.LiveBytes)/float64(n), "slot-B/recipient")
	b.ReportMetric(float64(s.SlabBytes)/float64(n), "slab-B/recipient")
	b.ReportMetric(float64(st.Memory().HeldBytes)/float64(n), "held-B/recipient")
	b.ReportMetric(float64(gc.Microseconds())/1000, "gc-ms")
	b.ReportMetric(float64(pause)/1000, "gc-pause-µs")
	if s.Records != int64(n) {
		b.Fatalf("%d records, want %d", s.Records, n)
	}
	b.Log(classHistogram(st.SizeClasses(ref), n))
	runtime.KeepAlive(st)
}

// classHistogram formats size classes on one line (the testing package
// truncates a benchmark's log after ten lines): each class as slot
// bytes:share of the n records (reserved bytes per record of the class).
func classHistogram(cs []ClassStats, n int) string {
	var sb strings.Builder
	sb.WriteString("size classes, slot bytes:share of records (reserved bytes per record):")
	for _, c := range cs {
		fmt.Fprintf(&sb, " %d:%.1f%%(%.0f)", c.Size, 100*float64(c.Records)/float64(n), float64(c.Reserved)/float64(max(c.Records, 1)))
	}
	return sb.String()
}

// BenchmarkStoreBatch measures 4-rule check-and-records in batches of 100
// recipients chosen uniformly at random among n, at the seed's steady state,
// decided one by one with Apply and with ApplyBatch in alternate batches on
// the same store, so that both see the same machine. apply-ns/decision and
// batch-ns/decision are the medians over batches of the store calls' time
// (a median, so that batches a busy machine preempted count for little), and
// speedup is their ratio. slabs=mapped is the default store; slabs=heap
// keeps its slabs on the Go heap (Config.HeapSlabs). FREQRING_BENCH_PARTITIONS
// sets the stores' partition count, FREQRING_BENCH_MODE=peek the items' mode.
//
//	go test -run '^$' -bench StoreBatch -benchtime 2s ./store
func BenchmarkStoreBatch(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, 1000, now)
	const size = 100
	for _, n := range withHundredMillion(10_000, 1_000_000, 10_000_000) {
		for _, slabs := range []string{"mapped", "heap"} {
			b.Run(fmt.Sprintf("recipients=%d/slabs=%s", n, slabs), func(b *testing.B) {
				st, err := New(Config{HeapSlabs: slabs == "heap", Partitions: benchPartitions(b)})
				if err != nil {
					b.Fatal(err)
				}
				ref := st.Bind(d)
				fillSteady(b, st, ref, n, templates)
				rng := rand.New(rand.NewPCG(3, 3))
				step := float64(86_400_000) / float64(30*n) // as in BenchmarkStoreCheck
				items := make([]BatchItem, size)
				var took [2][]time.Duration // per batch: apply, ApplyBatch
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					at := now + int64(float64(i*size)*step)
					for j := range items {
						key, tag := benchKey(rng.IntN(n))
						items[j] = BatchItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: tag,
							Item: window.Item{Content: uint64((i+j)&7) + 1, Mode: benchMode}, ID: benchID(rng)}
					}
					start := time.Now()
					if i%2 == 0 {
						for j := range items {
							x := &items[j]
							x.Seq, x.Dup, x.Err = st.Apply(x.Part, x.Ref, x.Key, x.Tag, at, x.Item, x.ID, &x.Dec)
						}
					} else {
						st.ApplyBatch(at, items)
					}
					took[i%2] = append(took[i%2], time.Since(start))
					for j := range items {
						if items[j].Err != nil {
							b.Fatal(items[j].Err)
						}
					}
				}
				if b.N < 2 {
					return
				}
				apply, batch := median(took[0]), median(took[1])
				b.ReportMetric(float64(apply.Nanoseconds())/size, "apply-ns/decision")
				b.ReportMetric(float64(batch.Nanoseconds())/size, "batch-ns/decision")
				b.ReportMetric(float64(apply)/float64(batch), "speedup")
			})
		}
	}
}

// BenchmarkStoreRecordBatch measures what a backup does with its owner's
// sends: 4-rule records of sends in batches of 100 recipients chosen
// uniformly at random among n, at the seed's steady state, each send with a
// random request id, recorded one by one with Record and with RecordBatch
// in alternate batches on the same store, so that both see the same
// machine. record-ns/send and batch-ns/send are the medians over batches of
// the store calls' time, and speedup is their ratio.
//
//	go test -run '^$' -bench StoreRecordBatch -benchtime 100000x ./store
func BenchmarkStoreRecordBatch(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, 1000, now)
	const size = 100
	for _, n := range withHundredMillion(10_000, 1_000_000, 10_000_000) {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			st, err := New(Config{Partitions: benchPartitions(b)})
			if err != nil {
				b.Fatal(err)
			}
			ref := st.Bind(d)
			fillSteady(b, st, ref, n, templates)
			rng := rand.New(rand.NewPCG(3, 3))
			step := float64(86_400_000) / float64(30*n) // as in BenchmarkStoreCheck
			items := make([]RecordItem, size)
			var took [2][]time.Duration // per batch: Record, RecordBatch
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				at := now + int64(float64(i*size)*step)
				for j := range items {
					key, tag := benchKey(rng.IntN(n))
					items[j] = RecordItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: tag, At: at,
						Item: window.Item{Content: uint64((i+j)&7) + 1}, ID: rng.Uint64() | 1}
				}
				start := time.Now()
				if i%2 == 0 {
					for j := range items {
						x := &items[j]
						x.Seq, x.Dup, x.Err = st.Record(x.Part, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, at)
					}
				} else {
					st.RecordBatch(at, items)
				}
				took[i%2] = append(took[i%2], time.Since(start))
				for j := range items {
					if items[j].Err != nil || items[j].Dup {
						b.Fatal(items[j].Err, items[j].Dup)
					}
				}
			}
			if b.N < 2 {
				return
			}
			one, batch := median(took[0]), median(took[1])
			b.ReportMetric(float64(one.Nanoseconds())/size, "record-ns/send")
			b.ReportMetric(float64(batch.Nanoseconds())/size, "batch-ns/send")
			b.ReportMetric(float64(one)/float64(batch), "speedup")
		})
	}
}

// steadyStore returns a store of benchPartitions(b) partitions holding n
// recipients of domain d, filled by fillSteady.
func steadyStore(b *testing.B, d *window.Domain, n int, templates [][]byte) *Store {
	b.Helper()
	st, err := New(Config{Partitions: benchPartitions(b)})
	if err != nil {
		b.Fatal(err)
	}
	fillSteady(b, st, st.Bind(d), n, templates)
	return st
}

// BenchmarkMergeImage measures what a restart does with each record of a
// snapshot: every partition's image of n recipients at the seed's steady
// state, merged with MergeImage into an empty store of the same layout,
// one partition after another on one goroutine (a node loads on one per
// CPU). ns/record is the time per record merged. At 100M recipients in the
// default 271 partitions each index table holds about 370k entries; 10M in
// 27 partitions (FREQRING_BENCH_PARTITIONS=27) has tables of that size.
//
//	go test -run '^$' -bench MergeImage -benchtime 3x ./store
func BenchmarkMergeImage(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, 1000, now)
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			src := steadyStore(b, d, n, templates)
			imgs := make([][]byte, src.Partitions())
			for p := range imgs {
				imgs[p], _ = src.AppendImage(nil, p)
			}
			src = nil
			runtime.GC()
			var took time.Duration
			for b.Loop() {
				b.StopTimer()
				dst, err := New(Config{Partitions: benchPartitions(b)})
				if err != nil {
					b.Fatal(err)
				}
				ref := dst.Bind(d)
				bind := func(string) (Ref, bool) { return ref, true }
				b.StartTimer()
				start := time.Now()
				for _, img := range imgs {
					if _, ms, err := dst.MergeImage(img, now, bind); err != nil || ms.Idle != 0 {
						b.Fatal(err, ms)
					}
				}
				took += time.Since(start)
				b.StopTimer()
				if got := dst.Stats(ref).Records; got != int64(n) {
					b.Fatalf("merged %d records, want %d", got, n)
				}
				dst = nil
				runtime.GC() // its mappings go with it (blocks.release)
				b.StartTimer()
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(b.N)/float64(n), "ns/record")
		})
	}
}

// BenchmarkAppendImage measures what a snapshot does with each record:
// every partition's image of n recipients at the seed's steady state,
// appended one after another into one buffer (a snapshot writes each before
// it takes the next). ns/record is the time per record; the partitions'
// locks are held that long. FREQRING_BENCH_PARTITIONS=27 gives 10M
// recipients the partitions of 100M in 271 (see BenchmarkMergeImage).
//
//	go test -run '^$' -bench AppendImage -benchtime 3x ./store
func BenchmarkAppendImage(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, 1000, now)
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			st := steadyStore(b, d, n, templates)
			var buf []byte
			b.ResetTimer()
			for b.Loop() {
				var records int64
				for p := range st.Partitions() {
					var cnt int64
					buf, cnt = st.AppendImage(buf[:0], p)
					records += cnt
				}
				if records != int64(n) {
					b.Fatalf("%d records in the images, want %d", records, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/record")
		})
	}
}

// withHundredMillion returns ns, and 100,000,000 after them when the
// environment sets FREQRING_BENCH_100M=1: that size needs about 15 GB of
// memory and minutes to fill, so no benchmark run takes it by accident.
//
//	FREQRING_BENCH_100M=1 go test -run '^$' -bench 'StoreBatch/recipients=100000000' -benchtime 2000x ./store
func withHundredMillion(ns ...int) []int {
	if hundredMillion() {
		ns = append(ns, 100_000_000)
	}
	return ns
}

// hundredMillion reports whether FREQRING_BENCH_100M=1 asks for 100M.
func hundredMillion() bool { return os.Getenv("FREQRING_BENCH_100M") == "1" }

// median returns the median of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// BenchmarkSteadyStateDrift starts from n recipients at the seed's steady
// state (copies of 1000 templates; n is 1M, or FREQRING_BENCH_DRIFT_N) and
// runs a simulated day of the steady state's traffic: 30 sends per
// recipient, each to a recipient drawn uniformly at random, with its own
// content, time moving evenly; the sweep runs every simulated 15 minutes.
// Records change size class as sends are added and expire; a slab gives a
// chunk back only when the sweep can move the records out of it (defrag).
// It reports the store's bytes per recipient at the start and at the end
// (slot-B: slots in use; slab-B: slabs reserved; held-B: everything the
// store holds; limit-B: that and the mapped blocks it keeps free for reuse,
// what its limit counts; mapped-B: blocks ever mapped), to show how far a long-running node drifts above a freshly
// loaded one, the records the sweeps moved, and the longest single sweep
// step (one partition lock hold).
//
//	go test -run '^$' -bench SteadyStateDrift -benchtime 1x ./store
func BenchmarkSteadyStateDrift(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	n := 1_000_000
	if v := os.Getenv("FREQRING_BENCH_DRIFT_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			b.Fatalf("FREQRING_BENCH_DRIFT_N=%q: want a number of recipients, at least 1000", v)
		}
	}
	templates := steadyTemplates(b, d, 1000, now)
	for b.Loop() {
		st, ref := newTestStore(b, d, 0)
		fillSteady(b, st, ref, n, templates)
		report := func(when string) {
			s, m := st.Stats(ref), st.Memory()
			b.ReportMetric(float64(s.LiveBytes)/float64(n), "slot-B/recipient-"+when)
			b.ReportMetric(float64(s.SlabBytes)/float64(n), "slab-B/recipient-"+when)
			b.ReportMetric(float64(m.HeldBytes)/float64(n), "held-B/recipient-"+when)
			// What counts toward the store's limit: held, and the mapped
			// blocks kept free for reuse.
			b.ReportMetric(float64(m.HeldBytes+st.mem.blocks.freeBytes.Load())/float64(n), "limit-B/recipient-"+when)
			b.ReportMetric(float64(m.MappedBytes)/float64(n), "mapped-B/recipient-"+when)
		}
		report("start")
		var longest time.Duration
		sweep := func(now int64) {
			for p := range st.Partitions() {
				for pos := 0; pos >= 0; {
					start := time.Now()
					var err error
					if pos, _, err = st.Sweep(p, ref, pos, now, 2048); err != nil {
						b.Fatal(err)
					}
					longest = max(longest, time.Since(start))
				}
			}
		}
		rng := rand.New(rand.NewPCG(11, 11))
		const day, sweepEvery = 86_400_000, 15 * 60_000
		sends := 30 * n
		var dec window.Decision
		nextSweep := now + sweepEvery
		for i := range sends {
			at := now + int64(i)*day/int64(sends)
			if at >= nextSweep {
				sweep(at)
				nextSweep += sweepEvery
			}
			key, tag := benchKey(rng.IntN(n))
			if _, _, err := apply(st, ref, key, tag, at, window.Item{Content: rng.Uint64() | 1}, 0, &dec); err != nil {
				b.Fatal(err)
			}
		}
		sweep(now + day)
		report("end")
		b.ReportMetric(float64(st.Stats(ref).Moved)/float64(n), "moved/recipient")
		b.ReportMetric(float64(longest.Microseconds()), "longest-sweep-step-µs")
		b.Log(classHistogram(st.SizeClasses(ref), n))
	}
}

// BenchmarkSweep measures a whole sweep pass (every partition, the node's
// step budget) over 1M recipients with 3 sends each in the last day, none
// expired: the first pass after they were written, which compacts those
// whose newest send is older than the content window, and a pass over
// records already compacted, which only reads each one's header.
//
//	go test -run '^$' -bench 'Sweep$' -benchtime 10x ./store
func BenchmarkSweep(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	const n = 1_000_000
	templates := spreadTemplates(b, d, 1000, 3, now)
	for _, pass := range []string{"first", "again"} {
		b.Run("pass="+pass, func(b *testing.B) {
			var took time.Duration
			for b.Loop() {
				b.StopTimer()
				st, ref := newTestStore(b, d, 0)
				fillSteady(b, st, ref, n, templates)
				if pass == "again" {
					sweepAll(b, st, ref, now-d.Longest())
				}
				b.StartTimer()
				start := time.Now()
				if got := sweepAll(b, st, ref, now-d.Longest()); got != 0 {
					b.Fatalf("reclaimed %d", got)
				}
				took += time.Since(start)
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(b.N)/n, "ns/record")
		})
	}
}
