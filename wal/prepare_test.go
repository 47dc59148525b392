package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
)

// TestPreparedSegment cuts a segment from a spare, fills its start, and checks
// that a reopen replays exactly its records, cuts nothing and keeps the file's
// length, that appends go on overwriting the zeros and survive another
// reopen, and that sealing drops the unused zeros.
func TestPreparedSegment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const segBytes = 64 << 10
		dir := t.TempDir()
		opts := Options{Dir: dir, PrepareAfter: -1, SegmentBytes: segBytes}
		seg2 := filepath.Join(dir, segmentName(2))
		l := openT(t, opts)
		want := []rec{appendT(t, l, "in the plain first segment")}
		synctest.Wait() // the preparer has a spare ready and waits for a cut to take it
		if names := dirNames(t, dir); !slices.Contains(names, spareName) {
			t.Fatalf("no spare segment: %q", names)
		}
		if _, err := l.Rotate(); err != nil {
			t.Fatal(err)
		}
		if st := l.Stats(); st.PreparedCuts != 1 || st.Rotations != 1 {
			t.Fatalf("Stats() = %+v, want 1 prepared cut and 1 rotation", st)
		}
		for i := range 10 {
			want = append(want, appendT(t, l, fmt.Sprintf("rec-%d-%s", i, strings.Repeat("p", 13*i))))
		}
		size := l.Segments()[1].Size
		if end := want[10].pos.Offset + recLen(want[10]); size != end {
			t.Fatalf("Segments()[1].Size = %d, want %d (the end of the last record)", size, end)
		}
		b, err := os.ReadFile(seg2)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != segBytes || !allZero(b[size:]) {
			t.Fatalf("segment 2 is %d bytes, zeros after %d: %v; want %d bytes", len(b), size, allZero(b[size:]), segBytes)
		}
		synctest.Wait() // the preparer made the next spare
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if names := dirNames(t, dir); !slicesEqual(names, []string{segmentName(1), segmentName(2)}) {
			t.Fatalf("files after Close: %q, want the two segments (Close removes the unused spare)", names)
		}

		reopen := func() *Log {
			t.Helper()
			var logs logRecorder
			o := opts
			o.Logger = logs.logger()
			l := openT(t, o)
			equalRecs(t, replayAll(t, l, Position{}), want)
			if st := l.Stats(); st.TornBytes != 0 || strings.Contains(logs.String(), "torn") {
				t.Fatalf("Open cut %d bytes of a pre-zeroed segment:\n%s", st.TornBytes, logs.String())
			}
			if got, want := l.Segments()[1].Size, want[len(want)-1].pos.Offset+recLen(want[len(want)-1]); got != want {
				t.Fatalf("Segments()[1].Size = %d after Open, want %d", got, want)
			}
			if got := fileSize(t, seg2); got != segBytes {
				t.Fatalf("segment 2 is %d bytes after Open, want %d: the zeros must stay", got, segBytes)
			}
			return l
		}
		l = reopen()
		for i := range 5 {
			r := appendT(t, l, strings.Repeat(fmt.Sprint(i), 1+100*i))
			if end := want[len(want)-1].pos.Offset + recLen(want[len(want)-1]); r.pos != (Position{Seq: 2, Offset: end}) {
				t.Fatalf("append after reopen at %v, want 2:%d", r.pos, end)
			}
			want = append(want, r)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = reopen()

		// Sealing truncates segment 2 to its records, so it never carries
		// preallocation, and it opens as a sealed segment.
		if _, err := l.Rotate(); err != nil {
			t.Fatal(err)
		}
		if got, want := fileSize(t, seg2), l.Segments()[1].Size; got != want {
			t.Fatalf("sealed segment 2 is %d bytes, want %d", got, want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = openT(t, opts)
		equalRecs(t, replayAll(t, l, Position{}), want)
	})
}

// TestPreparedTornTail damages a pre-zeroed segment after its last record:
// non-zero bytes followed by zeros are a torn tail (with an intact record
// further on they are corruption: TestCorruptActiveSegment). Open truncates
// the file at the last intact record, so no stale byte replays after appends
// of other sizes and another reopen.
func TestPreparedTornTail(t *testing.T) {
	const segBytes = 16 << 10
	partial := appendRecord(nil, recData, bytes.Repeat([]byte("torn"), 50))[:60] // a record cut by a power loss
	tests := []struct {
		name   string
		damage func(b []byte, end int)
		level  string
	}{
		{"partial record", func(b []byte, end int) { copy(b[end:], partial) }, "WARN"},
		{"one byte", func(b []byte, end int) { b[end+3] = 1 }, "WARN"},
		{"bad size at the end", func(b []byte, end int) {
			binary.LittleEndian.PutUint32(b[len(b)-9:], MaxPayload+1)
		}, "WARN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			hook, ready := spareHook()
			opts := Options{Dir: dir, PrepareAfter: -1, SegmentBytes: segBytes, testHookPrepared: hook}
			l := openT(t, opts)
			<-ready
			if _, err := l.Rotate(); err != nil {
				t.Fatal(err)
			}
			var want []rec
			for i := range 4 {
				want = append(want, appendT(t, l, fmt.Sprintf("kept-%d", i)))
			}
			end := l.Segments()[1].Size
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, segmentName(2))
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != segBytes {
				t.Fatalf("segment 2 is %d bytes, want %d (pre-zeroed)", len(b), segBytes)
			}
			tt.damage(b, int(end))
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}

			var logs logRecorder
			o := opts
			o.testHookPrepared, o.Logger = nil, logs.logger()
			l = openT(t, o)
			equalRecs(t, replayAll(t, l, Position{}), want)
			if got := l.Stats().TornBytes; got != segBytes-end {
				t.Fatalf("Stats().TornBytes = %d, want %d", got, segBytes-end)
			}
			if msg := fmt.Sprintf("level=%s msg=\"wal: truncated torn tail\" file=%s offset=%d bytes=%d", tt.level, path, end, segBytes-end); !strings.Contains(logs.String(), msg) {
				t.Fatalf("no log %q:\n%s", msg, logs.String())
			}
			if got := fileSize(t, path); got != end {
				t.Fatalf("segment 2 is %d bytes after Open, want %d", got, end)
			}
			for _, n := range []int{1, 7, 300, 2, 40} {
				want = append(want, appendT(t, l, strings.Repeat("n", n)))
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = openT(t, Options{Dir: dir, PrepareAfter: -1, SegmentBytes: segBytes})
			equalRecs(t, replayAll(t, l, Position{}), want)
			if st := l.Stats(); st.TornBytes != 0 {
				t.Fatalf("second Open cut %d bytes", st.TornBytes)
			}
		})
	}
}

