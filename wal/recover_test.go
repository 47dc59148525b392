package wal

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
)

// fullDisk is a testHookWriteAt that fails writes with ENOSPC while armed,
// after writing the first half of the batch (a write cut short by a full
// disk leaves part of it in the file).
type fullDisk struct{ armed atomic.Bool }

func (d *fullDisk) writeAt(f *os.File, b []byte, off int64) (int, error) {
	if !d.armed.Load() {
		return f.WriteAt(b, off)
	}
	n, _ := f.WriteAt(b[:len(b)/2], off)
	return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
}

// TestRecoverAfterWriteError: a write that fails (a full disk, half the
// batch written) fails the log: that Append and every later one, Sync and
// Rotate return the error, and Failed reports it. Recover fails while the
// cause lasts and the log stays failed; once it clears, Recover truncates the
// half-written batch away, seals the segment and cuts a new one, and the
// log takes appends again. The log then holds exactly what its Appends were
// told they wrote, before and after the failure, in a reopened log too;
// Failures and Recoveries count it.
func TestRecoverAfterWriteError(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncBatch, SyncInterval, SyncNone} {
		t.Run(policy.String(), func(t *testing.T) {
			dir := t.TempDir()
			disk := &fullDisk{}
			opts := Options{Dir: dir, SegmentBytes: 1 << 20, noSpare: true, Sync: policy, testHookWriteAt: disk.writeAt}
			l := openT(t, opts)
			appendT(t, l, "a1")
			appendT(t, l, "a2")
			disk.armed.Store(true)
			ctx := context.Background()
			if _, err := l.Append(ctx, []byte("lost-1")); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append on a full disk: %v, want ENOSPC", err)
			}
			if !l.Failed() || !errors.Is(l.Err(), syscall.ENOSPC) {
				t.Fatalf("Failed %v, Err %v after a failed write", l.Failed(), l.Err())
			}
			disk.armed.Store(false) // a failed log writes nothing more, whatever the disk
			if _, err := l.Append(ctx, []byte("lost-2")); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append on a failed log: %v, want the first error", err)
			}
			if err := l.Sync(); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Sync on a failed log: %v", err)
			}
			if _, err := l.Rotate(); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Rotate on a failed log: %v", err)
			}
			// While the cause lasts (here: the directory is gone, so no
			// segment can be cut), Recover fails and the log stays failed.
			if err := os.Rename(dir, dir+".away"); err != nil {
				t.Fatal(err)
			}
			if err := l.Recover(); err == nil || !l.Failed() || !errors.Is(l.Err(), syscall.ENOSPC) {
				t.Fatalf("Recover without its directory: %v, failed %v, err %v", err, l.Failed(), l.Err())
			}
			if err := os.Rename(dir+".away", dir); err != nil {
				t.Fatal(err)
			}
			before := len(l.Segments())
			if err := l.Recover(); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			if l.Failed() || l.Err() != nil {
				t.Fatalf("after Recover: failed %v, err %v", l.Failed(), l.Err())
			}
			if err := l.Recover(); err != nil {
				t.Fatalf("Recover of a healthy log: %v", err)
			}
			segs := l.Segments()
			if len(segs) != before+1 || !segs[len(segs)-2].Sealed {
				t.Fatalf("segments after Recover: %+v, want one more, the failed one sealed", segs)
			}
			appendT(t, l, "b1")
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			want := []string{"a1", "a2", "b1"}
			if got := payloads(replayAll(t, l, Position{})); !slices.Equal(got, want) {
				t.Fatalf("replay: %q, want %q", got, want)
			}
			st := l.Stats()
			if st.Failures != 1 || st.Recoveries != 1 {
				t.Fatalf("stats: %d failures, %d recoveries; want 1 and 1", st.Failures, st.Recoveries)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			opts.testHookWriteAt = nil
			l2 := openT(t, opts)
			if got := payloads(replayAll(t, l2, Position{})); !slices.Equal(got, want) {
				t.Fatalf("replay after reopening: %q, want %q", got, want)
			}
			if st := l2.Stats(); st.TornBytes != 0 || st.SkippedBytes != 0 {
				t.Fatalf("reopened with %d torn and %d skipped bytes: Recover left damage", st.TornBytes, st.SkippedBytes)
			}
		})
	}
}
