//go:build linux

package store

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapRegion maps n bytes of private anonymous memory, reserved lazily
// (MAP_NORESERVE: untouched pages cost nothing), and advises transparent
// huge pages for all of it before any page is touched.
func mapRegion(n int) ([]byte, error) {
	r, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	// EINVAL means a kernel without transparent huge pages: small pages,
	// the same memory.
	_ = unix.Madvise(r, unix.MADV_HUGEPAGE)
	return r, nil
}

func unmapRegion(r []byte) { _ = unix.Munmap(r) }

// inside reports whether p points into r.
func inside(p *byte, r []byte) bool {
	a, lo := uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(unsafe.SliceData(r)))
	return a >= lo && a < lo+uintptr(len(r))
}
