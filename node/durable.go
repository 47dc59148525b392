package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// durable is a node's write-ahead log and snapshot bookkeeping; nil for a
// memory-only node.
type durable struct {
	log  *wal.Log
	dir  string   // DataDir: snapshots here, segments in dir/wal
	lock *dirLock // held from before recovery reads anything until close

	mu        sync.Mutex    // serializes snapshots; guards the fields below
	snapBytes int64         // wal Stats.Bytes when the last snapshot started
	snapAt    int64         // node clock (unix ns) when the last snapshot started
	snapTook  time.Duration // wall time the last snapshot took to write and verify
	// last is the newest intact snapshot's file name (loaded at Open or
	// written and verified since), "" for none. The next snapshot keeps it,
	// and the WAL from its replay start, as the fallback if the new one is
	// damaged later.
	last string
}

// RecoveryStats describe what Open rebuilt the node from.
type RecoveryStats struct {
	Snapshot        string        // file loaded, "" for none
	DamagedSnaps    int           // newer snapshots passed over as damaged (each logged at error level)
	SnapshotRecords int64         // records loaded from it
	SnapshotBytes   int64         // its size
	SnapshotTime    time.Duration // time to load it
	Replayed        int64         // WAL sends inserted
	Covered         int64         // WAL sends already in the snapshot
	Expired         int64         // WAL sends older than their domain's longest window
	UnknownDomain   int64         // WAL sends of a domain the rules no longer have (dropped: Config.DropRemovedDomains)
	UnknownRecords  int64         // snapshot and image records of such domains (dropped likewise)
	Merged          int64         // records merged again from partition images in the WAL
	ReplayBytes     int64         // WAL payload bytes read
	ReplayTime      time.Duration // time to replay them
	Records         int64         // records after recovery, all domains
	StoreBytes      int64         // heap the store's indexes and slabs hold after recovery, all domains
	Total           time.Duration
}

func (n *Node) nowMs() int64 { return n.cfg.Clock.Now() / int64(time.Millisecond) }

