package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
)

// recovery is one Open's rebuild of the node from its data directory:
// what it loaded so far and the counts it reports. Used by one goroutine.
type recovery struct {
	n       *Node
	dir     string
	now     int64          // node clock at the start, unix ms: what is expired is judged against it
	v       *view          // the rules recovery rebuilds under
	ss      *snapshotState // the snapshot loaded; nil for none
	removed removedDomains // history of domains the rules lack
	resnap  bool           // write a snapshot once recovered
	rs      RecoveryStats
	// pending are the sends replay inserts next, in one store.InsertBatch
	// (flush).
	pending []store.InsertItem
}

// replayBatch is how many sends replay hands the store at once: enough for
// its prefetching to keep many cache misses in flight over a store too
// large for the caches.
const replayBatch = 4096

// recover locks the data directory, loads the newest intact snapshot, opens
// the WAL, replays it and settles the history of removed domains. On error
// the lock is released.
func (n *Node) recover(ctx context.Context) (RecoveryStats, error) {
	start := time.Now()
	r := &recovery{n: n, dir: n.cfg.DataDir}
	lock, err := n.openDataDir(r.dir)
	if err != nil {
		return r.rs, err
	}
	r.now = n.nowMs()
	r.v = n.view.Load()
	log, err := r.rebuild(ctx)
	if err == nil {
		err = r.finish(log, lock)
	}
	if err != nil {
		if log != nil {
			log.Close()
		}
		lock.unlock()
		return r.rs, err
	}
	r.rs.Total = time.Since(start)
	if n.cfg.Observer != nil {
		n.cfg.Observer.Recovery(r.rs.Total)
	}
	return r.rs, nil
}

// openDataDir creates and locks dir, checks that it takes writes, removes
// what an interrupted write left and loads the overrides and usage files.
// The lock comes before anything in dir is read, created or removed: a
// second node on the directory fails here and touches nothing of the first
// one's. On error the lock is released.
func (n *Node) openDataDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if err := probeDir(dir); err != nil {
		lock.unlock()
		return nil, err
	}
	n.removeLeftovers(dir)
	if err := n.loadOverrides(); err != nil {
		lock.unlock()
		return nil, err
	}
	n.loadUsage(dir)
	return lock, nil
}

// rebuild loads the snapshot, opens the WAL and replays it from where the
// snapshot leaves off. It returns the open WAL even on error, for the
// caller to close.
func (r *recovery) rebuild(ctx context.Context) (*wal.Log, error) {
	if err := r.loadNewestSnapshot(); err != nil {
		return nil, err
	}
	log, err := r.openWAL()
	if err != nil {
		return nil, err
	}
	if err := r.replay(ctx, log); err != nil {
		return log, fmt.Errorf("node: replaying the WAL: %w", err)
	}
	return log, r.settleRemovedDomains()
}

// loadNewestSnapshot loads the newest intact snapshot, newest first. The one
// before a damaged snapshot, with the WAL from its replay start (which
// snapshot keeps), holds everything: falling back loses nothing, so it needs
// no override. With none intact, starting from the WAL alone needs
// Config.SkipCorrupt.
func (r *recovery) loadNewestSnapshot() error {
	n := r.n
	snaps, err := listSnapshots(r.dir)
	if err != nil {
		return err
	}
	var damaged error
	for i := len(snaps) - 1; i >= 0; i-- {
		path := filepath.Join(r.dir, snaps[i])
		t := time.Now()
		ss, err := n.loadSnapshot(path, r.now)
		if err == nil {
			r.ss = ss
			r.rs.Snapshot, r.rs.SnapshotRecords, r.rs.SnapshotBytes, r.rs.SnapshotTime = path, ss.stats.Records, ss.stats.Bytes, time.Since(t)
			r.resnap = ss.resnap // a fresh snapshot renumbers in this version's layout
			r.removed.records = addCounts(nil, ss.unknown)
			return nil
		}
		if damaged == nil {
			damaged = err
		}
		r.rs.DamagedSnaps++
		next := "the WAL alone"
		if i > 0 {
			next = "the snapshot before it, " + snaps[i-1] + ", and the WAL after that"
		}
		n.log.Error("damaged snapshot: recovering from "+next, "file", path, "err", err)
		if err := n.resetStore(); err != nil {
			return err
		}
	}
	if damaged == nil {
		return nil
	}
	if !n.cfg.SkipCorrupt {
		return fmt.Errorf("%w (no intact snapshot; start with --skip-corrupt to start from the WAL alone, losing what only the snapshots held)", damaged)
	}
	n.log.Error("no intact snapshot: --skip-corrupt starts from the WAL alone; sends only the snapshots held are lost", "damaged", r.rs.DamagedSnaps)
	return nil
}

// openWAL opens the WAL in dir/wal and checks that it starts where the
// snapshot's replay does.
func (r *recovery) openWAL() (*wal.Log, error) {
	n := r.n
	log, err := wal.Open(wal.Options{
		Dir: filepath.Join(r.dir, "wal"), SegmentBytes: n.cfg.SegmentBytes, Sync: n.cfg.Sync, GroupWait: n.cfg.GroupWait,
		PlainFsync:   n.cfg.PlainFsync,
		SyncInterval: n.cfg.SyncInterval, SkipCorrupt: n.cfg.SkipCorrupt, Now: n.cfg.Clock.Now,
		Logger: n.log.With("component", "wal"), OnFsync: n.onFsync(),
	})
	if err != nil {
		return nil, err
	}
	n.checkWALStart(log, r.ss, r.now)
	return log, nil
}

