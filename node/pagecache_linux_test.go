//go:build linux

package node

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages returns how many of path's pages the page cache holds
// (mincore of a read-only mapping of it), and how many it has.
func residentPages(t *testing.T, path string) (resident, pages int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal("mincore:", e)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

// cacheFile reads path whole, so that the page cache holds it.
func cacheFile(t *testing.T, path string) {
	t.Helper()
	if _, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
}

// TestRecoveryDropsSnapshotFromPageCache checks that a node that loads a
// snapshot leaves none of the file in the page cache: it reads it once,
// and at 100M recipients the cached file competed with the store for
// memory (see dropCachedStep).
func TestRecoveryDropsSnapshotFromPageCache(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, dir, clk)
	a := openNode(t, cfg)
	rng := rand.New(rand.NewPCG(5, 5))
	for range 200 {
		if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.snapshot(); err != nil {
		t.Fatal(err)
	}
	crash(t, a)
	snaps, err := listSnapshots(dir)
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots in %s: %v, %v", dir, snaps, err)
	}
	path := filepath.Join(dir, snaps[len(snaps)-1])

	// Whether this file system lets the cache go on advice at all (tmpfs
	// does not: the cache is where its files live).
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	cacheFile(t, path)
	dropCached(f, 0, 1<<40)
	f.Close()
	if res, pages := residentPages(t, path); res != 0 {
		t.Skipf("%s keeps %d of %d pages cached after posix_fadvise DONTNEED: this file system ignores the advice", dir, res, pages)
	}

	cacheFile(t, path)
	if res, pages := residentPages(t, path); res != pages {
		t.Skipf("%d of %d pages of a file just read are cached: cannot tell what recovery drops", res, pages)
	}
	b := openNode(t, cfg)
	defer b.Close()
	if res, pages := residentPages(t, path); res != 0 {
		t.Errorf("after recovery the page cache holds %d of the snapshot's %d pages, want 0", res, pages)
	}
	if rs := b.Recovery(); rs.Snapshot != path || rs.SnapshotRecords == 0 {
		t.Fatalf("recovery %+v: want the records of %s", rs, path)
	}
	a.ready.Store(true)
	samePeeks(t, "after recovery", a, b)
}