// TestPreparedCuts holds the preparer and checks that cuts (by Rotate and by
// size) use a spare when one is ready and make a plain file when none is, that
// a failed preparation is retried at the next cut, and that every sealed
// segment is truncated to its records.
func TestPreparedCuts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const segBytes = 1 << 10
		dir := t.TempDir()
		g := newGate()
		defer g.release() // before the cleanup's Close, which waits for the preparer
		var logs logRecorder
		opts := Options{Dir: dir, PrepareAfter: -1, SegmentBytes: segBytes, testHookPrepare: g.wait, Logger: logs.logger()}
		l := openT(t, opts)
		var want []rec
		check := func(prepared, rotations int64) {
			t.Helper()
			if st := l.Stats(); st.PreparedCuts != prepared || st.Rotations != rotations {
				t.Fatalf("Stats() = %+v, want %d prepared cuts and %d rotations", st, prepared, rotations)
			}
		}
		fill := func() { // appends until a batch rotates the active segment by size
			t.Helper()
			seq := l.Segments()[len(l.Segments())-1].Seq
			for l.Segments()[len(l.Segments())-1].Seq == seq {
				want = append(want, appendT(t, l, strings.Repeat("f", 200)))
				synctest.Wait() // the flusher's rotation after the batch
			}
		}

		// The preparer waits in testHookPrepare: no spare, a plain cut.
		want = append(want, appendT(t, l, "one"))
		if _, err := l.Rotate(); err != nil {
			t.Fatal(err)
		}
		check(0, 1)
		fill()
		check(0, 2)

		// A preparation that fails: spareName is taken by a directory.
		blocker := filepath.Join(dir, spareName)
		if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		g.step()
		synctest.Wait()
		if !strings.Contains(logs.String(), "wal: preparing a spare segment failed") {
			t.Fatalf("no log of the failed preparation:\n%s", logs.String())
		}
		if _, err := l.Rotate(); err != nil { // plain, and it asks for a retry
			t.Fatal(err)
		}
		check(0, 3)
		if err := os.RemoveAll(blocker); err != nil {
			t.Fatal(err)
		}
		g.step() // the retry succeeds
		synctest.Wait()
		if _, err := l.Rotate(); err != nil {
			t.Fatal(err)
		}
		check(1, 4)
		want = append(want, appendT(t, l, "in a prepared segment"))

		g.step() // the next spare, taken by a rotation by size
		synctest.Wait()
		fill()
		check(2, 5)
		fill() // the preparer waits in testHookPrepare again: a plain cut
		check(2, 6)
		want = append(want, appendT(t, l, "last"))

		segs := l.Segments()
		for _, s := range segs[:len(segs)-1] {
			if got := fileSize(t, s.Path); got != s.Size {
				t.Fatalf("sealed segment %d is %d bytes, want %d", s.Seq, got, s.Size)
			}
		}
		equalRecs(t, replayAll(t, l, Position{}), want)
		g.release()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = openT(t, Options{Dir: dir, PrepareAfter: -1, SegmentBytes: segBytes})
		equalRecs(t, replayAll(t, l, Position{}), want)
		if st := l.Stats(); st.TornBytes != 0 {
			t.Fatalf("reopen cut %d bytes", st.TornBytes)
		}
	})
}

// TestSpareWaitsForAHalfFullSegment: by default the preparer zeroes no spare
// until the active segment is half full, so a new or idle log writes no
// spare at all.
func TestSpareWaitsForAHalfFullSegment(t *testing.T) {
	dir := t.TempDir()
	prepared := make(chan struct{}, 1)
	l := openT(t, Options{Dir: dir, SegmentBytes: 8 << 10, testHookPrepared: func() { prepared <- struct{}{} }})
	defer l.Close()
	spare := filepath.Join(dir, spareName)
	payload := make([]byte, 1000)
	for range 3 { // ~3 KiB: under half
		if _, err := l.Append(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(spare); !os.IsNotExist(err) {
		t.Fatalf("a spare exists before the segment is half full: %v", err)
	}
	for range 2 { // past 4 KiB
		if _, err := l.Append(context.Background(), payload); err != nil {
			t.Fatal(err)
		}
	}
	<-prepared
	if _, err := os.Stat(spare); err != nil {
		t.Fatalf("no spare once the segment is half full: %v", err)
	}
}
