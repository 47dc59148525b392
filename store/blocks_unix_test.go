//go:build linux

package store

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"
)

// TestRegionAdvisedForHugePages checks that a mapped region carries the
// huge-page advice (VmFlags "hg" in /proc/self/smaps) before anything
// touches it.
func TestRegionAdvisedForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil {
		t.Skip("this kernel has no transparent huge pages")
	}
	m, err := mapAligned(regionBytes, hugePageBytes)
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
