package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestOpenNewDir(t *testing.T) {
	clk := newTestClock()
	clk.set(3)
	dir := filepath.Join(t.TempDir(), "a", "b")
	l := openT(t, Options{Dir: dir, Now: clk.Now})
	segs := l.Segments()
	want := SegmentInfo{
		Seq: 1, Path: filepath.Join(dir, "0000000000000001.wal"), Size: segHeaderRecordLen,
		Created: clk.at(3), First: Position{Seq: 1, Offset: segHeaderRecordLen},
	}
	if len(segs) != 1 || segs[0] != want {
		t.Fatalf("Segments() = %+v, want [%+v]", segs, want)
	}
	b, err := os.ReadFile(want.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, appendSegHeader(nil, segHeader{version: formatVersion, seq: 1, created: clk.at(3)})) {
		t.Fatalf("segment file = % x", b)
	}
	if got := replayAll(t, l, Position{}); len(got) != 0 {
		t.Fatalf("Replay of an empty log = %v", got)
	}
}

func TestOpenOptions(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no dir", Options{}, "Options.Dir is empty"},
		{"negative segment bytes", Options{Dir: dir, SegmentBytes: -1}, "Options.SegmentBytes -1 out of range [30, "},
		{"tiny segment bytes", Options{Dir: dir, SegmentBytes: 29}, "Options.SegmentBytes 29 out of range"},
		{"unknown sync policy", Options{Dir: dir, Sync: 3}, "Options.Sync 3 out of range [0, 2]"},
		{"negative sync interval", Options{Dir: dir, SyncInterval: -time.Second}, "Options.SyncInterval -1s out of range"},
		{"negative batch bytes", Options{Dir: dir, MaxBatchBytes: -1}, "Options.MaxBatchBytes -1 out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Open(tt.opts)
			if err == nil {
				l.Close()
				t.Fatalf("Open succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestAppendReplayReopen(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, Options{Dir: dir})
	var want []rec
	for i := range 100 {
		r := appendT(t, l, fmt.Sprintf("payload-%d-%s", i, strings.Repeat("x", i)))
		if len(want) > 0 && r.pos.Compare(want[len(want)-1].pos) <= 0 {
			t.Fatalf("position %v not after %v", r.pos, want[len(want)-1].pos)
		}
		want = append(want, r)
	}
	if want[0].pos != l.Segments()[0].First {
		t.Fatalf("first position %v, want %v", want[0].pos, l.Segments()[0].First)
	}
	equalRecs(t, replayAll(t, l, Position{}), want)
	equalRecs(t, replayAll(t, l, want[50].pos), want[50:])
	equalRecs(t, replayAll(t, l, Position{Seq: 1, Offset: want[50].pos.Offset - 1}), want[50:])
	equalRecs(t, replayAll(t, l, Position{Seq: 2}), nil)

	stop := errors.New("stop")
	n := 0
	err := l.Replay(Position{}, func(Position, []byte) error {
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	if err != stop || n != 3 {
		t.Fatalf("Replay with a failing fn = %v after %d calls, want %v after 3", err, n, stop)
	}
	if st := l.Stats(); st.Appends != 100 || st.Batches != 100 || st.Fsyncs < 100 {
		t.Fatalf("Stats = %+v", st)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openT(t, Options{Dir: dir})
	equalRecs(t, replayAll(t, l, Position{}), want)
	r := appendT(t, l, "after reopen")
	if want := (Position{Seq: 1, Offset: l.Segments()[0].Size - int64(recordHeaderLen+len("after reopen"))}); r.pos != want {
		t.Fatalf("append after reopen at %v, want %v (continuing segment 1)", r.pos, want)
	}
	if segs := l.Segments(); len(segs) != 1 {
		t.Fatalf("reopen cut a new segment: %+v", segs)
	}
}

// TestTornTail cuts the last segment at every byte offset of its records, by
// truncating it and by zeroing it from there, and checks that Open keeps
// exactly the records before the cut, and that the log then works and
// survives a reopen (etcd TestOpenOnTornWrite). The last segment is a plain
// file, or a pre-zeroed spare whose records fill only its start: zeros after
// a complete record are then its unused part, not a torn tail.
func TestTornTail(t *testing.T) {
	for _, layout := range []string{"plain", "prezeroed"} {
		t.Run(layout, func(t *testing.T) { testTornTail(t, layout == "prezeroed") })
	}
}

func testTornTail(t *testing.T, prezeroed bool) {
	const segBytes = 4 << 10
	base := t.TempDir()
	src := filepath.Join(base, "src")
	hook, ready := spareHook()
	l := openT(t, Options{Dir: src, Sync: SyncNone, SegmentBytes: segBytes, noSpare: !prezeroed, PrepareAfter: -1, testHookPrepared: hook})
	var sealed, last []rec
	for i := range 3 {
		sealed = append(sealed, appendT(t, l, fmt.Sprintf("sealed-%d", i)))
	}
	wantPrepared := int64(0)
	if prezeroed {
		<-ready
		wantPrepared = 1
	}
	if _, err := l.Rotate(); err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().PreparedCuts; got != wantPrepared {
		t.Fatalf("Stats().PreparedCuts = %d, want %d", got, wantPrepared)
	}
	for i := range 5 {
		// No zero bytes in payloads, so zeroing always damages a record.
		last = append(last, appendT(t, l, fmt.Sprintf("last-%d-%s", i, strings.Repeat("y", 7*i))))
	}
	written := int(l.Segments()[1].Size)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lastName := segmentName(2)
	orig, err := os.ReadFile(filepath.Join(src, lastName))
	if err != nil {
		t.Fatal(err)
	}
	if wantLen := map[bool]int{false: written, true: segBytes}[prezeroed]; len(orig) != wantLen || !allZero(orig[written:]) {
		t.Fatalf("segment 2: %d bytes, %d written, want %d bytes with zeros after the records", len(orig), written, wantLen)
	}
	opts := func(dir string, logger *slog.Logger) Options {
		// No preparer: no cut here could use a spare (Open cuts before it starts).
		return Options{Dir: dir, Sync: SyncNone, SegmentBytes: segBytes, noSpare: true, Logger: logger}
	}

	for _, mode := range []string{"truncate", "zero"} {
		for cut := range written {
			name := fmt.Sprintf("%s at %d", mode, cut)
			dir := filepath.Join(base, fmt.Sprintf("%s-%d", mode, cut))
			copyDir(t, src, dir)
			damaged := orig[:cut]
			if mode == "zero" {
				damaged = append(append([]byte(nil), orig[:cut]...), make([]byte, len(orig)-cut)...)
			}
			if err := os.WriteFile(filepath.Join(dir, lastName), damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			want := append([]rec(nil), sealed...)
			good := int64(0) // end of the last complete record before the cut
			if cut >= segHeaderRecordLen {
				good = segHeaderRecordLen
			}
			for _, r := range last {
				end := r.pos.Offset + int64(recordHeaderLen+len(r.payload))
				if end > int64(cut) {
					break
				}
				want, good = append(want, r), end
			}
			// Only zeros after a complete header and records: a clean end.
			clean := good > 0 && allZero(damaged[good:])
			wantTorn := int64(len(damaged)) - good
			if clean {
				wantTorn = 0
			}

			var logs logRecorder
			l, err := Open(opts(dir, logs.logger()))
			if err != nil {
				t.Fatalf("%s: Open: %v", name, err)
			}
			equalRecs(t, replayAll(t, l, Position{}), want)
			if got := l.Stats().TornBytes; got != wantTorn {
				t.Fatalf("%s: Stats().TornBytes = %d, want %d", name, got, wantTorn)
			}
			logged := strings.Contains(logs.String(), fmt.Sprintf("msg=\"wal: truncated torn tail\" file=%s offset=%d", filepath.Join(dir, lastName), good))
			if logged != (wantTorn > 0) || (wantTorn == 0 && strings.Contains(logs.String(), "torn")) {
				t.Fatalf("%s: want a log of the truncation at %d: %v; got:\n%s", name, good, wantTorn > 0, logs.String())
			}
			if wantLen := map[bool]int64{false: good, true: int64(len(damaged))}[clean]; good > 0 && fileSize(t, filepath.Join(dir, lastName)) != wantLen {
				t.Fatalf("%s: segment 2 is %d bytes after Open, want %d", name, fileSize(t, filepath.Join(dir, lastName)), wantLen)
			}
			if got := l.Segments()[1].Size; good > 0 && got != good {
				t.Fatalf("%s: Segments()[1].Size = %d, want %d", name, got, good)
			}
			after := appendT(t, l, "after")
			if after.pos.Seq != 2 {
				t.Fatalf("%s: append after repair went to %v, want segment 2", name, after.pos)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("%s: Close: %v", name, err)
			}

			l, err = Open(opts(dir, nil))
			if err != nil {
				t.Fatalf("%s: second Open: %v", name, err)
			}
			equalRecs(t, replayAll(t, l, Position{}), append(want, after))
			if st := l.Stats(); st.TornBytes != 0 {
				t.Fatalf("%s: second Open cut %d bytes", name, st.TornBytes)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(dir)
		}
	}
}

// makeSealed writes a log of three segments, each with four records, and
// returns its directory and records.
func makeSealed(t *testing.T) (string, []rec) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "log")
	l := openT(t, Options{Dir: dir, Sync: SyncNone})
	var recs []rec
	for s := range 3 {
		if s > 0 {
			if _, err := l.Rotate(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 4 {
			recs = append(recs, appendT(t, l, fmt.Sprintf("segment %d record %d %s", s+1, i, strings.Repeat("z", 10*i))))
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, recs
}

func recLen(r rec) int64 { return int64(recordHeaderLen + len(r.payload)) }

func TestSealedCorruption(t *testing.T) {
	seg1 := segmentName(1)
	tests := []struct {
		name     string
		damage   func(b []byte, recs []rec) []byte // recs of segment 1
		off      func(recs []rec) int64            // offset named in the error
		reason   string
		skipped  func(b []byte, recs []rec) int64
		survives func(i int) bool // which of segment 1's records survive SkipCorrupt
	}{
		{
			name:     "flipped payload byte",
			damage:   func(b []byte, recs []rec) []byte { b[recs[1].pos.Offset+12] ^= 0x40; return b },
			off:      func(recs []rec) int64 { return recs[1].pos.Offset },
			reason:   "crc ",
			skipped:  func(b []byte, recs []rec) int64 { return recLen(recs[1]) },
			survives: func(i int) bool { return i != 1 },
		},
		{
			name:     "flipped size byte",
			damage:   func(b []byte, recs []rec) []byte { b[recs[2].pos.Offset] ^= 0x01; return b },
			off:      func(recs []rec) int64 { return recs[2].pos.Offset },
			reason:   "",
			skipped:  func(b []byte, recs []rec) int64 { return recLen(recs[2]) },
			survives: func(i int) bool { return i != 2 },
		},
		{
			name: "zeroed record",
			damage: func(b []byte, recs []rec) []byte {
				clear(b[recs[1].pos.Offset : recs[1].pos.Offset+recLen(recs[1])])
				return b
			},
			off:      func(recs []rec) int64 { return recs[1].pos.Offset },
			reason:   "all-zero header",
			skipped:  func(b []byte, recs []rec) int64 { return recLen(recs[1]) },
			survives: func(i int) bool { return i != 1 },
		},
		{
			name:     "truncated",
			damage:   func(b []byte, recs []rec) []byte { return b[:recs[2].pos.Offset+5] },
			off:      func(recs []rec) int64 { return recs[2].pos.Offset },
			reason:   "short header: 5 of 9 bytes",
			skipped:  func(b []byte, recs []rec) int64 { return 5 },
			survives: func(i int) bool { return i < 2 },
		},
		{
			// Sealed segments are truncated to their records before the fsync
			// that seals them, so they never end in preallocated zeros.
			name:     "zero tail",
			damage:   func(b []byte, recs []rec) []byte { return append(b, make([]byte, 100)...) },
			off:      func(recs []rec) int64 { return recs[3].pos.Offset + recLen(recs[3]) },
			reason:   "all-zero header",
			skipped:  func(b []byte, recs []rec) int64 { return 100 },
			survives: func(i int) bool { return true },
		},
		{
			name:     "damaged header",
			damage:   func(b []byte, recs []rec) []byte { b[15] ^= 0xff; return b },
			off:      func(recs []rec) int64 { return 0 },
			reason:   "crc ",
			skipped:  func(b []byte, recs []rec) int64 { return segHeaderRecordLen },
			survives: func(i int) bool { return true },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, recs := makeSealed(t)
			path := filepath.Join(dir, seg1)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b = tt.damage(b, recs[:4])
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}

			l, err := Open(Options{Dir: dir})
			if err == nil {
				l.Close()
				t.Fatal("Open of a damaged sealed segment succeeded")
			}
			wantMsg := fmt.Sprintf("%s offset %d: %s", path, tt.off(recs[:4]), tt.reason)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), wantMsg) {
				t.Fatalf("Open: %v\nwant ErrCorrupt containing %q", err, wantMsg)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
				t.Fatal("Open changed a damaged sealed segment")
			}

			var logs logRecorder
			l = openT(t, Options{Dir: dir, SkipCorrupt: true, Logger: logs.logger()})
			if got, want := l.Stats().SkippedBytes, tt.skipped(b, recs[:4]); got != want {
				t.Fatalf("Stats().SkippedBytes = %d, want %d", got, want)
			}
			if !strings.Contains(logs.String(), "msg=\"wal: skipped damaged bytes\" file="+path) {
				t.Fatalf("no log of the skip:\n%s", logs.String())
			}
			var want []rec
			for i, r := range recs {
				if i >= 4 || tt.survives(i) {
					want = append(want, r)
				}
			}
			equalRecs(t, replayAll(t, l, Position{}), want)
			want = append(want, appendT(t, l, "after"))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = openT(t, Options{Dir: dir, SkipCorrupt: true})
			equalRecs(t, replayAll(t, l, Position{}), want)
		})
	}
}

func TestOpenRefuses(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string, recs []rec)
		corrupt bool // errors.Is(err, ErrCorrupt)
		want    string
	}{
		{
			name: "missing segment",
			damage: func(t *testing.T, dir string, recs []rec) {
				if err := os.Remove(filepath.Join(dir, segmentName(2))); err != nil {
					t.Fatal(err)
				}
			},
			corrupt: true,
			want:    "0000000000000003.wal follows " + "%s" + "/0000000000000001.wal: segments missing",
		},
		{
			name: "unknown record type in the last segment",
			damage: func(t *testing.T, dir string, recs []rec) {
				// An intact record of a type this build does not know: a newer
				// writer, not a torn write, so it must not be truncated away.
				path := filepath.Join(dir, segmentName(3))
				b, _ := os.ReadFile(path)
				off := recs[9].pos.Offset
				b[off+8] = 9
				copy(b[off+4:], appendRecord(nil, 9, []byte(recs[9].payload))[4:8])
				os.WriteFile(path, b, 0o644)
			},
			corrupt: true,
			want:    "0000000000000003.wal offset %d: unknown record type 9",
		},
		{
			name: "unknown format version",
			damage: func(t *testing.T, dir string, recs []rec) {
				path := filepath.Join(dir, segmentName(3))
				b, _ := os.ReadFile(path)
				h := appendSegHeader(nil, segHeader{version: 2, seq: 3, created: 1})
				os.WriteFile(path, append(h, b[segHeaderRecordLen:]...), 0o644)
			},
			want: "0000000000000003.wal: format version 2, this build reads version 1",
		},
		{
			name: "renamed segment",
			damage: func(t *testing.T, dir string, recs []rec) {
				two, three := filepath.Join(dir, segmentName(2)), filepath.Join(dir, segmentName(3))
				os.Rename(two, two+".x")
				os.Rename(three, two)
				os.Rename(two+".x", three)
			},
			corrupt: true,
			want:    "0000000000000002.wal offset 0: header says segment 3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, recs := makeSealed(t)
			tt.damage(t, dir, recs)
			l, err := Open(Options{Dir: dir})
			if err == nil {
				l.Close()
				t.Fatal("Open succeeded")
			}
			want := tt.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, dir)
			} else if strings.Contains(want, "%d") {
				want = fmt.Sprintf(want, recs[9].pos.Offset)
			}
			if errors.Is(err, ErrCorrupt) != tt.corrupt || !strings.Contains(err.Error(), want) {
				t.Fatalf("Open: %v\nwant an error containing %q, errors.Is(err, ErrCorrupt) == %v", err, want, tt.corrupt)
			}
		})
	}
}

func TestOpenRemovesUnfinishedCut(t *testing.T) {
	dir, recs := makeSealed(t)
	tmp := filepath.Join(dir, segmentName(4)+tmpExt)
	spare := filepath.Join(dir, spareName)
	other := filepath.Join(dir, "snapshot.tmp")
	for _, p := range []string{tmp, spare, other} {
		if err := os.WriteFile(p, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs logRecorder
	l := openT(t, Options{Dir: dir, noSpare: true, Logger: logs.logger()})
	equalRecs(t, replayAll(t, l, Position{}), recs)
	for _, p := range []string{tmp, spare} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("leftover %s not removed: %v", p, err)
		}
		if !strings.Contains(logs.String(), "file="+p) {
			t.Fatalf("no log of the removal of %s:\n%s", p, logs.String())
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("Open removed a file it does not own: %v", err)
	}
}

// TestConcurrentAppend appends from many goroutines and checks that every
// acknowledged record survives a reopen, in each goroutine's order.
func TestConcurrentAppend(t *testing.T) {
	const goroutines, perG = 16, 200
	dir := t.TempDir()
	l := openT(t, Options{Dir: dir, SegmentBytes: 16 << 10})
	acked := make([][]Position, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				pos, err := l.Append(context.Background(), fmt.Appendf(nil, "%02d:%04d", g, i))
				if err != nil {
					t.Errorf("goroutine %d append %d: %v", g, i, err)
					return
				}
				acked[g] = append(acked[g], pos)
			}
		})
	}
	wg.Wait()
	st := l.Stats()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st.Appends != goroutines*perG {
		t.Fatalf("Stats().Appends = %d, want %d", st.Appends, goroutines*perG)
	}
	t.Logf("%d appends in %d batches (%.1f per batch), %d rotations", st.Appends, st.Batches, float64(st.Appends)/float64(st.Batches), st.Rotations)
	if st.Batches >= st.Appends {
		t.Fatalf("%d appends in %d batches: no group commit", st.Appends, st.Batches)
	}

	l = openT(t, Options{Dir: dir})
	next := make([]int, goroutines)
	var prev Position
	for _, r := range replayAll(t, l, Position{}) {
		var g, i int
		if _, err := fmt.Sscanf(r.payload, "%02d:%04d", &g, &i); err != nil {
			t.Fatalf("payload %q: %v", r.payload, err)
		}
		if i != next[g] {
			t.Fatalf("goroutine %d: record %d, want %d", g, i, next[g])
		}
		if acked[g][i] != r.pos {
			t.Fatalf("goroutine %d record %d replayed at %v, Append returned %v", g, i, r.pos, acked[g][i])
		}
		if r.pos.Compare(prev) <= 0 {
			t.Fatalf("replay out of order: %v after %v", r.pos, prev)
		}
		next[g]++
		prev = r.pos
	}
	for g, n := range next {
		if n != perG {
			t.Fatalf("goroutine %d: %d records replayed, want %d", g, n, perG)
		}
	}
}

