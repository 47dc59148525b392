//go:build !unix

package node

import (
	"errors"
	"os"
)

// errWouldBlock is never returned: without flock nothing is locked.
var errWouldBlock = errors.New("node: lock held")

// flock does nothing: this system has no flock(2), and the data directory
// lock is not enforced (freqring runs on Linux; see lock.go).
func flock(*os.File) error { return nil }

func funlock(*os.File) {}
