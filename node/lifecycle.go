package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"
)

// This file is a node's life: Open (recovery, joining the cluster, the
// background loops), Close, and the sweep loop.

// Open makes the node ready to decide: with a DataDir it loads the newest
// snapshot and replays the WAL after it, then starts the background loops
// (sweep, snapshots, WAL retention) that Close stops. Check answers
// UNAVAILABLE until Open returns. Open may be called once.
func (n *Node) Open(ctx context.Context) error {
	if n.opened {
		return errors.New("node: Open called twice")
	}
	n.opened = true
	// A Reload waits until the node is open: recovery binds the rules in
	// force, and startCluster publishes their hash.
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	if n.cfg.DataDir != "" {
		rs, err := n.recover(ctx)
		if err != nil {
			return err
		}
		n.recovery = rs
		n.log.Info("recovered", "snapshot", rs.Snapshot, "damaged_snapshots", rs.DamagedSnaps, "snapshot_records", rs.SnapshotRecords,
			"snapshot_bytes", rs.SnapshotBytes, "snapshot_load", rs.SnapshotTime, "wal_sends", rs.Replayed,
			"wal_bytes", rs.ReplayBytes, "wal_replay", rs.ReplayTime, "covered_by_snapshot", rs.Covered,
			"expired", rs.Expired, "dropped_domain_records", rs.UnknownRecords, "dropped_domain_sends", rs.UnknownDomain, "records", rs.Records, "took", rs.Total)
		// Recovery leaves the heap holding pages that its collections
		// freed (images decoded and dropped): collect once more and give
		// them back to the system now, rather than serve beside them. At
		// 100M recipients that took 6 ms and 3.5 bytes a recipient off
		// the resident set.
		debug.FreeOSMemory()
		rss, heap := processMemory()
		m := n.store.Memory()
		n.log.Info("recovery done", "records", rs.Records, "seconds", rs.Total.Seconds(),
			"store_bytes", rs.StoreBytes, "store_mapped_bytes", m.MappedBytes, "go_heap_bytes", heap, "rss_bytes", rss)
		if m.MaxBytes > 0 && m.HeldBytes+m.FreeBytes > m.MaxBytes {
			// Replay never refuses: it carries admitted sends.
			n.log.Warn("the recovered store holds more than its memory limit (was --max-memory lowered?): sends that would create or grow a record are refused until idle records free room",
				"store_bytes", m.HeldBytes, "store_free_bytes", m.FreeBytes, "store_limit", m.MaxBytes, "max_memory", n.cfg.MaxMemory)
		}
	}
	if err := n.startCluster(ctx); err != nil {
		if n.dur != nil {
			n.dur.close()
		}
		return err
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	n.stopLoops = cancel
	if n.cfg.SweepInterval > 0 {
		n.loops.Go(func() { n.sweepLoop(loopCtx) })
	}
	if n.dur != nil {
		n.loops.Go(func() { n.durableLoop(loopCtx) })
	}
	n.ready.Store(true)
	if err := n.announceServing(ctx); err != nil {
		n.Close()
		return err
	}
	return nil
}

// Recovery returns what Open rebuilt the node from.
func (n *Node) Recovery() RecoveryStats { return n.recovery }

// Close stops the background loops and, with a DataDir, writes a final
// snapshot (so that the next start replays no WAL) and closes the WAL. Call
// it after the last Check has returned.
func (n *Node) Close() error {
	n.ready.Store(false)
	n.stopWatchers()
	if n.stopLoops != nil {
		n.stopLoops()
	}
	n.stopMover()
	if c := n.clus.Load(); c != nil {
		if c.ms != nil {
			c.ms.Close() // closes Watch channels: the ring loop ends
		}
	}
	n.peers.Close()
	n.loops.Wait()
	if n.dur == nil {
		return nil
	}
	err := n.snapshot()
	if cerr := n.dur.close(); err == nil {
		err = cerr
	}
	return err
}

// sweepLoop runs Sweep every SweepInterval until ctx is done.
func (n *Node) sweepLoop(ctx context.Context) {
	n.every(ctx, n.cfg.SweepInterval, func() bool {
		start := time.Now()
		got, err := n.Sweep(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			n.log.Error("sweep failed", "err", err)
		case got > 0:
			n.log.Debug("swept idle records", "reclaimed", got, "took", time.Since(start))
		}
		return true
	})
}

// every calls fn every interval, on the ticks of Config.NewTicker, until ctx
// is done or fn returns false: the loop of every background job that polls.
func (n *Node) every(ctx context.Context, interval time.Duration, fn func() bool) {
	tick, stop := n.cfg.NewTicker(interval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		if !fn() {
			return
		}
	}
}

// processMemory returns the process's resident set (VmRSS of
// /proc/self/status, bytes; 0 where there is none) and the bytes of Go heap
// objects, live or not yet swept.
func processMemory() (rss, heap int64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		heap = int64(sample[0].Value.Uint64())
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, heap
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			kb, _ := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10, heap
		}
	}
	return 0, heap
}