// recover locks the data directory, loads the newest snapshot, opens the
// WAL and replays it. On error the lock is released.
func (n *Node) recover(ctx context.Context) (rs RecoveryStats, err error) {
	start := time.Now()
	dir := n.cfg.DataDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rs, err
	}
	// Before anything in dir is read, created or removed: a second node on
	// the directory must fail here and touch nothing of the first one's.
	lock, err := lockDir(dir)
	if err != nil {
		return rs, err
	}
	defer func() {
		if err != nil {
			lock.unlock()
		}
	}()
	if err := n.loadOverrides(); err != nil {
		return rs, err
	}
	now := n.nowMs()
	n.loadUsage(dir)
	var ss *snapshotState
	snaps, err := listSnapshots(dir)
	if err != nil {
		return rs, err
	}
	// Newest first. The one before a damaged snapshot, with the WAL from its
	// replay start (which snapshot keeps), holds everything: falling back
	// loses nothing, so it needs no override.
	var damaged error
	for i := len(snaps) - 1; i >= 0; i-- {
		path := filepath.Join(dir, snaps[i])
		t := time.Now()
		if ss, err = n.loadSnapshot(path, now); err == nil {
			rs.Snapshot, rs.SnapshotRecords, rs.SnapshotBytes, rs.SnapshotTime = path, ss.stats.Records, ss.stats.Bytes, time.Since(t)
			break
		}
		ss = nil
		if damaged == nil {
			damaged = err
		}
		rs.DamagedSnaps++
		next := "the WAL alone"
		if i > 0 {
			next = "the snapshot before it, " + snaps[i-1] + ", and the WAL after that"
		}
		n.log.Error("damaged snapshot: recovering from "+next, "file", path, "err", err)
		if err := n.resetStore(); err != nil {
			return rs, err
		}
	}
	if damaged != nil && ss == nil {
		if !n.cfg.SkipCorrupt {
			return rs, fmt.Errorf("%w (no intact snapshot; start with --skip-corrupt to start from the WAL alone, losing what only the snapshots held)", damaged)
		}
		n.log.Error("no intact snapshot: --skip-corrupt starts from the WAL alone; sends only the snapshots held are lost", "damaged", rs.DamagedSnaps)
	}
	resnap := ss != nil && ss.resnap // a fresh snapshot renumbers in this version's layout
	v := n.view.Load()
	var removed removedDomains
	if ss != nil {
		removed.records = addCounts(nil, ss.unknown)
	}

	log, err := wal.Open(wal.Options{
		Dir: filepath.Join(dir, "wal"), SegmentBytes: n.cfg.SegmentBytes, Sync: n.cfg.Sync, GroupWait: n.cfg.GroupWait,
		PlainFsync:   n.cfg.PlainFsync,
		SyncInterval: n.cfg.SyncInterval, SkipCorrupt: n.cfg.SkipCorrupt, Now: n.cfg.Clock.Now,
		Logger: n.log.With("component", "wal"), OnFsync: n.onFsync(),
	})
	if err != nil {
		return rs, err
	}
	from := wal.Position{}
	if ss != nil {
		from = ss.from
	}
	t := time.Now()
	err = log.Replay(from, func(_ wal.Position, p []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		rs.ReplayBytes += int64(len(p))
		if len(p) > 0 && p[0] == walImages {
			return decodeImages(p, func(img []byte) error {
				_, ms, err := n.store.MergeImage(img, now, v.bindName)
				rs.Merged += ms.Records
				removed.records = addCounts(removed.records, ms.Unknown)
				return err
			})
		}
		return decodeWAL(p, func(s walSend) error {
			dv := v.domains[s.domain]
			part := n.store.PartitionOf(s.key)
			if s.unconfirmed {
				// Not covered by a snapshot taken between the send and
				// the mark: marking an id the store lacks does nothing.
				if dv != nil {
					n.store.Unconfirmed(part, dv.ref, s.key, s.id)
				}
				return nil
			}
			switch {
			case dv == nil:
				if removed.sends == nil {
					removed.sends = map[string]int64{}
				}
				removed.sends[s.domain]++
				return nil
			case ss != nil && ss.covered(s.domain, s.key, s.seq):
				rs.Covered++
				return nil
			case s.at <= now-dv.d.Longest():
				rs.Expired++
				n.store.RaiseSeq(part, s.seq)
				return nil
			}
			rs.Replayed++
			if s.refund {
				_, _, err := n.store.Unrecord(part, dv.ref, s.key, s.tag, s.at, windowItem(s), s.id, s.seq, now)
				return err
			}
			return n.store.Insert(part, dv.ref, s.key, s.tag, s.at, windowItem(s), s.seq, s.id, now)
		})
	})
	rs.ReplayTime = time.Since(t)
	if err != nil {
		log.Close()
		return rs, fmt.Errorf("node: replaying the WAL: %w", err)
	}
	if !removed.empty() {
		rs.UnknownRecords, rs.UnknownDomain = removed.totals()
		if !n.cfg.DropRemovedDomains {
			log.Close()
			return rs, fmt.Errorf("%w: %s holds the history of %s; put the domains back in the rules, or start with --drop-removed-domains to drop that history for good",
				ErrRemovedDomains, dir, removed)
		}
		n.log.Warn("dropping for good the history of domains the rules lack (--drop-removed-domains)",
			"domains", removed.String(), "records", rs.UnknownRecords, "wal_sends", rs.UnknownDomain)
		resnap = true // make the drop durable, so that the next start finds nothing to refuse over
	}
	n.dur = &durable{log: log, dir: dir, lock: lock, snapBytes: log.Stats().Bytes, snapAt: n.cfg.Clock.Now()}
	if ss != nil {
		n.dur.last = filepath.Base(ss.file)
	}
	if resnap {
		if err := n.snapshot(); err != nil {
			log.Close()
			n.dur = nil
			return rs, err
		}
	}
	for _, dv := range v.domains {
		st := n.store.Stats(dv.ref)
		rs.Records += st.Records
		rs.StoreBytes += st.IndexBytes + st.SlabBytes
	}
	rs.Total = time.Since(start)
	if n.cfg.Observer != nil {
		n.cfg.Observer.Recovery(rs.Total)
	}
	return rs, nil
}

// onFsync returns the WAL's fsync hook: the Observer's Fsync, or nil.
func (n *Node) onFsync() func(time.Duration) {
	if n.cfg.Observer == nil {
		return nil
	}
	return n.cfg.Observer.Fsync
}

// resetStore empties the store, after a partial snapshot load. Open calls
// it before the node serves.
func (n *Node) resetStore() error {
	st, err := newStore(&n.cfg)
	if err != nil {
		return err
	}
	n.store = st
	n.view.Store(n.bind(n.view.Load().rules))
	return nil
}

// close closes the WAL and releases the data directory.
func (d *durable) close() error {
	err := d.log.Close()
	d.lock.unlock()
	return err
}

// appendWAL makes the sends of one Check durable before it replies, with
// the append its ticket announced; with no send to log, it withdraws it.
func (n *Node) appendWAL(ctx context.Context, enc *walEncoder, t *walTicket) error {
	if enc.n == 0 {
		t.cancel()
		return nil
	}
	t.used = true
	_, err := t.log.AppendExpected(ctx, enc.bytes())
	return err
}

