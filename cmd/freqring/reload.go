package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

// watchRules reloads n's rules, loaded from path as from, when the file changes (read every
// interval; negative: never) and on SIGHUP, until ctx is done. A file that
// does not parse keeps the rules in force: the node logs it (file:line and
// the field) and counts a failed reload. With no rules file, SIGHUP logs that
// there is nothing to reload.
func watchRules(ctx context.Context, path string, from *rules.Set, interval time.Duration, n *node.Node, logger *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	now := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if path == "" {
					logger.Warn("SIGHUP: the node runs the embedded default rules (no --rules file): nothing to reload")
					continue
				}
				logger.Info("SIGHUP: reloading the rules", "rules", path)
				select {
				case now <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	if path == "" {
		<-ctx.Done()
		return
	}
	_ = rules.Watch(ctx, path, rules.WatchConfig{From: from, Interval: interval, Now: now,
		Reload: func(rs *rules.Set) { _ = n.Reload(ctx, rs) }, // Reload logs and counts its own outcome
		Failed: n.ReloadFailed,
	})
}
