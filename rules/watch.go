package rules

import (
	"context"
	"errors"
	"hash/fnv"
	"os"
	"time"
)

// DefaultWatchInterval is how often Watch reads the rules file when
// WatchConfig.Interval is zero.
const DefaultWatchInterval = time.Second

// WatchConfig configures Watch. Reload is required.
type WatchConfig struct {
	// From is the rule set in force, read from the file before Watch
	// started: a file whose bytes differ from those it was parsed from is
	// reloaded at the first read. nil means the file as Watch first reads it.
	From *Set
	// Interval is how often the file is read; 0 means DefaultWatchInterval,
	// negative means only when Now receives.
	Interval time.Duration
	// Now, when it receives, makes Watch read the file at once and call
	// Reload even if its bytes have not changed (SIGHUP). nil means never.
	Now <-chan struct{}
	// Reload is called with each new valid rule set: when the file's bytes
	// change and parse, and on each receive from Now.
	Reload func(*Set)
	// Failed is called when the file cannot be read or does not parse (the
	// error names file:line and the field), once per distinct failure: a bad
	// file that stays bad is reported once, not at every read. nil means
	// ignore.
	Failed func(error)
}

// Watch reads the rules file at path every cfg.Interval until ctx is done,
// and calls cfg.Reload whenever its bytes change to a valid rule set. The
// bytes it starts from are those cfg.From was parsed from. It reads the path each time, following
// symbolic links, so that it sees a file replaced by a rename and a
// Kubernetes ConfigMap volume's update (a swap of the ..data symlink) as
// well as an edit in place. It returns ctx's error. Watch calls Reload and
// Failed from its own goroutine, one call at a time.
func Watch(ctx context.Context, path string, cfg WatchConfig) error {
	if cfg.Reload == nil {
		return errors.New("rules: Watch: Reload is nil")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultWatchInterval
	}
	if cfg.Failed == nil {
		cfg.Failed = func(error) {}
	}
	last, lastErr := readSum(path)
	if cfg.From != nil && cfg.From.fileSum != 0 {
		last, lastErr = cfg.From.fileSum, ""
	}
	var ticks <-chan time.Time
	if cfg.Interval > 0 {
		tick := time.NewTicker(cfg.Interval)
		defer tick.Stop()
		ticks = tick.C
	}
	for {
		force := false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticks:
		case <-cfg.Now:
			force = true
		}
		data, err := os.ReadFile(path)
		if err != nil {
			if force || err.Error() != lastErr {
				cfg.Failed(err)
			}
			last, lastErr = 0, err.Error()
			continue
		}
		sum := checksum(data)
		if sum == last && !force {
			continue // unchanged: still valid, or still reported
		}
		rs, err := Parse(path, data)
		if err != nil {
			cfg.Failed(err)
			last, lastErr = sum, err.Error()
			continue
		}
		last, lastErr = sum, ""
		cfg.Reload(rs)
	}
}

// readSum returns the checksum of path's bytes, or the read error's text.
func readSum(path string) (uint64, string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err.Error()
	}
	return checksum(data), ""
}

func checksum(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}
