//go:build linux

package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/testdisk"
)

// TestSnapshotNeedsRoom: without room on the data directory's file system
// for a snapshot, none is tried (no temporary file, no WAL segment cut), it
// counts as failed, and the next try waits longer after each failure; once
// space returns, one is written. A snapshot tried again with no record in
// the active segment (after a failure) takes it as its start instead of
// cutting another, unless the last snapshot starts there.
func TestSnapshotNeedsRoom(t *testing.T) {
	disk := testdisk.Small(t, 16<<20)
	clk := &testClock{}
	clk.set(1_800_000_000_000)
	cfg := durableConfig(t, filepath.Join(disk, "data"), clk)
	cfg.SegmentBytes = 256 << 10
	n := openNode(t, cfg)
	t.Cleanup(func() { n.Close() })
	for i := range 50 {
		if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{fmt.Sprintf("+86%09d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	filler := filepath.Join(disk, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	// Leave 256 KiB: room for the WAL's active segment, not for a
	// snapshot and the WAL's next two.
	free, _ := freeBytes(disk)
	if err := f.Truncate(free - 256<<10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := fallocate(filler); err != nil {
		t.Fatal(err)
	}
	segs := len(n.dur.log.Segments())
	var waits []int64
	for range 3 {
		n.trySnapshot()
		waits = append(waits, n.dur.retryAt-clk.Now())
	}
	if got := n.Stats().SnapshotFailures; got != 3 {
		t.Fatalf("%d snapshot failures counted, want 3", got)
	}
	if waits[0] != int64(snapRetryMin) || waits[1] != 2*int64(snapRetryMin) || waits[2] != 4*int64(snapRetryMin) {
		t.Fatalf("retry waits %v, want 10s, 20s, 40s", waits)
	}
	if got := len(n.dur.log.Segments()); got != segs {
		t.Fatalf("%d WAL segments after the failed snapshots, %d before", got, segs)
	}
	if left, _ := filepath.Glob(filepath.Join(disk, "data", "*.tmp")); len(left) > 0 || n.dur.last != "" {
		t.Fatalf("temporary files %v, last snapshot %q after failures", left, n.dur.last)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	n.trySnapshot()
	if n.Stats().Snapshots != 1 || n.dur.snapFailed != 0 || n.dur.retryAt != 0 {
		t.Fatalf("after space returned: %d snapshots, %d failed in a row, retry at %d", n.Stats().Snapshots, n.dur.snapFailed, n.dur.retryAt)
	}
	// The active segment is empty and the last snapshot starts there: a
	// new snapshot cuts a segment. The next one, with the new active
	// segment empty, does not.
	n.dur.mu.Lock()
	defer n.dur.mu.Unlock()
	segs = len(n.dur.log.Segments())
	from, err := n.dur.replayStart()
	if err != nil || len(n.dur.log.Segments()) != segs+1 || snapName(from.Seq) == n.dur.last {
		t.Fatalf("replay start after a snapshot that starts in the empty active segment: %v %v, %d segments (was %d)", from, err, len(n.dur.log.Segments()), segs)
	}
	again, err := n.dur.replayStart()
	if err != nil || again != from || len(n.dur.log.Segments()) != segs+1 {
		t.Fatalf("replay start again with the active segment empty: %v (want %v) %v, %d segments", again, from, err, len(n.dur.log.Segments()))
	}
}

// fallocate makes the file at path take its size on disk.
func fallocate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return syscall.Fallocate(int(f.Fd()), 0, 0, fi.Size())
}

// TestStartChecksTheDataDirectory: a start removes the temporary files an
// interrupted write left (a snapshot's, the members file's), and refuses a
// data directory that cannot take a new file, saying what to do.
func TestStartChecksTheDataDirectory(t *testing.T) {
	disk := testdisk.Small(t, 4<<20)
	dir := filepath.Join(disk, "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"0000000000000003.snap.tmp", "members.json.tmp"} {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	clk := &testClock{}
	clk.set(1_800_000_000_000)
	n := openNode(t, durableConfig(t, dir, clk))
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) > 0 {
		t.Fatalf("leftovers after a start: %v", left)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	testdisk.Fill(t, filepath.Join(disk, "filler"))
	n2, err := New(durableConfig(t, dir, clk))
	if err != nil {
		t.Fatal(err)
	}
	err = n2.Open(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cannot take a new file") || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("Open on a full disk: %v", err)
	}
}
