package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// LockFile is the name of the lock file in a node's data directory.
const LockFile = "LOCK"

// ErrDataDirLocked reports a data directory held by another node.
var ErrDataDirLocked = errors.New("node: data directory in use")

// dirLock is an exclusive flock(2) on DataDir/LOCK, held for the node's life,
// so that one process (one Node) at a time uses a data directory. flock locks
// an open file description: two opens of the file conflict even inside one
// process, and the kernel releases the lock when its holder exits, however it
// exits, so a crash never leaves a stale lock. The file records the holder's
// pid, host and start time for the error of the next one to try; its content
// is informational only. On systems without flock (not unix: lock_other.go)
// the file is written but nothing is locked.
type dirLock struct{ f *os.File }

// lockDir takes the lock of dir, which must exist. It creates nothing but
// the lock file, and on failure writes nothing: the error wraps
// ErrDataDirLocked and names the directory and the holder.
func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node: lock data directory: %w", err)
	}
	if err := flock(f); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, errWouldBlock) {
			h := strings.TrimSpace(string(holder))
			if h == "" {
				h = "unknown holder"
			}
			return nil, fmt.Errorf("%w: %s is locked by another node (%s); one process per data directory", ErrDataDirLocked, dir, h)
		}
		return nil, fmt.Errorf("node: lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	info := fmt.Sprintf("pid=%d host=%s started=%s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(info), 0) // informational: a failure leaves the lock held
	}
	return &dirLock{f: f}, nil
}

// unlock releases the lock; the file stays. nil-safe and idempotent.
func (l *dirLock) unlock() {
	if l == nil || l.f == nil {
		return
	}
	funlock(l.f)
	l.f.Close()
	l.f = nil
}
