//go:build linux

// Package testdisk gives tests a small file system of their own to fill:
// a tmpfs of a set size, so that a disk-full test runs in seconds and
// leaves the machine's disks alone. Mounting needs root; without it the
// test is skipped, unless CI_REQUIRE_TMPFS is set (CI sets it), which makes
// it fail instead.
package testdisk

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Small mounts a tmpfs of size bytes at a new directory and returns it;
// it is unmounted at the end of the test.
func Small(tb testing.TB, size int) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		if os.Getenv("CI_REQUIRE_TMPFS") != "" {
			tb.Fatalf("mounting a tmpfs (CI_REQUIRE_TMPFS is set): %v", err)
		}
		tb.Skipf("mounting a tmpfs needs root: %v", err)
	}
	tb.Cleanup(func() {
		// Detached, not unmounted: the kernel releases the files an
		// io_uring (the WAL's fsyncs) referenced only after the ring's
		// teardown, which runs after Close, so a plain unmount can find
		// the file system still busy a moment later.
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			tb.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file at path until its file system is full and returns the
// file's size, bytes.
func Fill(tb testing.TB, path string) int64 {
	tb.Helper()
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	var n int64
	for {
		k, err := f.Write(chunk)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}
