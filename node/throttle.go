package node

import (
	"sync"
	"time"
)

// throttle lets a repeated log line through at most once per period, and
// counts the ones it held back. Safe for concurrent use; the zero value lets
// the first line through.
type throttle struct {
	mu         sync.Mutex // guards last and suppressed
	last       int64      // unix ns of the last line let through; 0 before the first
	suppressed int64
}

// allow reports whether a line at now (unix ns) goes out, period after the
// last one (or with the clock gone back), and if so how many it held back
// since.
func (t *throttle) allow(now int64, period time.Duration) (ok bool, held int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last != 0 && now-t.last < int64(period) && now >= t.last {
		t.suppressed++
		return false, 0
	}
	t.last, held, t.suppressed = now, t.suppressed, 0
	return true, held
}
