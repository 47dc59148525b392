package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// flush writes one batch and tells its waiters. Flusher only.
func (l *Log) flush(b *batch, closing bool, sticky error) {
	if b.recover && sticky != nil && !closing {
		sticky = l.reopen(sticky)
	}
	seq, base := l.seq, l.size
	taken := time.Now()
	var wrote, synced time.Time
	err := sticky
	if err == nil && len(b.buf) > 0 {
		// pwrite at the logical end: over the zeros of a pre-zeroed segment,
		// or past the end of the file.
		_, werr := l.writeAt(b.buf, l.size)
		wrote = time.Now()
		if werr != nil {
			err = fmt.Errorf("wal: %w", werr)
		} else {
			l.size += int64(len(b.buf))
			l.end = max(l.end, l.size)
			l.written.Add(int64(len(b.buf)))
			l.stats.appends.Add(int64(b.n))
			l.stats.batches.Add(1)
			l.stats.bytes.Add(int64(len(b.buf)))
			l.mu.Lock()
			l.segs[len(l.segs)-1].Size = l.size
			l.mu.Unlock()
			if l.opts.PrepareAfter >= 0 && l.size >= l.opts.PrepareAfter {
				select { // the preparer may start on the next segment
				case l.prepWant <- struct{}{}:
				default:
				}
			}
		}
	}
	if err == nil && (closing || l.fsyncs(b) && (b.sync || len(b.buf) > 0)) {
		w := l.written.Load()
		serr := l.fsync(l.f)
		synced = time.Now()
		if serr != nil {
			err = fmt.Errorf("wal: fsync %s: %w", segmentName(l.seq), serr)
		} else {
			l.synced.Store(w) // the sync loop has nothing to do for it
		}
	} else if err == nil && len(b.buf) > 0 && l.unsynced != nil {
		select { // wake an idle sync loop
		case l.unsynced <- struct{}{}:
		default:
		}
	}
	if err != nil && sticky == nil {
		l.fail(err)
	}
	if err == nil {
		l.good = l.size // told success below
	}

	res := b.res
	if res != nil {
		res.seq, res.base, res.err = seq, base, err
		if wrote.IsZero() {
			wrote = taken
		}
		res.taken, res.wrote, res.synced = taken, wrote, synced
		if b.rotate {
			res.rotErr = err
			if err == nil && !closing {
				res.next, res.rotErr = l.rotate()
			} else if closing {
				res.rotErr = ErrClosed
			}
		}
		close(res.done)
	}

	switch {
	case closing:
		if cerr := l.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("wal: %w", cerr)
		}
		l.closeErr = err
	case err == nil && !b.rotate && l.size >= l.opts.SegmentBytes:
		if _, rerr := l.rotate(); rerr != nil {
			l.logger.Error("wal: rotation failed; the segment grows until the next try", "file", segmentName(l.seq), "err", rerr)
		}
	}
}

// writeAt writes b at off in the active segment: pwrite(2), or the test
// hook that stands for it.
func (l *Log) writeAt(b []byte, off int64) (int, error) {
	if l.opts.testHookWriteAt != nil {
		return l.opts.testHookWriteAt(l.f, b, off)
	}
	return l.f.WriteAt(b, off)
}

// fail records the first write or fsync error; the log then refuses appends
// until Recover succeeds.
func (l *Log) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		l.failed.Store(true)
		l.stats.failures.Add(1)
		l.logger.Error("wal: log failed: appends fail until it recovers (Recover)", "err", err)
	}
	l.mu.Unlock()
}

