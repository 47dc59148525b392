package bench

import "context"

// Target is a limiter under test.
type Target interface {
	// Name names the target in reports: "freqring", "redis-merged", ...
	Name() string
	// Check decides items in order and fills out (len(out) == len(items)).
	// An error fails the whole call; per-item failures go in Result.Err.
	Check(ctx context.Context, items []Item, out []Result) error
	// Memory returns the server-side bytes the target holds now, over all
	// its servers, and how many recipients they hold records of (0 if the
	// target cannot tell).
	Memory(ctx context.Context) (bytes, recipients int64, err error)
	Close() error
}

// Result is one item's outcome.
type Result struct {
	Admitted bool
	At       int64 // decision time, unix ms, as the limiter reported it
	Degraded bool  // the limiter did not answer: a failure policy decided
	Err      error // the item failed
}
