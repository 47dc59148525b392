//go:build !linux

package wal

import "errors"

// uring is io_uring, which only Linux has: newURing always fails, and
// segments are fsynced with fsync(2).
type uring struct{}

func newURing() (*uring, error) { return nil, errors.New("io_uring is Linux only") }

func (*uring) close() {}

func (*uring) fsync(int) (bool, error) { return false, nil }
