//go:build !linux

package wal

import "os"

// openDirect opens path with flag: direct I/O is used on Linux only.
func openDirect(path string, flag int, perm os.FileMode) (*os.File, bool, error) {
	f, err := os.OpenFile(path, flag, perm)
	return f, false, err
}

// setDirect has nothing to turn off where openDirect never turns it on.
func setDirect(*os.File, bool) error { return nil }