// reopen is Recover's work in the flusher, for a log failed with sticky: it
// truncates the active segment to the end of its last batch told it
// succeeded, seals it and cuts a new one, and clears the error. It returns
// nil once the log takes appends again, else why not, the log still
// failed. Flusher only.
func (l *Log) reopen(sticky error) error {
	if err := l.f.Truncate(l.good); err != nil {
		return fmt.Errorf("wal: recover: truncate %s to %d bytes: %w (failed with: %w)", segmentName(l.seq), l.good, err, sticky)
	}
	l.size, l.end = l.good, l.good
	l.mu.Lock()
	l.segs[len(l.segs)-1].Size = l.good
	l.mu.Unlock()
	if _, err := l.rotate(); err != nil {
		return fmt.Errorf("wal: recover: %w (failed with: %w)", err, sticky)
	}
	l.mu.Lock()
	l.err = nil
	l.failed.Store(false)
	l.mu.Unlock()
	l.stats.recoveries.Add(1)
	l.logger.Info("wal: log recovered: appends go to a new segment", "file", segmentName(l.seq), "failed_with", sticky)
	return nil
}

func (l *Log) fsync(f *os.File) error {
	start := time.Now()
	ok, err := l.fsyncRing(f)
	if !ok {
		err = f.Sync()
	}
	l.countFsync(time.Since(start))
	return err
}

// fsyncRing fsyncs f through the io_uring, if the log has one; !ok means
// it did not, and f still needs fsync(2). A closed f is !ok, so that
// f.Sync reports it as os.ErrClosed. When the ring breaks, fsyncRing logs
// why, once, and the log goes on with fsync(2).
func (l *Log) fsyncRing(f *os.File) (ok bool, err error) {
	if l.ur == nil {
		return false, nil
	}
	rc, cerr := f.SyscallConn()
	if cerr != nil {
		return false, nil
	}
	if cerr := rc.Control(func(fd uintptr) { ok, err = l.ur.fsync(int(fd)) }); cerr != nil {
		return false, nil
	}
	if !ok {
		l.urOnce.Do(func() { l.logger.Warn("wal: io_uring failed; fsync(2) from now on", "err", err) })
		return false, nil
	}
	return true, err
}

func (l *Log) syncDir() error {
	start := time.Now()
	err := syncDir(l.opts.Dir)
	l.countFsync(time.Since(start))
	return err
}

// countFsync counts one fsync that took d and reports it to Options.OnFsync.
func (l *Log) countFsync(d time.Duration) {
	l.stats.fsyncs.Add(1)
	l.stats.fsyncNanos.Add(int64(d))
	if l.opts.OnFsync != nil {
		l.opts.OnFsync(d)
	}
}

// syncIdleTicks is how many ticks with nothing to fsync the sync loop waits
// before it stops its ticker until the next write: an idle log costs no
// wake-ups.
const syncIdleTicks = 100

// syncLoop fsyncs the active segment on every tick when anything was written
// since the last fsync (under SyncBatch, on every other tick at most, what
// durable appends' fsyncs did not cover). Close stops it and waits for it.
func (l *Log) syncLoop(every time.Duration, tick <-chan time.Time, stop func()) {
	defer close(l.syncerDone)
	defer func() { stop() }()
	idle := 0 // ticks in a row with nothing to fsync
	// Under SyncBatch the loop ticks at half the interval and fsyncs only
	// what was written before the tick before (due) and no durable
	// append's fsync has covered since: under load, those fsyncs cover
	// everything, and the loop's would only hold them up.
	lazy := l.opts.Sync == SyncBatch
	var due int64
	for {
		select {
		case <-l.quit:
			return
		case <-tick:
		}
		// Load written before the file: writes counted in w went to f, or to
		// a segment that rotation fsynced before closing it.
		w := l.written.Load()
		synced := l.synced.Load()
		if w == synced {
			if idle++; idle >= syncIdleTicks {
				// Idle: no ticks until the flusher writes a batch it does
				// not fsync.
				stop()
				stop = func() {}
				select {
				case <-l.quit:
					return
				case <-l.unsynced:
				}
				tick, stop = l.opts.NewTicker(every)
				idle = 0
			}
			due = w
			continue
		}
		idle = 0
		if lazy && synced >= due {
			due = w
			continue
		}
		due = w
		if l.failed.Load() {
			continue // Recover seals the failed segment; appends go to a new one
		}
		f := l.active.Load()
		if err := l.fsync(f); err != nil {
			if errors.Is(err, os.ErrClosed) {
				l.synced.Store(w) // rotated or closed meanwhile; both fsync first
				continue
			}
			l.fail(fmt.Errorf("wal: fsync %s: %w", filepath.Base(f.Name()), err))
			continue
		}
		l.synced.Store(w)
	}
}