// TestGroupCommit holds the flusher on its first batch, queues more appends,
// and checks that they go out as one batch with one write and one fsync.
func TestGroupCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		l := openT(t, Options{Dir: t.TempDir(), testHookFlush: g.wait})
		before := l.Stats()
		var wg sync.WaitGroup
		wg.Go(func() { appendT(t, l, "first") })
		synctest.Wait() // the flusher holds the first batch
		const more = 10
		for i := range more {
			wg.Go(func() { appendT(t, l, fmt.Sprint("more-", i)) })
		}
		synctest.Wait() // all queued in the next batch
		g.release()
		wg.Wait()
		st := l.Stats()
		if st.Appends != more+1 || st.Batches != 2 || st.Fsyncs-before.Fsyncs != 2 {
			t.Fatalf("%d appends in %d batches with %d fsyncs, want %d in 2 with 2", st.Appends, st.Batches, st.Fsyncs-before.Fsyncs, more+1)
		}
	})
}

func TestAppendContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		g := newGate()
		l := openT(t, Options{Dir: dir, testHookFlush: g.wait, MaxBatchBytes: 100})

		canceled, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := l.Append(canceled, []byte("never")); err != context.Canceled {
			t.Fatalf("Append with a done ctx = %v, want context.Canceled", err)
		}

		var wg sync.WaitGroup
		wg.Go(func() { appendT(t, l, "first") })
		synctest.Wait() // the flusher holds "first"

		// Waiting for its batch: the record may still be written.
		ctx1, cancel1 := context.WithCancel(context.Background())
		var err1 error
		wg.Go(func() { _, err1 = l.Append(ctx1, []byte(strings.Repeat("w", 60))) })
		synctest.Wait()
		// Waiting for room: the pending batch is full, so this is not queued.
		ctx2, cancel2 := context.WithCancel(context.Background())
		var err2 error
		wg.Go(func() { _, err2 = l.Append(ctx2, []byte(strings.Repeat("r", 60))) })
		synctest.Wait()
		cancel1()
		cancel2()
		g.release()
		wg.Wait()
		if !errors.Is(err1, context.Canceled) || !strings.Contains(err1.Error(), "may still be written") {
			t.Fatalf("Append canceled while waiting for its batch = %v", err1)
		}
		if err2 != context.Canceled {
			t.Fatalf("Append canceled while waiting for room = %v, want context.Canceled", err2)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = openT(t, Options{Dir: dir})
		if got, want := payloads(replayAll(t, l, Position{})), []string{"first", strings.Repeat("w", 60)}; !slicesEqual(got, want) {
			t.Fatalf("replayed %q, want %q", got, want)
		}
	})
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// TestMaxBatchBytes checks that a full batch makes Appends wait for the next one.
func TestMaxBatchBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		l := openT(t, Options{Dir: t.TempDir(), testHookFlush: g.wait, MaxBatchBytes: 100})
		pending := func() int {
			synctest.Wait()
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.pending.n
		}
		var wg sync.WaitGroup
		wg.Go(func() { appendT(t, l, "first") })
		synctest.Wait()                // the flusher holds "first"
		p40 := strings.Repeat("p", 40) // 49 bytes framed: two fit in 100
		for range 5 {
			wg.Go(func() { appendT(t, l, p40) })
			synctest.Wait()
		}
		for i, want := range []int{2, 2, 1, 0} {
			if n := pending(); n != want {
				t.Fatalf("step %d: pending batch holds %d records, want %d", i, n, want)
			}
			g.step() // write one batch, take the next
		}
		g.release()
		wg.Wait()
		if st := l.Stats(); st.Appends != 6 || st.Batches != 4 {
			t.Fatalf("%d appends in %d batches, want 6 in 4 (1+2+2+1)", st.Appends, st.Batches)
		}
	})
}

