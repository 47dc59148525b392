//go:build !unix

package node

// freeBytes returns false: the free space is not known here.
func freeBytes(string) (int64, bool) { return 0, false }
