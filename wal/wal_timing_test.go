package wal

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

func BenchmarkAppendRecord(b *testing.B) {
	for _, size := range []int{16, 1 << 10, 64 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			p := bytes.Repeat([]byte("0123456789"), size/10+1)[:size]
			buf := make([]byte, 0, recordHeaderLen+size)
			b.SetBytes(int64(recordHeaderLen + size))
			b.ReportAllocs()
			for b.Loop() {
				buf = appendRecord(buf[:0], recData, p)
			}
		})
	}
}

func BenchmarkReadRecord(b *testing.B) {
	for _, size := range []int{16, 1 << 10, 64 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			rec := appendRecord(nil, recData, bytes.Repeat([]byte{'x'}, size))
			b.SetBytes(int64(len(rec)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, _, err := readRecord(rec, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAppendParallel appends ~1 KiB payloads (about 100 sends of ~10
// bytes) from 1 or 64 goroutines per CPU, as the node's gRPC handlers would,
// into pre-zeroed segments (the preparer's spares) or plain growing files
// (the layout before spares; noSpare). With 1 goroutine per CPU a batch holds
// about 2 records and the fsync dominates, as in the node. Timing starts in a
// fresh segment (cut from a spare when prezeroed) with the preparer idle, so
// zeroing shows up only for spares the run itself uses up.
func BenchmarkAppendParallel(b *testing.B) {
	payload := bytes.Repeat([]byte("recipient!"), 100) // 1000 bytes
	for _, policy := range []SyncPolicy{SyncBatch, SyncInterval, SyncNone} {
		for _, par := range []int{1, 64} {
			for _, layout := range []string{"prezeroed", "plain"} {
				b.Run(fmt.Sprintf("%s/g=%dxCPU/%s", policy, par, layout), func(b *testing.B) {
					hook, ready := spareHook()
					prezeroed := layout == "prezeroed"
					l, err := Open(Options{Dir: b.TempDir(), Sync: policy, noSpare: !prezeroed, testHookPrepared: hook})
					if err != nil {
						b.Fatal(err)
					}
					defer l.Close()
					if prezeroed {
						<-ready
					}
					if _, err := l.Rotate(); err != nil {
						b.Fatal(err)
					}
					if prezeroed {
						<-ready // the next spare: the preparer is idle
					}
					b.SetBytes(int64(len(payload)))
					b.SetParallelism(par)
					b.ReportAllocs()
					b.ResetTimer()
					start := l.Stats()
					b.RunParallel(func(pb *testing.PB) {
						ctx := context.Background()
						for pb.Next() {
							if _, err := l.Append(ctx, payload); err != nil {
								b.Error(err)
								return
							}
						}
					})
					b.StopTimer()
					st := l.Stats()
					fsyncs := st.Fsyncs - start.Fsyncs
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
					b.ReportMetric(float64(st.Appends)/float64(max(st.Batches, 1)), "records/batch")
					b.ReportMetric(float64(fsyncs)/b.Elapsed().Seconds(), "fsyncs/s")
					b.ReportMetric(float64(st.FsyncNanos-start.FsyncNanos)/1e3/float64(max(fsyncs, 1)), "µs/fsync")
					b.ReportMetric(float64(st.PreparedCuts-start.PreparedCuts), "prepared-cuts")
					b.ReportMetric(float64(st.Rotations-start.Rotations), "rotations")
				})
			}
		}
	}
}

// BenchmarkFsyncPath is one caller appending under SyncBatch, an fsync per
// Append, through the io_uring (where the kernel allows one) and with
// fsync(2): what a lone Check waits for on an idle node.
//
//	go test -run '^$' -bench FsyncPath -benchtime 2000x -count 3 ./wal
func BenchmarkFsyncPath(b *testing.B) {
	payload := bytes.Repeat([]byte("recipient!"), 10)
	for _, plain := range []bool{false, true} {
		name := "io_uring"
		if plain {
			name = "fsync(2)"
		}
		b.Run(name, func(b *testing.B) {
			l, err := Open(Options{Dir: b.TempDir(), PlainFsync: plain})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if !plain && l.ur == nil {
				b.Skip("no io_uring here")
			}
			for b.Loop() {
				if _, err := l.Append(context.Background(), payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
