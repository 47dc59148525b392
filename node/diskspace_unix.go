//go:build unix

package node

import "syscall"

// freeBytes returns the bytes an unprivileged writer may still use on the
// file system of dir, and false where it cannot tell.
func freeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