// replay applies the WAL's records from the snapshot's replay start: sends
// and their marks, and partition images merged again. Sends are inserted
// in batches (flush); a mark or an image waits for the sends before it.
func (r *recovery) replay(ctx context.Context, log *wal.Log) error {
	from := wal.Position{}
	if r.ss != nil {
		from = r.ss.from
	}
	t := time.Now()
	defer func() { r.rs.ReplayTime = time.Since(t) }()
	err := log.Replay(from, func(_ wal.Position, p []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.rs.ReplayBytes += int64(len(p))
		if len(p) > 0 && p[0] == walImages {
			if err := r.flush(); err != nil {
				return err
			}
			return decodeImages(p, r.mergeImage)
		}
		return decodeWAL(p, r.replaySend)
	})
	if err != nil {
		return err
	}
	return r.flush()
}

// flush inserts the pending sends.
func (r *recovery) flush() error {
	if len(r.pending) == 0 {
		return nil
	}
	r.n.store.InsertBatch(r.now, r.pending)
	for _, x := range r.pending {
		if x.Err != nil {
			return x.Err
		}
	}
	r.pending = r.pending[:0]
	return nil
}

// mergeImage merges a partition image from the WAL into the store again.
func (r *recovery) mergeImage(img []byte) error {
	_, ms, err := r.n.store.MergeImage(img, r.now, r.v.bindName)
	r.rs.Merged += ms.Records
	r.removed.records = addCounts(r.removed.records, ms.Unknown)
	return err
}

// replaySend applies one WAL send: a mark, a removed domain's send (counted
// for settleRemovedDomains), one the snapshot covers or one expired (passed
// over), or a refund or an insert (batched: flush).
func (r *recovery) replaySend(s walSend) error {
	n := r.n
	dv := r.v.domains[s.domain]
	part := n.store.PartitionOf(s.key)
	if s.unconfirmed {
		// Not covered by a snapshot taken between the send and the mark:
		// marking an id the store lacks does nothing. The send it marks
		// may be pending.
		if dv != nil {
			if err := r.flush(); err != nil {
				return err
			}
			n.store.Unconfirmed(part, dv.ref, s.key, s.id)
		}
		return nil
	}
	switch {
	case dv == nil:
		if r.removed.sends == nil {
			r.removed.sends = map[string]int64{}
		}
		r.removed.sends[s.domain]++
		return nil
	case r.ss != nil && r.ss.covered(s.domain, s.key, s.seq):
		r.rs.Covered++
		return nil
	case s.at <= r.now-dv.d.Longest():
		r.rs.Expired++
		n.store.RaiseSeq(part, s.seq)
		return nil
	}
	r.rs.Replayed++
	r.pending = append(r.pending, store.InsertItem{Part: part, Ref: dv.ref, Key: s.key, Tag: s.tag, At: s.at, Item: windowItem(s),
		Seq: s.seq, ID: s.id, Refund: s.refund})
	if len(r.pending) >= replayBatch {
		return r.flush()
	}
	return nil
}

// settleRemovedDomains refuses to start over the history of domains the
// rules lack, unless Config.DropRemovedDomains drops it for good (made
// durable by a snapshot once recovered).
func (r *recovery) settleRemovedDomains() error {
	if r.removed.empty() {
		return nil
	}
	n := r.n
	r.rs.UnknownRecords, r.rs.UnknownDomain = r.removed.totals()
	if !n.cfg.DropRemovedDomains {
		return fmt.Errorf("%w: %s holds the history of %s; put the domains back in the rules, or start with --drop-removed-domains to drop that history for good",
			ErrRemovedDomains, r.dir, r.removed)
	}
	n.log.Warn("dropping for good the history of domains the rules lack (--drop-removed-domains)",
		"domains", r.removed.String(), "records", r.rs.UnknownRecords, "wal_sends", r.rs.UnknownDomain)
	r.resnap = true // so that the next start finds nothing to refuse over
	return nil
}

// finish hands the WAL and lock to the node, writes the snapshot recovery
// asked for and counts what the store holds.
func (r *recovery) finish(log *wal.Log, lock *dirLock) error {
	n := r.n
	n.dur = &durable{log: log, dir: r.dir, lock: lock, snapBytes: log.Stats().Bytes, snapAt: n.cfg.Clock.Now()}
	if r.ss != nil {
		n.dur.last = filepath.Base(r.ss.file)
		n.dur.snapSize = r.rs.SnapshotBytes
	}
	if r.resnap {
		if err := n.snapshot(); err != nil {
			n.dur = nil
			return err
		}
	}
	for _, dv := range r.v.domains {
		st := n.store.Stats(dv.ref)
		r.rs.Records += st.Records
		r.rs.StoreBytes += st.IndexBytes + st.SlabBytes
	}
	return nil
}
