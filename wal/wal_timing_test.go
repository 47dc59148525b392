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
// bytes) from 64 goroutines per CPU, as the node's gRPC handlers would.
func BenchmarkAppendParallel(b *testing.B) {
	payload := bytes.Repeat([]byte("recipient!"), 100) // 1000 bytes
	for _, policy := range []SyncPolicy{SyncBatch, SyncInterval, SyncNone} {
		b.Run(policy.String(), func(b *testing.B) {
			l, err := Open(Options{Dir: b.TempDir(), Sync: policy})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.SetBytes(int64(len(payload)))
			b.SetParallelism(64)
			b.ReportAllocs()
			b.ResetTimer()
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
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(st.Appends)/float64(max(st.Batches, 1)), "records/batch")
			b.ReportMetric(float64(st.Fsyncs)/b.Elapsed().Seconds(), "fsyncs/s")
		})
	}
}
