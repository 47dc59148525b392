package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// dirBytes sums the sizes of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// steadyTemplates returns 1000 distinct records of d at the seed's steady
// state as of now (window.SteadyStateRecord), to copy into many recipients.
func steadyTemplates(b *testing.B, d *window.Domain, now int64) [][]byte {
	b.Helper()
	rng := rand.New(rand.NewPCG(42, 1000))
	var templates [][]byte
	for range 1000 {
		rec, err := window.SteadyStateRecord(d, rng, now)
		if err != nil {
			b.Fatal(err)
		}
		templates = append(templates, rec)
	}
	return templates
}

// BenchmarkRestart measures snapshot write and load at the seed's steady
// state, and the restart of a node holding n recipients: a crash right after
// a snapshot, so the restart loads it and replays an empty WAL tail.
//
//	go test -run '^$' -bench Restart -benchtime 1x ./node
func BenchmarkRestart(b *testing.B) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	templates := steadyTemplates(b, d, now)
	for _, n := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			for b.Loop() {
				dir := b.TempDir()
				clk := &testClock{}
				clk.set(now)
				cfg := Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1}
				a := openNode(b, cfg)
				fillSteady(b, a, n, templates)
				start := time.Now()
				if err := a.snapshot(); err != nil {
					b.Fatal(err)
				}
				write := time.Since(start)
				crash(b, a)
				disk := dirBytes(dir)
				a = nil

				start = time.Now()
				r := openNode(b, cfg)
				restart := time.Since(start)
				rs := r.Recovery()
				if rs.Records != int64(n) {
					b.Fatalf("restored %d records, want %d", rs.Records, n)
				}
				b.ReportMetric(write.Seconds(), "snapshot-write-s")
				b.ReportMetric(float64(disk)/float64(n), "disk-B/recipient")
				b.ReportMetric(float64(rs.SnapshotBytes)/1e6/rs.SnapshotTime.Seconds(), "snapshot-load-MB/s")
				b.ReportMetric(restart.Seconds(), "restart-s")
				r.Close()
			}
		})
	}
}

// fillSteady gives n recipients (keys of a splitmix64 sequence) a copy of
// one of the templates each, straight into the store.
func fillSteady(b *testing.B, a *Node, n int, templates [][]byte) {
	b.Helper()
	dv := a.view.Load().domains[DefaultDomain]
	now := a.nowMs()
	buf := make([]byte, 0, 512)
	for i := range n {
		z := uint64(i) + 0x9e3779b97f4a7c15
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		key, tag := z|1, uint16(z>>20)
		rec := append(buf[:0], templates[i%len(templates)]...)
		binary.LittleEndian.PutUint16(rec, tag)
		if _, err := a.store.MergeRecord(a.store.PartitionOf(key), dv.ref, key, rec, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay measures WAL replay: a node records sends over 1M
// recipients (batches of 100 through Check), crashes, and a new node replays
// the whole WAL (no snapshot).
//
//	go test -run '^$' -bench Replay -benchtime 1x ./node
func BenchmarkReplay(b *testing.B) {
	for b.Loop() {
		dir := b.TempDir()
		clk := &testClock{}
		clk.set(t0)
		cfg := Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1, Sync: wal.SyncNone}
		a := openNode(b, cfg)
		rng := rand.New(rand.NewPCG(1, 1))
		req := &pb.CheckRequest{Recipients: make([]string, 100), ContentHashes: make([]uint64, 100)}
		for range 30_000 { // 3M items
			for i := range req.Recipients {
				req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(1_000_000))
				req.ContentHashes[i] = uint64(1 + rng.IntN(16))
			}
			clk.advance(20 * time.Millisecond)
			if _, err := a.Check(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
		crash(b, a)
		r := openNode(b, cfg)
		rs := r.Recovery()
		b.ReportMetric(float64(rs.Replayed)/rs.ReplayTime.Seconds(), "sends/s")
		b.ReportMetric(float64(rs.ReplayBytes)/1e6/rs.ReplayTime.Seconds(), "MB/s")
		b.ReportMetric(float64(rs.ReplayBytes)/float64(rs.Replayed), "B/send")
		b.ReportMetric(float64(rs.Replayed), "sends")
		r.Close()
	}
}

// BenchmarkRestartSkipCorrupt measures the restart of issue 12 case 2: one
// flipped byte in the middle of a large active WAL segment (sends over 1M
// recipients, no snapshot: a sealed 64 MiB segment and an active one of
// about 30 MB). Open without SkipCorrupt refuses;
// with it, the node skips the one damaged record and keeps every send after
// it. It reports both restart times, a clean restart of the same WAL for
// comparison, and the sends kept and lost.
//
//	go test -run '^$' -bench RestartSkipCorrupt -benchtime 1x ./node
func BenchmarkRestartSkipCorrupt(b *testing.B) {
	for b.Loop() {
		dir := b.TempDir()
		clk := &testClock{}
		clk.set(t0)
		cfg := Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1, Sync: wal.SyncNone}
		a := openNode(b, cfg)
		rng := rand.New(rand.NewPCG(1, 1))
		req := &pb.CheckRequest{Recipients: make([]string, 100), ContentHashes: make([]uint64, 100)}
		var admitted int64
		for range 45_000 { // 4.5M items: a sealed segment and a large active one
			for i := range req.Recipients {
				req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(1_000_000))
				req.ContentHashes[i] = uint64(1 + rng.IntN(16))
			}
			clk.advance(20 * time.Millisecond)
			resp, err := a.Check(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			for _, ok := range resp.Admitted {
				if ok {
					admitted++
				}
			}
		}
		segs := a.dur.log.Segments()
		crash(b, a)
		seg := segs[len(segs)-1] // the active one
		if seg.Size < 20<<20 {
			b.Fatalf("active segment of %d bytes, want a large one", seg.Size)
		}

		start := time.Now()
		clean := openNode(b, cfg)
		cleanRestart := time.Since(start)
		crash(b, clean)

		f, err := os.OpenFile(seg.Path, os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		off := min(15_000_000, seg.Size/2)
		var one [1]byte
		f.ReadAt(one[:], off)
		one[0] ^= 0x01
		f.WriteAt(one[:], off)
		f.Close()

		start = time.Now()
		n, _ := New(cfg)
		err = n.Open(context.Background())
		refuse := time.Since(start)
		if !errors.Is(err, wal.ErrCorrupt) {
			b.Fatalf("Open of a damaged active segment: %v, want wal.ErrCorrupt", err)
		}
		cfg.SkipCorrupt = true
		start = time.Now()
		r := openNode(b, cfg)
		restart := time.Since(start)
		rs := r.Recovery()
		st := r.Stats().WAL
		b.ReportMetric(float64(seg.Size)/1e6, "active-MB")
		b.ReportMetric(cleanRestart.Seconds(), "clean-restart-s")
		b.ReportMetric(refuse.Seconds(), "refuse-s")
		b.ReportMetric(restart.Seconds(), "skip-restart-s")
		b.ReportMetric(float64(st.SkippedBytes), "skipped-B")
		b.ReportMetric(float64(rs.Replayed), "sends-kept")
		b.ReportMetric(float64(admitted-rs.Replayed), "sends-lost")
		r.Close()
	}
}
