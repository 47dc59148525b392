//go:build linux

package store

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapping is memory mapAligned mapped: whole, to unmap, and its aligned
// part, to use.
type mapping struct{ whole, aligned []byte }

// mapAligned maps size bytes of private anonymous memory aligned to align
// (a power of two), reserved lazily (MAP_NORESERVE: untouched pages cost
// nothing), and advises transparent huge pages for its first huge bytes
// (a multiple of the huge page size) before any page is touched. The slack
// around the aligned part is never touched.
func mapAligned(size, align, huge int) (mapping, error) {
	whole, err := unix.Mmap(-1, 0, size+align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return mapping{}, err
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(whole)))
	off := int((uintptr(align) - base%uintptr(align)) % uintptr(align))
	m := mapping{whole: whole, aligned: whole[off : off+size : off+size]}
	// EINVAL means a kernel without transparent huge pages: small pages,
	// the same memory.
	if huge > 0 {
		_ = unix.Madvise(m.aligned[:huge], unix.MADV_HUGEPAGE)
	}
	return m, nil
}

func unmapRegion(r []byte) { _ = unix.Munmap(r) }

// inside reports whether p points into r.
func inside(p *byte, r []byte) bool {
	a, lo := uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(unsafe.SliceData(r)))
	return a >= lo && a < lo+uintptr(len(r))
}
