package wal

import (
	"errors"
	"os"
	"syscall"
)

// openDirect opens path with flag and O_DIRECT, or without O_DIRECT where
// the file system refuses it (EINVAL), and reports which.
func openDirect(path string, flag int, perm os.FileMode) (*os.File, bool, error) {
	f, err := os.OpenFile(path, flag|syscall.O_DIRECT, perm)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, syscall.EINVAL) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, flag, perm)
	return f, false, err
}

// setDirect turns O_DIRECT on or off for f's later reads and writes.
func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		flags, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
		if e != 0 {
			serr = e
			return
		}
		if on {
			flags |= syscall.O_DIRECT
		} else {
			flags &^= syscall.O_DIRECT
		}
		if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_SETFL, flags); e != 0 {
			serr = e
		}
	}); err != nil {
		return err
	}
	return serr
}

// pread reads into p from offset off with one pread(2).
func pread(f *os.File, p []byte, off int64) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			n, rerr = syscall.Pread(int(fd), p, off)
			if rerr != syscall.EINTR {
				break
			}
		}
	}); err != nil {
		return 0, err
	}
	return max(n, 0), rerr
}
