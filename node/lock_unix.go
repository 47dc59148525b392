//go:build unix

package node

import (
	"os"
	"syscall"
)

// errWouldBlock is flock's error for a lock another open file holds.
var errWouldBlock error = syscall.EWOULDBLOCK

// flock takes an exclusive flock(2) of f without waiting.
func flock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }

// funlock releases it.
func funlock(f *os.File) { syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
