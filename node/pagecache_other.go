//go:build !linux

package node

import "os"

// dropCached does nothing where posix_fadvise is not used (see the Linux
// version).
func dropCached(*os.File, int64, int64) {}