// snapshot writes a snapshot and reads it back to verify it. Then it
// deletes the snapshots before the previous intact one and the WAL segments
// before that one's replay start: the previous snapshot and the WAL after it
// stay, so that a byte damaged later in the new snapshot costs nothing (Open
// falls back to them). With no previous snapshot, the WAL stays whole (but
// for retention). A snapshot that fails verification is removed and
// returned as an error; the previous one stays.
func (n *Node) snapshot() error {
	d := n.dur
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	if err := n.saveUsage(d.dir); err != nil {
		n.log.Error("usage statistics not saved: a crash before the next snapshot loses those since the last one", "err", err)
	}
	// Every send appended before the rotation is in a segment before from,
	// and in the records the snapshot copies; later ones carry higher shard
	// sequence numbers than the snapshot saves, or are in it already.
	from, err := d.log.Rotate()
	if err != nil {
		return fmt.Errorf("node: snapshot: %w", err)
	}
	walBytes := d.log.Stats().Bytes
	nowNs := n.cfg.Clock.Now()
	name := snapName(from.Seq)
	st, err := n.writeSnapshot(d.dir, from, nowNs/int64(time.Millisecond))
	if err != nil {
		return fmt.Errorf("node: snapshot: %w", err)
	}
	wrote := time.Now()
	if err := verifySnapshot(filepath.Join(d.dir, name), n.store.Partitions(), snapshotChunk(n.cfg.MaxMemory)); err != nil {
		os.Remove(filepath.Join(d.dir, name))
		return fmt.Errorf("node: snapshot failed verification, removed; %s stays: %w", d.last, err)
	}
	d.snapBytes, d.snapAt, d.snapTook = walBytes, nowNs, time.Since(start)
	if n.cfg.Observer != nil {
		n.cfg.Observer.Snapshot(d.snapTook)
	}
	prev := d.last
	d.last = name
	snaps, err := listSnapshots(d.dir)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s != name && s != prev {
			if err := os.Remove(filepath.Join(d.dir, s)); err != nil {
				return err
			}
		}
	}
	removed := 0
	if prev != "" {
		if removed, err = d.log.RemoveBefore(snapSeq(prev)); err != nil {
			return err
		}
	}
	n.snapshots.Add(1)
	n.log.Info("snapshot written", "file", name, "records", st.Records, "bytes", st.Bytes, "kept", prev,
		"took", time.Since(start), "write", wrote.Sub(start), "verify", time.Since(wrote), "wal_segments_removed", removed)
	return nil
}

// retain deletes WAL segments whose every send is older than the longest
// window plus RetentionMargin: no record can depend on them.
func (n *Node) retain() error {
	cutoff := n.cfg.Clock.Now() - n.view.Load().longest*int64(time.Millisecond) - int64(n.cfg.RetentionMargin)
	segs := n.dur.log.Segments()
	var before uint64
	for i := 0; i+1 < len(segs); i++ {
		if segs[i+1].Created <= cutoff { // segment i holds only sends before this
			before = segs[i+1].Seq
		}
	}
	if before == 0 {
		return nil
	}
	removed, err := n.dur.log.RemoveBefore(before)
	if removed > 0 {
		n.log.Debug("expired WAL segments removed", "count", removed)
	}
	return err
}

// snapshotDuty is the most of the time snapshots take: after a snapshot
// that took d, the next starts no sooner than snapshotDuty*d after the last
// one started. A snapshot of 100M recipients takes about 25 s of a core; at
// the default 1-minute interval, or every 64 MiB of WAL (20 s at 120,000
// decisions/s), it would run almost all the time.
const snapshotDuty = 10

// snapshotDue reports whether a snapshot is due, the last one having
// started age ago and taken took, the WAL having grown by grown bytes since:
// when the WAL grew by walBytes or interval passed (each if positive), and
// snapshots stay within 1/snapshotDuty of the time.
func snapshotDue(interval time.Duration, walBytes, grown int64, age, took time.Duration) bool {
	if age < snapshotDuty*took {
		return false
	}
	return (walBytes > 0 && grown >= walBytes) || (interval > 0 && age >= interval && grown > 0)
}

// durableLoop takes snapshots and expires WAL segments until ctx is done.
func (n *Node) durableLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d := n.dur
		d.mu.Lock()
		grown := d.log.Stats().Bytes - d.snapBytes
		age := time.Duration(n.cfg.Clock.Now() - d.snapAt)
		took := d.snapTook
		d.mu.Unlock()
		if snapshotDue(n.cfg.SnapshotInterval, n.cfg.SnapshotWALBytes, grown, age, took) {
			if err := n.snapshot(); err != nil {
				n.log.Error("snapshot failed", "err", err)
			}
		}
		if err := n.retain(); err != nil {
			n.log.Error("WAL retention failed", "err", err)
		}
	}
}

// walTicket is a WAL append that a call announced as soon as it arrived (wal
// Expect), so that the group commit in progress waits for it; the call makes
// it or withdraws it, once. A nil ticket (no WAL) does nothing.
type walTicket struct {
	log  *wal.Log
	used bool
}

// announce returns a ticket for this call's WAL append, or nil without a WAL.
func (n *Node) announce() *walTicket {
	if n.dur == nil {
		return nil
	}
	n.dur.log.Expect()
	return &walTicket{log: n.dur.log}
}

// cancel withdraws the announcement unless the append was made.
func (t *walTicket) cancel() {
	if t != nil && !t.used {
		t.used = true
		t.log.Unexpect()
	}
}

// windowItem is the item a WAL send records.
func windowItem(s walSend) window.Item {
	return window.Item{Content: s.content, Cost: s.cost, Mode: window.RecordOnly}
}