// rotate seals the active segment (truncate to its logical size if it was
// pre-zeroed, then fsync) and makes a new one active. If the truncation
// fails or the new segment cannot be made, the old one stays active and the
// error is returned; if the fsync fails, the error is returned and also made
// sticky. Flusher only (or Open before the flusher starts).
func (l *Log) rotate() (Position, error) {
	if l.end > l.size {
		// A sealed segment ends with its last record: drop the unused zeros.
		if err := l.f.Truncate(l.size); err != nil {
			return Position{}, fmt.Errorf("wal: truncate %s before rotation: %w", segmentName(l.seq), err)
		}
		l.end = l.size
	}
	if err := l.fsync(l.f); err != nil {
		err = fmt.Errorf("wal: fsync %s before rotation: %w", segmentName(l.seq), err)
		l.fail(err)
		return Position{}, err
	}
	info, f, end, err := l.cut(l.seq + 1)
	if err != nil {
		return Position{}, err
	}
	old := l.f
	l.f, l.seq, l.size, l.end = f, info.Seq, info.Size, end
	l.good = l.size
	l.active.Store(f)
	l.mu.Lock()
	l.segs[len(l.segs)-1].Sealed = true
	l.segs = append(l.segs, info)
	l.mu.Unlock()
	if err := old.Close(); err != nil {
		l.logger.Warn("wal: close sealed segment", "file", old.Name(), "err", err)
	}
	l.stats.rotations.Add(1)
	return info.First, nil
}

// cut creates segment seq and returns it open for writing, with the file's
// length. If the preparer has a spare segment ready, cut writes the header at
// its offset 0, fsyncs it and renames it to <name>; otherwise it writes the
// header to a new <name>.tmp, fsyncs it and renames that. Either way it then
// fsyncs the directory (etcd's cut), and it never waits for a spare. A file
// named <name> is replaced. Flusher only (or Open before the flusher starts).
func (l *Log) cut(seq uint64) (SegmentInfo, *os.File, int64, error) {
	path := filepath.Join(l.opts.Dir, segmentName(seq))
	created := l.opts.Now()
	hdr := appendSegHeader(make([]byte, 0, segHeaderRecordLen), segHeader{version: formatVersion, seq: seq, created: created})
	var (
		f        *os.File
		tmp      string
		end      int64
		prepared bool
	)
	select {
	case f = <-l.prepared:
		tmp, end, prepared = filepath.Join(l.opts.Dir, spareName), l.opts.SegmentBytes, true
		defer signal(l.prepFree) // after the rename or the removal: the name is free
	default:
		defer signal(l.prepRetry)
		tmp, end = path+tmpExt, int64(len(hdr))
		var err error
		f, err = os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return SegmentInfo{}, nil, 0, fmt.Errorf("wal: cut segment: %w", err)
		}
	}
	_, err := f.WriteAt(hdr, 0)
	if err == nil {
		err = l.fsync(f)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = l.syncDir()
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return SegmentInfo{}, nil, 0, fmt.Errorf("wal: cut segment %s: %w", path, err)
	}
	if prepared {
		l.stats.preparedCuts.Add(1)
	}
	info := SegmentInfo{
		Seq: seq, Path: path, Size: int64(len(hdr)), Created: created,
		First: Position{Seq: seq, Offset: int64(len(hdr))},
	}
	return info, f, max(end, info.Size), nil
}

// signal sends on a channel of capacity 1 unless a signal is already pending.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
