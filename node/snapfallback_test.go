package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer for a logger shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// damageFile flips one byte in the middle of path.
func damageFile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedSnapshotFallsBack is issue 12 case 3: one flipped byte in the
// newest snapshot makes Open fall back, without any override, to the
// snapshot before it plus the WAL from that one's replay start, logging the
// bad file at error level and losing no send; and a damaged snapshot is never
// the one kept as the fallback of the next.
func TestDamagedSnapshotFallsBack(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, dir, clk)
	rng := rand.New(rand.NewPCG(3, 3))
	checks := func(n *Node, k int) {
		for range k {
			if _, err := n.Check(context.Background(), randomBatch(rng)); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := openNode(t, cfg)
	checks(a, 40)
	if err := a.Close(); err != nil { // the first snapshot
		t.Fatal(err)
	}
	a = openNode(t, cfg)
	checks(a, 40)
	if err := a.snapshot(); err != nil { // the second: the first one stays
		t.Fatal(err)
	}
	checks(a, 40)
	crash(t, a) // sends after the second snapshot are in the WAL only
	a.ready.Store(true)
	a.dur = nil // a answers peeks from memory: the reference

	snaps, _ := listSnapshots(dir)
	if len(snaps) != 2 {
		t.Fatalf("snapshots %v, want the newest two", snaps)
	}
	damageFile(t, filepath.Join(dir, snaps[1]))

	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := openNode(t, cfg)
	rs := b.Recovery()
	if rs.Snapshot != filepath.Join(dir, snaps[0]) || rs.DamagedSnaps != 1 {
		t.Fatalf("recovered from %q with %d damaged, want %s and 1", rs.Snapshot, rs.DamagedSnaps, snaps[0])
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"damaged snapshot: recovering from the snapshot before it") ||
		!strings.Contains(logs.String(), snaps[1]) {
		t.Fatalf("no error naming %s in\n%s", snaps[1], logs.String())
	}
	samePeeks(t, "after falling back", a, b)
	checks(b, 20)
	want := peekAll(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// b's snapshot keeps the one b loaded, not the damaged one.
	after, _ := listSnapshots(dir)
	if len(after) != 2 || after[0] != snaps[0] || slices.Contains(after, snaps[1]) {
		t.Fatalf("snapshots %v, want %s and a new one", after, snaps[0])
	}
	damageFile(t, filepath.Join(dir, after[1]))
	c := openNode(t, cfg)
	defer c.Close()
	if got := c.Recovery(); got.Snapshot != filepath.Join(dir, snaps[0]) || got.DamagedSnaps != 1 {
		t.Fatalf("second fallback recovered from %q", got.Snapshot)
	}
	got := peekAll(t, c)
	for i := range want {
		if !slices.Equal(want[i].Used, got[i].Used) {
			t.Fatalf("peek %d after the second fallback: used %v, want %v", i, got[i].Used, want[i].Used)
		}
	}
}

// TestSnapshotVerify checks that verifySnapshot accepts what writeSnapshot
// writes and finds one flipped byte anywhere.
func TestSnapshotVerify(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	n := openNode(t, durableConfig(t, dir, clk))
	rng := rand.New(rand.NewPCG(4, 4))
	for range 30 {
		n.Check(context.Background(), randomBatch(rng))
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	snaps, _ := listSnapshots(dir)
	path := filepath.Join(dir, snaps[len(snaps)-1])
	parts := n.store.Partitions()
	if err := verifySnapshot(path, parts, 0); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	// The offsets at which the sections start: a flipped byte is reported
	// at its section's, the first that fails.
	var starts []int
	for off := 0; off < len(b); off += 9 + int(binary.LittleEndian.Uint32(b[off:])) { // wal's framing: the size first
		starts = append(starts, off)
	}
	for i := 0; i < len(b); i += 1 + len(b)/500 {
		d := bytes.Clone(b)
		d[i] ^= 0x01
		os.WriteFile(path, d, 0o644)
		err := verifySnapshot(path, parts, 0)
		if err == nil {
			t.Fatalf("byte %d of %d flipped: verified", i, len(b))
		}
		sec := starts[sort.SearchInts(starts, i+1)-1]
		if want := fmt.Sprintf("offset %d:", sec); !strings.Contains(err.Error(), want) {
			t.Fatalf("byte %d flipped (in the section at %d): %v, want an error at %s", i, sec, err, want)
		}
	}
	os.WriteFile(path, b[:len(b)-1], 0o644)
	if err := verifySnapshot(path, parts, 0); err == nil {
		t.Fatal("truncated: verified")
	}
}
