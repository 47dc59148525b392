package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/store"
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
	snapSize  int64         // bytes of the last snapshot written or loaded; 0 for none
	// snapFailed counts the snapshots that failed in a row (0 after one
	// that succeeded); retryAt is when the next may start (unix ns, node
	// clock), backing off after each failure.
	snapFailed int
	retryAt    int64
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

// appendWAL writes the sends of one Check to the WAL before it replies,
// and with fsync (under wal.SyncBatch) waits for their fsync, with the
// append its ticket announced; with no send to log, it withdraws it.
func (n *Node) appendWAL(ctx context.Context, enc *walEncoder, t *walTicket, fsync bool) (wal.Commit, error) {
	if enc.n == 0 {
		t.cancel()
		return wal.Commit{}, nil
	}
	t.used = true
	return t.log.AppendExpected(ctx, enc.bytes(), fsync)
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
	from, err := d.replayStart()
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
	d.snapBytes, d.snapAt, d.snapTook, d.snapSize = walBytes, nowNs, time.Since(start), st.Bytes
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

// replayStart returns where the replay of a snapshot begun now starts:
// the first position of a new segment (wal.Log.Rotate), or of the active
// one if it holds no record yet and no snapshot starts there, so that a
// snapshot tried again after a failure cuts no segment. A record appended
// meanwhile lands at or after it, and replays as any later send does. d.mu
// is held.
func (d *durable) replayStart() (wal.Position, error) {
	segs := d.log.Segments()
	if last := segs[len(segs)-1]; last.Size == last.First.Offset && d.last != snapName(last.Seq) {
		return last.First, nil
	}
	return d.log.Rotate()
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
// snapshots stay within 1/snapshotDuty of the time and the WAL grew by at
// least least bytes (snapshotLeast).
func snapshotDue(interval time.Duration, walBytes, least, grown int64, age, took time.Duration) bool {
	if age < snapshotDuty*took || grown < least {
		return false
	}
	return (walBytes > 0 && grown >= walBytes) || (interval > 0 && age >= interval && grown > 0)
}

// snapshotLeast returns the WAL bytes that must be written before a
// snapshot follows one of size bytes, so that snapshots write at most ratio
// times the WAL's bytes (Config.SnapshotWALRatio): size/ratio, 0 for a
// ratio that is not positive.
func snapshotLeast(size int64, ratio float64) int64 {
	if ratio <= 0 {
		return 0
	}
	return int64(float64(size) / ratio)
}

// durableLoop brings a failed WAL back, takes snapshots and expires WAL
// segments until ctx is done.
func (n *Node) durableLoop(ctx context.Context) {
	var rec walRecovery
	n.every(ctx, time.Second, func() bool {
		if n.recoverWAL(&rec) { // no snapshot or retention while the WAL has failed
			n.durableChores()
		}
		return true
	})
}

// durableChores takes a snapshot when one is due and the last failures'
// backoff has passed, and expires WAL segments.
func (n *Node) durableChores() {
	d := n.dur
	d.mu.Lock()
	grown := d.log.Stats().Bytes - d.snapBytes
	now := n.cfg.Clock.Now()
	age := time.Duration(now - d.snapAt)
	took := d.snapTook
	retry := now >= d.retryAt
	least := snapshotLeast(d.snapSize, n.cfg.SnapshotWALRatio)
	d.mu.Unlock()
	if retry && snapshotDue(n.cfg.SnapshotInterval, n.cfg.SnapshotWALBytes, least, grown, age, took) {
		n.trySnapshot()
	}
	if err := n.retain(); err != nil {
		n.log.Error("WAL retention failed", "err", err)
	}
}

// walRecovery is durableLoop's state of a failed WAL.
type walRecovery struct {
	failed bool          // the WAL had failed at the last look
	next   time.Time     // the next Recover, while failed
	wait   time.Duration // the pause before the one after
	logs   throttle
}

// Backoff of WAL recoveries and of snapshots after failures.
const (
	walRetryMin  = time.Second
	walRetryMax  = 30 * time.Second
	snapRetryMin = 10 * time.Second
	snapRetryMax = 10 * time.Minute
)

// recoverWAL tries, while the WAL has failed, to bring it back
// (wal.Log.Recover), backing off from walRetryMin to walRetryMax between
// tries, and tells Serve's health of each change. It reports whether the
// WAL takes appends.
func (n *Node) recoverWAL(rec *walRecovery) bool {
	log := n.dur.log
	if !log.Failed() {
		if rec.failed {
			rec.failed = false
			n.servingChanged()
		}
		return true
	}
	now := time.Now()
	if !rec.failed {
		rec.failed, rec.next, rec.wait = true, now.Add(walRetryMin), walRetryMin
		n.log.Error("the write-ahead log failed: the node records nothing and reports not ready until it recovers; it retries with backoff",
			"err", log.Err(), "retry_in", walRetryMin)
		n.servingChanged()
		return false
	}
	if now.Before(rec.next) {
		return false
	}
	err := log.Recover()
	if err == nil {
		rec.failed = false
		n.log.Info("the write-ahead log recovered: the node records and reports ready again")
		n.servingChanged()
		return true
	}
	rec.wait = min(2*rec.wait, walRetryMax)
	rec.next = now.Add(rec.wait)
	if ok, held := rec.logs.allow(now.UnixNano(), walLogEvery); ok {
		n.log.Warn("the write-ahead log has not recovered yet", "err", err, "retry_in", rec.wait, "tries_not_logged", held)
	}
	return false
}

// trySnapshot takes a snapshot if the data directory has room for it, and
// backs off after a failure: the next try comes snapRetryMin after the
// first failure, twice as long after each further one, at most
// snapRetryMax.
func (n *Node) trySnapshot() {
	d := n.dur
	err := n.checkSnapshotRoom()
	if err == nil {
		err = n.snapshot()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		d.snapFailed, d.retryAt = 0, 0
		return
	}
	d.snapFailed++
	wait := min(snapRetryMin<<min(d.snapFailed-1, 16), snapRetryMax)
	d.retryAt = n.cfg.Clock.Now() + int64(wait)
	n.snapshotFailures.Add(1)
	n.log.Error("snapshot failed: the previous one and the WAL after it stay", "err", err, "failed_in_a_row", d.snapFailed, "retry_in", wait)
}

// checkSnapshotRoom fails if the data directory's file system lacks room
// for a snapshot: as large as the last one, or as the records' live bytes
// if larger, plus a tenth, plus two WAL segments (the next one and its
// spare), which the WAL needs more than the snapshot does.
func (n *Node) checkSnapshotRoom() error {
	d := n.dur
	free, ok := freeBytes(d.dir)
	if !ok {
		return nil // unknown here: try
	}
	var live int64
	v := n.view.Load()
	for _, name := range v.names {
		live += n.store.Stats(v.domains[name].ref).LiveBytes
	}
	d.mu.Lock()
	need := max(d.snapSize, live)
	d.mu.Unlock()
	need += need/10 + 2*cmp.Or(n.cfg.SegmentBytes, 64<<20)
	if free < need {
		return fmt.Errorf("%w: %s has %d bytes free, a snapshot needs about %d (its estimated size, a tenth more, and room for the WAL)", errNoRoom, d.dir, free, need)
	}
	return nil
}

// errNoRoom is a snapshot not tried for lack of disk space.
var errNoRoom = errors.New("node: no room for a snapshot")

// probeDir fails if dir cannot take a new file: a node that could not write
// its WAL or snapshots would fail every check it must record.
func probeDir(dir string) error {
	path := filepath.Join(dir, ".probe.tmp")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.Write(make([]byte, 4096))
		if serr := f.Sync(); err == nil {
			err = serr
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(path); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("node: the data directory %s cannot take a new file (%w): free space or fix its permissions, or give another --data-dir", dir, err)
	}
	return nil
}

// removeLeftovers removes the temporary files an interrupted write left in
// dir: a snapshot, overrides, members or usage file written as NAME.tmp and
// renamed only once complete.
func (n *Node) removeLeftovers(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if name := e.Name(); e.Type().IsRegular() && strings.HasSuffix(name, ".tmp") {
			path := filepath.Join(dir, name)
			if err := os.Remove(path); err != nil {
				n.log.Warn("a leftover temporary file could not be removed", "file", path, "err", err)
				continue
			}
			n.log.Info("removed a leftover temporary file of an interrupted write", "file", path)
		}
	}
}

// checkWALStart logs what recovery cannot replay: segments deleted after a
// snapshot whose file is now missing. Segments are deleted before the
// replay start of the snapshot before the newest, or when every send in
// them is older than the longest window; a WAL whose first segment was made
// within the longest window, with no snapshot that replays from it or
// before, lost the snapshot that covered what came before.
func (n *Node) checkWALStart(log *wal.Log, ss *snapshotState, nowMs int64) {
	segs := log.Segments()
	if len(segs) == 0 || segs[0].Seq <= 1 {
		return
	}
	first := segs[0]
	if ss != nil && ss.from.Seq >= first.Seq {
		return
	}
	longest := n.view.Load().longest
	if first.Created/int64(time.Millisecond) <= nowMs-longest {
		return // what came before is older than every window
	}
	snap := "none"
	if ss != nil {
		snap = filepath.Base(ss.file)
	}
	n.log.Error("the WAL begins within the longest window and no snapshot covers what came before it: a snapshot is missing, and the sends only it held are lost",
		"first_segment", filepath.Base(first.Path), "created", time.Unix(0, first.Created).UTC(),
		"longest_window", time.Duration(longest)*time.Millisecond, "snapshot", snap)
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

// walFailedError is the error of an item that would be recorded while the
// WAL has failed: nothing is recorded until it recovers.
func (n *Node) walFailedError() *itemError {
	return &itemError{code: codes.Unavailable, msg: fmt.Sprintf("node %s: the write-ahead log failed (%v): it records nothing until the log recovers; retry",
		n.cfg.Name, n.dur.log.Err())}
}

// refuseWhileWALFailed fails, while the WAL has failed, every item of b
// (idx, or all when nil) that would record a send or a refund, before it
// reaches the store: none of them could be made durable. Peeks go on.
func (n *Node) refuseWhileWALFailed(b *batch, idx []int) {
	if n.dur == nil || !n.dur.log.Failed() {
		return
	}
	var ierr *itemError
	each(len(b.items), idx, func(i int) {
		if x := &b.items[i]; x.err == nil && (x.refund || x.it.Mode != window.Peek) {
			if ierr == nil {
				ierr = n.walFailedError()
			}
			x.err = ierr
		}
	})
}

// each calls fn with every index of idx, or 0 to n-1 when idx is nil.
func each(n int, idx []int, fn func(i int)) {
	if idx == nil {
		for i := range n {
			fn(i)
		}
		return
	}
	for _, i := range idx {
		fn(i)
	}
}

// takeBack undoes in the store the sends and refunds of a WAL payload whose
// append failed: a send is taken back (store.Unrecord, which also makes a
// retry of its request id a new attempt) and a refunded send recorded again,
// so that memory agrees with the log, which holds none of them (wal.Recover
// truncates a failed batch away). Under r, each one's inverse goes to the
// partition's backup, which may hold it already. It returns how many it
// undid.
func (n *Node) takeBack(ctx context.Context, payload []byte, r *ring.Ring) int {
	v := n.view.Load()
	now := n.nowMs()
	var rs *replicaSet
	if r != nil && n.cfg.Replication != ReplicationOff && r.Len() > 1 {
		rs = n.takeReplicaSet(0, r.Len())
		defer n.releaseReplicaSet(rs)
	}
	undone := 0
	err := decodeWAL(payload, func(s walSend) error {
		dv := v.domains[s.domain]
		if dv == nil || s.unconfirmed {
			return nil
		}
		p := n.store.PartitionOf(s.key)
		if err := n.undo(p, dv.ref, s.key, s.tag, s.at, windowItem(s), s.id, s.refund, now); err != nil {
			n.log.Error("taking back a send the WAL did not take failed: memory counts it until it expires", "partition", p, "at", s.at, "err", err)
			return nil
		}
		undone++
		if rs != nil {
			s.refund, s.seq = !s.refund, 0
			rs.add(r, p, -1, s)
		}
		return nil
	})
	if err != nil {
		n.log.Error("BUG: a WAL payload this node encoded does not decode", "err", err)
	}
	if rs != nil && len(rs.backups) > 0 {
		n.replicate(context.WithoutCancel(ctx), r, rs, n.cfg.Replication == ReplicationAsync)
		for _, rb := range rs.backups {
			if rb.err != nil {
				n.log.Warn("a backup did not take back sends its owner's WAL did not take: it counts them until they expire", "backup", rb.member.Name, "sends", len(rb.sends), "err", rb.err)
			}
		}
	}
	return undone
}

// undo takes back in the store a send recorded at at (store.Unrecord,
// which also makes a retry of its request id a new attempt), or, for a
// refund, records the refunded send again.
func (n *Node) undo(p int, ref store.Ref, key uint64, tag uint16, at int64, it window.Item, id uint64, refund bool, now int64) error {
	var err error
	if refund {
		_, _, err = n.store.Record(p, ref, key, tag, at, it, id, now)
	} else {
		_, _, err = n.store.Unrecord(p, ref, key, tag, at, it, id, 0, now)
	}
	return err
}

// walFlight tells when the calls whose sends are in the store but not yet
// in the WAL or on their backup have ended: a duplicate is answered as
// recorded only once the call that recorded it has ended
// (pass.confirmDuplicates), and that call may take its sends back. A call
// enters before its store changes and leaves after its append, its
// replication and any take-back. Safe for concurrent use.
type walFlight struct {
	mu      sync.Mutex // guards the fields below
	epoch   uint64     // calls enter slot epoch&1
	count   [2]int
	drained [2]chan struct{} // closed when the slot's count reaches 0 after a barrier began on it

	barrier sync.Mutex // serializes barriers: each drains the slot the one before it left filling
}

// enter counts a call in and returns its slot for leave.
func (f *walFlight) enter() int {
	f.mu.Lock()
	s := int(f.epoch & 1)
	f.count[s]++
	f.mu.Unlock()
	return s
}

// leave counts a call of slot s out.
func (f *walFlight) leave(s int) {
	f.mu.Lock()
	if f.count[s]--; f.count[s] == 0 && f.drained[s] != nil {
		close(f.drained[s])
		f.drained[s] = nil
	}
	f.mu.Unlock()
}

// wait returns once every call that entered before it has left, or when
// ctx is done.
func (f *walFlight) wait(ctx context.Context) error {
	f.barrier.Lock()
	defer f.barrier.Unlock()
	f.mu.Lock()
	s := int(f.epoch & 1)
	if f.count[s^1] > 0 {
		// Left filled by a barrier whose caller gave up: drain it first,
		// as no call enters it now, so that the flip below leaves no call
		// of before this barrier in the slot later calls enter.
		if err := f.drain(ctx, s^1); err != nil {
			return err
		}
		f.mu.Lock()
	}
	if f.count[s] == 0 {
		f.mu.Unlock()
		return nil
	}
	f.epoch++ // later calls enter the other slot
	return f.drain(ctx, s)
}

// drain waits until slot s is empty or ctx is done; f.mu is held, and
// released.
func (f *walFlight) drain(ctx context.Context, s int) error {
	ch := make(chan struct{})
	f.drained[s] = ch
	f.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