func TestRotateSegmentsRemoveBefore(t *testing.T) {
	clk := newTestClock()
	dir := t.TempDir()
	const payload = "0123456789" // 19 bytes framed
	segBytes := int64(segHeaderRecordLen + 3*19)
	opts := Options{Dir: dir, Now: clk.Now, SegmentBytes: segBytes}
	l := openT(t, opts)
	var recs []rec
	for i := range 7 {
		clk.set(int64(i + 1))
		recs = append(recs, appendT(t, l, payload))
		if err := l.Sync(); err != nil { // the flusher has also done any rotation
			t.Fatal(err)
		}
	}
	// Appends 3 and 6 filled segments 1 and 2; their batches cut 2 and 3.
	clk.set(10)
	first, err := l.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	if first != (Position{Seq: 4, Offset: segHeaderRecordLen}) {
		t.Fatalf("Rotate() = %v, want segment 4 offset %d", first, segHeaderRecordLen)
	}
	if r := appendT(t, l, payload); r.pos != first {
		t.Fatalf("append after Rotate at %v, want %v", r.pos, first)
	} else {
		recs = append(recs, r)
	}
	want := []SegmentInfo{
		{Seq: 1, Size: segBytes, Created: clk.at(0), Sealed: true},
		{Seq: 2, Size: segBytes, Created: clk.at(3), Sealed: true},
		{Seq: 3, Size: segHeaderRecordLen + 19, Created: clk.at(6), Sealed: true},
		{Seq: 4, Size: segHeaderRecordLen + 19, Created: clk.at(10)},
	}
	for i := range want {
		want[i].Path = filepath.Join(dir, segmentName(want[i].Seq))
		want[i].First = Position{Seq: want[i].Seq, Offset: segHeaderRecordLen}
	}
	checkSegs := func(got, want []SegmentInfo) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("Segments() = %+v\nwant %+v", got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("Segments()[%d] = %+v, want %+v", i, got[i], want[i])
			}
		}
	}
	checkSegs(l.Segments(), want)
	if st := l.Stats(); st.Rotations != 3 {
		t.Fatalf("Stats().Rotations = %d, want 3", st.Rotations)
	}
	for i, r := range recs[:7] {
		if wantSeq := uint64(i/3 + 1); r.pos.Seq != wantSeq {
			t.Fatalf("record %d in segment %d, want %d", i, r.pos.Seq, wantSeq)
		}
	}
	equalRecs(t, replayAll(t, l, Position{}), recs)
	equalRecs(t, replayAll(t, l, Position{Seq: 3}), recs[6:])

	n, err := l.RemoveBefore(3)
	if err != nil || n != 2 {
		t.Fatalf("RemoveBefore(3) = %d, %v; want 2, nil", n, err)
	}
	checkSegs(l.Segments(), want[2:])
	// The preparer's spare segment may or may not be there yet.
	if names := slices.DeleteFunc(dirNames(t, dir), func(n string) bool { return n == spareName }); !slicesEqual(names, []string{segmentName(3), segmentName(4)}) {
		t.Fatalf("files after RemoveBefore(3): %q", names)
	}
	equalRecs(t, replayAll(t, l, Position{}), recs[6:])

	n, err = l.RemoveBefore(math.MaxUint64) // never the active segment
	if err != nil || n != 1 {
		t.Fatalf("RemoveBefore(max) = %d, %v; want 1, nil", n, err)
	}
	checkSegs(l.Segments(), want[3:])
	if n, err := l.RemoveBefore(math.MaxUint64); n != 0 || err != nil {
		t.Fatalf("RemoveBefore(max) again = %d, %v; want 0, nil", n, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l = openT(t, opts)
	checkSegs(l.Segments(), want[3:])
	equalRecs(t, replayAll(t, l, Position{}), recs[7:])
}

// TestOpenFullSegment checks that Open starts a new segment when the last one is full.
func TestOpenFullSegment(t *testing.T) {
	clk := newTestClock()
	dir := t.TempDir()
	l := openT(t, Options{Dir: dir, Now: clk.Now})
	r := appendT(t, l, strings.Repeat("f", 100))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	clk.set(1)
	l = openT(t, Options{Dir: dir, Now: clk.Now, SegmentBytes: 100})
	segs := l.Segments()
	if len(segs) != 2 || !segs[0].Sealed || segs[1].Sealed || segs[1].Created != clk.at(1) {
		t.Fatalf("Segments() = %+v", segs)
	}
	if r2 := appendT(t, l, "next"); r2.pos.Seq != 2 {
		t.Fatalf("append went to %v, want segment 2", r2.pos)
	}
	equalRecs(t, replayAll(t, l, Position{})[:1], []rec{r})
}

func TestSyncPolicies(t *testing.T) {
	tests := []struct {
		policy     SyncPolicy
		perAppend  int64
		syncAdds   int64
		closeAdded int64
	}{
		{SyncBatch, 1, 1, 1},
		{SyncNone, 0, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			l, err := Open(Options{Dir: t.TempDir(), Sync: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			base := l.Stats().Fsyncs
			for range 3 {
				appendT(t, l, "x")
			}
			if got := l.Stats().Fsyncs - base; got != 3*tt.perAppend {
				t.Fatalf("%d fsyncs for 3 appends, want %d", got, 3*tt.perAppend)
			}
			base = l.Stats().Fsyncs
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			if got := l.Stats().Fsyncs - base; got != tt.syncAdds {
				t.Fatalf("Sync did %d fsyncs, want %d", got, tt.syncAdds)
			}
			base = l.Stats().Fsyncs
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if got := l.Stats().Fsyncs - base; got != tt.closeAdded {
				t.Fatalf("Close did %d fsyncs, want %d", got, tt.closeAdded)
			}
		})
	}
}

// TestSyncInterval fires the injected ticker and counts fsyncs.
func TestSyncInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ticks := make(chan time.Time)
		var interval time.Duration
		stopped := false
		l := openT(t, Options{
			Dir:          t.TempDir(),
			Sync:         SyncInterval,
			SyncInterval: 5 * time.Millisecond,
			NewTicker: func(d time.Duration) (<-chan time.Time, func()) {
				interval = d
				return ticks, func() { stopped = true }
			},
		})
		if interval != 5*time.Millisecond {
			t.Fatalf("ticker interval %v, want 5ms", interval)
		}
		fsyncs := func() int64 { synctest.Wait(); return l.Stats().Fsyncs }
		base := fsyncs()
		appendT(t, l, "a")
		appendT(t, l, "b")
		if got := fsyncs() - base; got != 0 {
			t.Fatalf("%d fsyncs before the tick, want 0", got)
		}
		ticks <- time.Time{}
		if got := fsyncs() - base; got != 1 {
			t.Fatalf("%d fsyncs after one tick, want 1", got)
		}
		ticks <- time.Time{} // nothing new written
		if got := fsyncs() - base; got != 1 {
			t.Fatalf("%d fsyncs after an idle tick, want 1", got)
		}
		appendT(t, l, "c")
		ticks <- time.Time{}
		if got := fsyncs() - base; got != 2 {
			t.Fatalf("%d fsyncs after the third tick, want 2", got)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !stopped {
			t.Fatal("Close did not stop the ticker")
		}
	})
}

