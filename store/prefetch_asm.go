//go:build amd64 || arm64

package store

import "unsafe"

// prefetch asks the CPU to bring the cache line at p into its caches, and
// returns at once: unlike a load, it does not hold up the instructions
// after it while the line is on its way, and it never faults, so p may be
// any address.
//
//go:noescape
func prefetch(p unsafe.Pointer)
