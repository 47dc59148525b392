//go:build linux

package node

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropCached asks the kernel to drop the page cache it holds for bytes
// [off, off+n) of f (posix_fadvise DONTNEED), which a one-pass read has
// consumed. Advice only: an error changes nothing and is ignored.
func dropCached(f *os.File, off, n int64) {
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}
