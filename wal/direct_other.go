//go:build !linux

package wal

import (
	"io"
	"os"
)

// openDirect opens path with flag: direct I/O is used on Linux only.
func openDirect(path string, flag int, perm os.FileMode) (*os.File, bool, error) {
	f, err := os.OpenFile(path, flag, perm)
	return f, false, err
}

// setDirect has nothing to turn off where openDirect never turns it on.
func setDirect(*os.File, bool) error { return nil }

// pread reads into p from offset off; 0 bytes and no error at the end of
// the file.
func pread(f *os.File, p []byte, off int64) (int, error) {
	n, err := f.ReadAt(p, off)
	if err == io.EOF {
		err = nil
	}
	return n, err
}