// TestSyncIntervalRealTicker runs the default ticker on the bubble's fake clock.
func TestSyncIntervalRealTicker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := openT(t, Options{Dir: t.TempDir(), Sync: SyncInterval, SyncInterval: time.Second})
		base := l.Stats().Fsyncs
		appendT(t, l, "a")
		time.Sleep(time.Second + time.Nanosecond)
		synctest.Wait()
		if got := l.Stats().Fsyncs - base; got != 1 {
			t.Fatalf("%d fsyncs after one interval, want 1", got)
		}
	})
}

func TestClose(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r := appendT(t, l, "kept")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != ErrClosed {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	if _, err := l.Append(context.Background(), []byte("x")); err != ErrClosed {
		t.Fatalf("Append after Close = %v, want ErrClosed", err)
	}
	if err := l.Sync(); err != ErrClosed {
		t.Fatalf("Sync after Close = %v, want ErrClosed", err)
	}
	if _, err := l.Rotate(); err != ErrClosed {
		t.Fatalf("Rotate after Close = %v, want ErrClosed", err)
	}
	equalRecs(t, replayAll(t, l, Position{}), []rec{r})
}

// TestCloseFlushesWaiters closes while appends wait for their batch: they are written.
func TestCloseFlushesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		g := newGate()
		l, err := Open(Options{Dir: dir, testHookFlush: g.wait})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() { appendT(t, l, fmt.Sprint(i)) })
			synctest.Wait()
		}
		var closeErr error
		wg.Go(func() { closeErr = l.Close() })
		synctest.Wait()
		g.release()
		wg.Wait()
		if closeErr != nil {
			t.Fatal(closeErr)
		}
		l = openT(t, Options{Dir: dir})
		if got := replayAll(t, l, Position{}); len(got) != 3 {
			t.Fatalf("replayed %v, want 3 records", got)
		}
	})
}

