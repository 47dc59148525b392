//go:build linux

package store

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestRegionAdvisedForHugePages checks that a mapped region carries the
// huge-page advice (VmFlags "hg" in /proc/self/smaps) before anything
// touches it.
func TestRegionAdvisedForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("this kernel has no transparent huge pages")
	}
	m, err := mapAligned(regionBytes, hugePageBytes, regionBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapRegion(m.whole)
	flags := vmFlags(t, uintptr(unsafe.Pointer(unsafe.SliceData(m.aligned))))
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Fatalf("region's VmFlags %q lack hg (MADV_HUGEPAGE)", flags)
	}
}

// vmFlags returns the VmFlags of the mapping that holds address a.
func vmFlags(t *testing.T, a uintptr) string {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if first, _, _ := strings.Cut(line, " "); !strings.HasSuffix(first, ":") {
			if _, err := fmt.Sscanf(first, "%x-%x", &lo, &hi); err != nil {
				t.Fatalf("smaps line %q: %v", line, err)
			}
			in = a >= lo && a < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmFlags:"))
		}
	}
	t.Skipf("/proc/self/smaps shows no VmFlags for %#x (a sandboxed kernel?)", a)
	return ""
}

// TestLargeTablesMapped grows a table past tableMinBytes and back: from that
// size its entries live in a mapping of its own, advised for huge pages but
// for its last partial one, which a resize or free unmaps; smaller tables
// stay on the heap. Every key stays findable throughout, and the held
// account and the mapped bytes follow.
func TestLargeTablesMapped(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("this kernel has no transparent huge pages")
	}
	var held atomic.Int64
	b := &blocks{}
	tb := table{held: &held, blk: b}
	rng := rand.New(rand.NewPCG(7, 7))
	keys := make([]uint64, 0, 200_000)
	check := func(what string) {
		t.Helper()
		if got := held.Load(); got != tb.bytes() {
			t.Fatalf("%s: held %d, table %d bytes", what, got, tb.bytes())
		}
		b.mu.Lock()
		m, mapped := b.tables[unsafe.SliceData(tb.w)]
		tables := len(b.tables)
		b.mu.Unlock()
		want, wantTables := tb.bytes() >= tableMinBytes, 0
		if want {
			wantTables = 1
		}
		if mapped != want || tables != wantTables {
			t.Fatalf("%s: a table of %d bytes: mapped %v, %d mappings", what, tb.bytes(), mapped, tables)
		}
		if mapped {
			if got := b.tableBytes.Load(); got != int64(len(m.aligned)) || len(m.aligned) < int(tb.bytes()) {
				t.Fatalf("%s: %d bytes mapped for a table of %d (mapping %d)", what, got, tb.bytes(), len(m.aligned))
			}
			a := uintptr(unsafe.Pointer(unsafe.SliceData(tb.w)))
			if a%hugePageBytes != 0 || !strings.Contains(" "+vmFlags(t, a)+" ", " hg ") {
				t.Fatalf("%s: table at %#x not on an advised huge page", what, a)
			}
		} else if b.tableBytes.Load() != 0 {
			t.Fatalf("%s: %d table bytes mapped, none in use", what, b.tableBytes.Load())
		}
		for i, k := range keys {
			if p := tb.find(k, -1); p < 0 || tb.ref(p) != ref(i) {
				t.Fatalf("%s: key %d of %d lost", what, i, len(keys))
			}
		}
	}
	for len(keys) < cap(keys) {
		k := rng.Uint64() | 1
		tb.insert(k, ref(len(keys)))
		keys = append(keys, k)
		if len(keys)%50_000 == 0 {
			check(fmt.Sprintf("%d keys", len(keys)))
		}
	}
	if b.tableBytes.Load() == 0 {
		t.Fatalf("a table of %d bytes was not mapped", tb.bytes())
	}
	for len(keys) > 1000 {
		last := len(keys) - 1
		tb.remove(tb.find(keys[last], -1))
		keys = keys[:last]
	}
	tb.shrink()
	check("shrunk")
	tb.free()
	held.Add(-held.Load())
	if b.tableBytes.Load() != 0 || len(b.tables) != 0 {
		t.Fatalf("after free: %d bytes in %d mappings", b.tableBytes.Load(), len(b.tables))
	}
}

// BenchmarkFreshMemory measures what the first write to fresh anonymous
// memory costs on this machine: 1 GiB is mapped, one byte is written in each
// 4 KiB page, and the mapping is dropped, in 4 KiB pages and advised for
// huge pages. The store's slabs and index tables, the page cache and the Go
// heap all start this way. On a VM whose guest reports free memory to its
// host, memory freed a few seconds earlier is fresh again to the host:
//
//	go test -run '^$' -bench FreshMemory -benchtime 3x ./store
func BenchmarkFreshMemory(b *testing.B) {
	const size = 1 << 30
	for _, huge := range []bool{false, true} {
		b.Run(fmt.Sprintf("huge=%v", huge), func(b *testing.B) {
			var spent time.Duration
			for b.Loop() {
				m, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				if err != nil {
					b.Fatal(err)
				}
				if huge {
					_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
				}
				start := time.Now()
				for i := 0; i < len(m); i += 4096 {
					m[i] = 1
				}
				spent += time.Since(start)
				if err := unix.Munmap(m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size)*float64(b.N)/spent.Seconds()/1e9, "first-write-GB/s")
		})
	}
}
