package node

import (
	"sync/atomic"
	"time"
)

// throttle lets a repeated log line through at most once per period, and
// counts the ones it held back. It takes no lock (a node past its memory
// limit may refuse most of what it decides, each refusal asking). Safe for
// concurrent use; the zero value lets the first line through.
type throttle struct {
	last       atomic.Int64 // unix ns of the last line let through; 0 before the first
	suppressed atomic.Int64 // lines held back since
}

// allow reports whether a line at now (unix ns) goes out, period after the
// last one (or with the clock gone back), and if so how many it held back
// since.
func (t *throttle) allow(now int64, period time.Duration) (ok bool, held int64) {
	last := t.last.Load()
	if last != 0 && now >= last && now-last < int64(period) || !t.last.CompareAndSwap(last, now) {
		t.suppressed.Add(1)
		return false, 0
	}
	return true, t.suppressed.Swap(0)
}