func TestAppendTooLarge(t *testing.T) {
	l := openT(t, Options{Dir: t.TempDir(), Sync: SyncNone})
	if _, err := l.Append(context.Background(), make([]byte, MaxPayload+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Append of MaxPayload+1 bytes = %v, want ErrTooLarge", err)
	}
	big := bytes.Repeat([]byte{7}, MaxPayload)
	if _, err := l.Append(context.Background(), big); err != nil {
		t.Fatalf("Append of MaxPayload bytes: %v", err)
	}
	n := 0
	if err := l.Replay(Position{}, func(_ Position, p []byte) error {
		if !bytes.Equal(p, big) {
			t.Fatal("big payload differs")
		}
		n++
		return nil
	}); err != nil || n != 1 {
		t.Fatalf("Replay = %v after %d records", err, n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*batch{l.pending, l.spare} {
		if cap(b.buf) > 2*l.opts.MaxBatchBytes {
			t.Fatalf("kept a %d-byte batch buffer after a huge record", cap(b.buf))
		}
	}
}

// TestWriteError checks that a failed write fails the log for good.
func TestWriteError(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r := appendT(t, l, "before")
	l.f.Close() // the next write(2) fails
	_, err1 := l.Append(context.Background(), []byte("lost"))
	_, err2 := l.Append(context.Background(), []byte("refused"))
	if err1 == nil || err2 != err1 {
		t.Fatalf("Appends after a write error = %v, %v; want the same error twice", err1, err2)
	}
	if err := l.Sync(); err != err1 {
		t.Fatalf("Sync = %v, want %v", err, err1)
	}
	if err := l.Close(); err != err1 {
		t.Fatalf("Close = %v, want %v", err, err1)
	}
	l = openT(t, Options{Dir: dir})
	equalRecs(t, replayAll(t, l, Position{}), []rec{r})
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	read := func() string {
		b, err := os.ReadFile(filepath.Join(dir, "snap"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if err := WriteFileAtomic(dir, "snap", write("one")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(dir, "snap", write(strings.Repeat("two", 100000))); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != strings.Repeat("two", 100000) {
		t.Fatalf("content %d bytes after replace", len(got))
	}
	boom := errors.New("boom")
	err := WriteFileAtomic(dir, "snap", func(w io.Writer) error {
		io.WriteString(w, "partial")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WriteFileAtomic = %v, want %v", err, boom)
	}
	if got := read(); got != strings.Repeat("two", 100000) {
		t.Fatal("a failed write changed the file")
	}
	if names := dirNames(t, dir); !slicesEqual(names, []string{"snap"}) {
		t.Fatalf("files %q, want only snap", names)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing"), "snap", write("x")); err == nil {
		t.Fatal("WriteFileAtomic into a missing directory succeeded")
	}
}

// TestGroupWaitGathersAnnouncedAppends: a flusher that holds a batch while
// other appends are announced (Expect) gathers for GroupWait, and writes them
// all with one write and one fsync; a lone append does not wait.
func TestGroupWaitGathersAnnouncedAppends(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		l, err := Open(Options{Dir: dir, GroupWait: 5 * time.Millisecond, noSpare: true})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		before := l.Stats()
		const n = 8
		for range n {
			l.Expect()
		}
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 100 * time.Microsecond) // arrivals spread over 0.7 ms
				if _, err := l.AppendExpected(context.Background(), []byte{byte(i)}, true); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		s := l.Stats()
		if got := s.Batches - before.Batches; got != 1 || s.Appends-before.Appends != n {
			t.Fatalf("%d announced appends took %d batches (%d appends), want 1", n, got, s.Appends-before.Appends)
		}

		// A lone Append with nothing announced is written at once.
		start := time.Now()
		if _, err := l.Append(context.Background(), []byte("y")); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 0 {
			t.Fatalf("an unannounced append waited %v", took)
		}

		// With siblings announced, a commit gathers for GroupWait, however
		// the announcements end.
		l.Expect()
		start = time.Now()
		l.Expect()
		if _, err := l.AppendExpected(context.Background(), []byte("z"), true); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 5*time.Millisecond {
			t.Fatalf("append waited %v for a forgotten announcement, want GroupWait (5ms)", took)
		}
		l.Unexpect()
	})
}

// TestAppendCommitTimesItsSteps: an append under SyncBatch tells how long
// its batch's write and fsync took, and one under SyncNone reports no
// fsync; each step fits in the append's own time, and the position is
// Append's.
func TestAppendCommitTimesItsSteps(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncNone} {
		l := openT(t, Options{Dir: t.TempDir(), Sync: policy})
		first, err := l.Append(context.Background(), []byte("first"))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		c, err := l.AppendCommit(context.Background(), []byte("second"), true)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if c.Seq != first.Seq || c.Offset <= first.Offset {
			t.Errorf("%v: position %+v after %+v", policy, c.Position, first)
		}
		if c.Write <= 0 || c.Queued < 0 || c.Queued+c.Write+c.Fsync > took {
			t.Errorf("%v: queued %v, write %v, fsync %v in an append of %v", policy, c.Queued, c.Write, c.Fsync, took)
		}
		if (c.Fsync > 0) != (policy == SyncBatch) {
			t.Errorf("%v: fsync %v", policy, c.Fsync)
		}
	}
}

// TestAppendNotDurable: under SyncBatch, an append that is not durable
// returns after its write, with no fsync, and the sync loop fsyncs it at
// its second tick (it ticks at half the interval); a durable one returns
// after its batch's fsync, and leaves the loop nothing to do.
func TestAppendNotDurable(t *testing.T) {
	ticks := make(chan time.Time)
	l := openT(t, Options{Dir: t.TempDir(), NewTicker: func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} }})
	fsyncs := func() int64 { return l.Stats().Fsyncs }
	base := fsyncs()
	c, err := l.AppendCommit(context.Background(), []byte("lazy"), false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fsync != 0 || fsyncs() != base {
		t.Fatalf("an append that is not durable waited for an fsync (%v; fsyncs %d -> %d)", c.Fsync, base, fsyncs())
	}
	ticks <- time.Now() // the write came after the tick before: not yet due
	ticks <- time.Now() // due: fsynced
	ticks <- time.Now() // taken by the loop once it waits again, so the second tick's fsync is done
	if fsyncs() != base+1 {
		t.Fatalf("the sync loop made %d fsyncs for the lazy append, want 1", fsyncs()-base)
	}
	c, err = l.AppendCommit(context.Background(), []byte("durable"), true)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fsync <= 0 || fsyncs() != base+2 {
		t.Fatalf("a durable append: fsync %v, fsyncs %d, want one more", c.Fsync, fsyncs()-base)
	}
	ticks <- time.Now()
	ticks <- time.Now()
	if fsyncs() != base+2 {
		t.Fatalf("the sync loop fsynced what the flusher had: %d fsyncs, want 2", fsyncs()-base)
	}
}

// TestSyncLoopLeavesCoveredWritesAlone: under SyncBatch, what a durable
// append's fsync covered (its own record and a lazy one written before it)
// is not fsynced again by the sync loop.
func TestSyncLoopLeavesCoveredWritesAlone(t *testing.T) {
	ticks := make(chan time.Time)
	l := openT(t, Options{Dir: t.TempDir(), NewTicker: func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} }})
	base := l.Stats().Fsyncs
	ctx := context.Background()
	for _, durable := range []bool{false, true} {
		if _, err := l.AppendCommit(ctx, []byte("x"), durable); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		ticks <- time.Now()
	}
	if got := l.Stats().Fsyncs - base; got != 1 {
		t.Fatalf("%d fsyncs, want the durable append's 1", got)
	}
}

// TestSyncLoopSleepsWhenIdle: after syncIdleTicks ticks with nothing to
// fsync the sync loop stops its ticker; the next write that is not
// fsynced starts it again, and is fsynced.
func TestSyncLoopSleepsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ticks := make(chan time.Time)
		var started, stopped atomic.Int64
		l := openT(t, Options{Dir: t.TempDir(), Sync: SyncInterval, NewTicker: func(time.Duration) (<-chan time.Time, func()) {
			started.Add(1)
			return ticks, func() { stopped.Add(1) }
		}})
		synctest.Wait()
		for range syncIdleTicks {
			ticks <- time.Time{}
		}
		synctest.Wait()
		if started.Load() != 1 || stopped.Load() != 1 {
			t.Fatalf("after %d idle ticks: %d tickers started, %d stopped; want 1 and 1", syncIdleTicks, started.Load(), stopped.Load())
		}
		base := l.Stats().Fsyncs
		appendT(t, l, "wakes it")
		synctest.Wait()
		if started.Load() != 2 {
			t.Fatalf("a write did not start the ticker again (%d started)", started.Load())
		}
		ticks <- time.Time{}
		synctest.Wait()
		if got := l.Stats().Fsyncs - base; got != 1 {
			t.Fatalf("%d fsyncs after the woken loop's tick, want 1", got)
		}
	})
}
