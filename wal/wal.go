package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// SyncPolicy decides when appended records are fsynced. See the package
// documentation for what each policy can lose.
type SyncPolicy int

const (
	// SyncBatch fsyncs every group-commit batch before its Appends return.
	// It is the zero value and the default.
	SyncBatch SyncPolicy = iota
	// SyncInterval returns from Append after write(2); a background loop
	// fsyncs every Options.SyncInterval when anything was written.
	SyncInterval
	// SyncNone never fsyncs appended records, except on Sync, Rotate
	// (the sealed segment) and Close.
	SyncNone
)

func (p SyncPolicy) String() string {
	switch p {
	case SyncBatch:
		return "batch"
	case SyncInterval:
		return "interval"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// Options configures a Log. A zero field takes the default named in its comment.
type Options struct {
	Dir           string        // directory of the segment files; required, created if missing
	SegmentBytes  int64         // rotate after a batch that brings the segment to this size; 0 means 64 MiB
	Sync          SyncPolicy    // 0 means SyncBatch
	SyncInterval  time.Duration // fsync period under SyncInterval; 0 means 10ms
	MaxBatchBytes int           // Appends wait while the pending batch holds this much; 0 means 4 MiB
	// PrepareAfter is how full the active segment gets, in bytes, before a
	// background preparer zeroes the next segment, so that an idle or newly
	// started log spends neither disk nor I/O on a spare. 0 means half of
	// SegmentBytes; negative means at once.
	PrepareAfter int64
	// GroupWait is how long the flusher, holding a batch while other
	// callers have announced Appends (Expect), gathers more before it writes
	// (and fsyncs) the batch; a full batch ends it early. 0 means 1ms,
	// negative never waits. With no announcement pending, it never waits.
	GroupWait time.Duration
	// SkipCorrupt is an operator override: Open skips damaged bytes instead of
	// refusing to open, logs each skip and counts them in Stats.SkippedBytes.
	SkipCorrupt bool
	Now         func() int64 // unix ns, written as segment creation times; nil means time.Now().UnixNano
	// NewTicker starts the SyncInterval loop's ticker and returns its channel
	// and stop function; nil means time.NewTicker. Tests inject their own.
	NewTicker func(d time.Duration) (<-chan time.Time, func())
	Logger    *slog.Logger // nil means discard

	testHookFlush    func() // called by the flusher after it takes a batch; tests only
	testHookPrepare  func() // called by the preparer before it makes a spare segment; tests only
	testHookPrepared func() // called by the preparer once a spare segment is ready for a cut; tests only
	noSpare          bool   // no preparer: every cut makes a plain file; tests and benchmarks only
}

const (
	defaultSegmentBytes  = 64 << 20
	defaultSyncInterval  = 10 * time.Millisecond
	defaultMaxBatchBytes = 4 << 20
	minSegmentBytes      = segHeaderRecordLen + 1
)

func (o *Options) fillDefaults() {
	if o.SegmentBytes == 0 {
		o.SegmentBytes = defaultSegmentBytes
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = defaultSyncInterval
	}
	if o.PrepareAfter == 0 {
		o.PrepareAfter = o.SegmentBytes / 2
	}
	if o.GroupWait == 0 {
		o.GroupWait = time.Millisecond
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = defaultMaxBatchBytes
	}
	if o.Now == nil {
		o.Now = func() int64 { return time.Now().UnixNano() }
	}
	if o.NewTicker == nil {
		o.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

func (o *Options) validate() error {
	switch {
	case o.Dir == "":
		return fmt.Errorf("wal: Options.Dir is empty")
	case o.SegmentBytes < minSegmentBytes:
		return fmt.Errorf("wal: Options.SegmentBytes %d out of range [%d, %d]", o.SegmentBytes, minSegmentBytes, int64(math.MaxInt64))
	case o.Sync < SyncBatch || o.Sync > SyncNone:
		return fmt.Errorf("wal: Options.Sync %d out of range [%d, %d]", o.Sync, SyncBatch, SyncNone)
	case o.SyncInterval < 0:
		return fmt.Errorf("wal: Options.SyncInterval %v out of range (0, %v]", o.SyncInterval, time.Duration(math.MaxInt64))
	case o.MaxBatchBytes < 0:
		return fmt.Errorf("wal: Options.MaxBatchBytes %d out of range [1, %d]", o.MaxBatchBytes, math.MaxInt)
	}
	return nil
}

// Position is the place of a record: the segment's sequence number and the
// record's byte offset in the segment file. Positions order like the log.
type Position struct {
	Seq    uint64
	Offset int64
}

// Compare returns -1, 0 or +1 as p is before, at or after q.
func (p Position) Compare(q Position) int {
	if p.Seq != q.Seq {
		if p.Seq < q.Seq {
			return -1
		}
		return 1
	}
	switch {
	case p.Offset < q.Offset:
		return -1
	case p.Offset > q.Offset:
		return 1
	}
	return 0
}

func (p Position) String() string { return fmt.Sprintf("%s:%d", segmentName(p.Seq), p.Offset) }

// SegmentInfo describes one segment file.
type SegmentInfo struct {
	Seq     uint64
	Path    string
	Size    int64    // bytes of records written to the OS, header included; a pre-zeroed file is longer
	Created int64    // unix ns from the segment header (Options.Now at the cut); the time of Open if SkipCorrupt skipped the header
	Sealed  bool     // no more appends go to it; every segment but the newest is sealed
	First   Position // where the segment's first data record is (or goes)
}

// Stats are counters since Open. Every field only grows.
type Stats struct {
	Appends      int64 // data records written
	Batches      int64 // batches written, each with one write(2)
	Bytes        int64 // bytes of data records written, framing included
	Fsyncs       int64 // fsyncs of segment files and of the directory; not the preparer's of spare segments
	FsyncNanos   int64 // wall time spent in those fsyncs, ns
	Rotations    int64 // segments sealed and followed by a new one
	TornBytes    int64 // bytes cut from the tail of the last segment by Open
	SkippedBytes int64 // damaged bytes skipped by Open (Options.SkipCorrupt)
	PreparedCuts int64 // segments cut from a spare segment the preparer had zeroed in advance
	GroupWaits   int64 // batches the flusher held back for announced appends (Expect)
}

type counters struct {
	appends, batches, bytes, fsyncs, fsyncNanos, rotations, tornBytes, skippedBytes, preparedCuts, groupWaits atomic.Int64
}

// batch is one group-commit buffer. Two of them alternate: appends fill the
// pending one while the flusher writes the other.
type batch struct {
	buf    []byte  // framed records
	n      int     // records in buf
	sync   bool    // fsync after writing, whatever the policy (Sync)
	rotate bool    // cut a new segment after writing (Rotate)
	res    *result // shared by everyone waiting on this batch; nil until the first
}

func (b *batch) hasWork() bool { return len(b.buf) > 0 || b.sync || b.rotate }

// result is what the flusher tells the waiters of one batch. A new one is
// made per batch, so a waiter may read it after the batch buffer is reused.
type result struct {
	done   chan struct{} // closed when the fields below are set
	seq    uint64        // segment the batch went to
	base   int64         // offset of the batch's first byte in that segment
	err    error         // write or fsync error
	next   Position      // Rotate: first position of the new segment
	rotErr error         // Rotate: error cutting the new segment
}

// Log is an append-only write-ahead log of opaque payloads, kept as a
// directory of segment files. All methods are safe for concurrent use.
type Log struct {
	opts   Options
	logger *slog.Logger

	mu      sync.Mutex    // guards the fields up to segs
	work    sync.Cond     // on mu; signalled when pending gets work or closed is set
	pending *batch        // the batch appends go into
	spare   *batch        // the other buffer; nil while the flusher writes it
	room    chan struct{} // closed when the flusher takes pending; nil when nobody waits for room
	closed  bool
	err     error         // sticky write or fsync error; the log takes no more appends
	arrived chan struct{} // cap 1: an announced Append joined pending, or an announcement was withdrawn
	segs    []SegmentInfo // every segment, oldest first; the last one is active

	removeMu sync.Mutex // serializes RemoveBefore

	// Owned by the flusher goroutine (by Open before it starts, by Close after it ends).
	f    *os.File // active segment; batches go to offset size with pwrite(2)
	seq  uint64   // active segment's sequence number
	size int64    // active segment's logical size: the end of its last record, where the next batch goes
	end  int64    // active segment's file length; more than size while it ends in unused pre-zeroed bytes

	// The preparer goroutine keeps one spare segment ready for the next cut.
	// Only one spare exists at a time, so sends on these channels never block.
	prepared  chan *os.File // cap 1: the spare (spareName, zeroed and fsynced), taken by cut
	prepFree  chan struct{} // cap 1: cut is done with the spare it took, so spareName is free again
	prepRetry chan struct{} // cap 1: a cut found no spare; after a failure the preparer tries again
	prepWant  chan struct{} // cap 1: the active segment has reached PrepareAfter

	active   atomic.Pointer[os.File] // f, for the sync loop
	written  atomic.Int64            // bytes written since Open, for the sync loop
	expected atomic.Int64            // Appends announced by Expect and not yet made

	quit        chan struct{} // closed by Close to stop the sync loop and the preparer
	flusherDone chan struct{} // closed when the flusher has exited
	syncerDone  chan struct{} // closed when the sync loop has exited; nil without SyncInterval
	prepDone    chan struct{} // closed when the preparer has exited; nil without one (noSpare)
	closeErr    error         // the flusher's final flush, fsync and close; read after flusherDone

	stats counters
}

// Open opens the log in opts.Dir, creating the directory if needed. It reads
// and validates every segment. A torn tail of the last segment is truncated
// to the last intact record and logged; damage anywhere else is an error
// wrapping ErrCorrupt that names the file and offset, unless
// opts.SkipCorrupt. Zeros after the last record of the last segment are the
// unused part of a pre-zeroed segment, not damage, and are kept. Appends then
// continue the last segment, or a new one if there is none or the last is
// full. Open starts the goroutine that prepares spare segments.
func Open(opts Options) (*Log, error) {
	opts.fillDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	l := &Log{
		opts:        opts,
		logger:      opts.Logger,
		pending:     &batch{},
		spare:       &batch{},
		prepared:    make(chan *os.File, 1),
		prepFree:    make(chan struct{}, 1),
		prepRetry:   make(chan struct{}, 1),
		prepWant:    make(chan struct{}, 1),
		quit:        make(chan struct{}),
		arrived:     make(chan struct{}, 1),
		flusherDone: make(chan struct{}),
	}
	l.work.L = &l.mu
	if err := l.recover(); err != nil {
		if l.f != nil {
			l.f.Close()
		}
		return nil, err
	}
	l.active.Store(l.f)
	go l.flushLoop()
	if opts.Sync == SyncInterval {
		l.syncerDone = make(chan struct{})
		tick, stop := opts.NewTicker(opts.SyncInterval)
		go l.syncLoop(tick, stop)
	}
	if !opts.noSpare {
		l.prepDone = make(chan struct{})
		go l.prepareLoop()
	}
	return l, nil
}

// recover scans the segments, repairs the tail and opens the active segment.
func (l *Log) recover() error {
	dir := l.opts.Dir
	seqs, err := listSegments(dir, l.logger.Warn)
	if err != nil {
		return err
	}
	var buf []byte
	recut := false      // the last segment lost its header and must be cut again
	lastEnd := int64(0) // file length of the last segment after repair
	for i, seq := range seqs {
		last := i == len(seqs)-1
		path := filepath.Join(dir, segmentName(seq))
		if i > 0 && seq != seqs[i-1]+1 {
			if !l.opts.SkipCorrupt {
				return fmt.Errorf("%w: %s follows %s: segments missing", ErrCorrupt, path, l.segs[i-1].Path)
			}
			l.logger.Error("wal: segments missing", "file", path, "after", l.segs[i-1].Path)
		}
		if buf, err = readFile(path, -1, buf); err != nil {
			return err
		}
		s, err := scanSegment(buf, path, seq, last, l.opts.SkipCorrupt, 0, nil)
		if err != nil {
			return err
		}
		if s.skipped > 0 {
			l.stats.skippedBytes.Add(s.skipped)
			l.logger.Error("wal: skipped damaged bytes", "file", path, "bytes", s.skipped)
		}
		created := s.created
		if !s.header {
			// The header was skipped. A later time only delays retention.
			created = l.opts.Now()
		}
		l.segs = append(l.segs, SegmentInfo{
			Seq: seq, Path: path, Size: s.good, Created: created, Sealed: !last,
			First: Position{Seq: seq, Offset: s.first},
		})
		if !last {
			continue
		}
		// Zeros after the last record (s.prealloc) are the unused part of a
		// pre-zeroed segment: kept, so that appends go on overwriting them.
		cut := int64(len(buf)) - s.good - s.prealloc
		if cut > 0 {
			l.stats.tornBytes.Add(cut)
			level := slog.LevelWarn
			if s.tornNext {
				level = slog.LevelError // intact records follow the damage and are dropped with it
			}
			l.logger.Log(context.Background(), level, "wal: truncated torn tail", "file", path,
				"offset", s.good, "bytes", cut, "reason", s.torn, "intact_records_after", s.tornNext)
		}
		switch {
		case s.good == 0:
			recut = true // not even the header is complete
		case cut > 0:
			// Truncating (not zeroing) also drops any preallocated zeros
			// after the damage, so no stale byte can be read back later.
			if err := truncateFile(path, s.good); err != nil {
				return err
			}
			lastEnd = s.good
		default:
			lastEnd = int64(len(buf))
		}
	}

	if len(l.segs) == 0 || recut {
		seq := uint64(1)
		if recut {
			seq = l.segs[len(l.segs)-1].Seq
			l.segs = l.segs[:len(l.segs)-1]
		}
		info, f, end, err := l.cut(seq)
		if err != nil {
			return err
		}
		l.segs = append(l.segs, info)
		l.f, l.seq, l.size, l.end = f, seq, info.Size, end
	} else {
		last := l.segs[len(l.segs)-1]
		f, err := os.OpenFile(last.Path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		l.f, l.seq, l.size, l.end = f, last.Seq, last.Size, lastEnd
	}
	if l.size >= l.opts.SegmentBytes {
		if _, err := l.rotate(); err != nil {
			return err
		}
	}
	return nil
}

func truncateFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("wal: truncate torn tail: %w", err)
	}
	return nil
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

func (l *Log) fsync(f *os.File) error {
	start := time.Now()
	err := f.Sync()
	l.stats.fsyncs.Add(1)
	l.stats.fsyncNanos.Add(int64(time.Since(start)))
	return err
}

func (l *Log) syncDir() error {
	start := time.Now()
	err := syncDir(l.opts.Dir)
	l.stats.fsyncs.Add(1)
	l.stats.fsyncNanos.Add(int64(time.Since(start)))
	return err
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

// fail records the first write or fsync error; the log then refuses appends.
func (l *Log) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		l.logger.Error("wal: log failed; reopen to recover", "err", err)
	}
	l.mu.Unlock()
}

// Expect announces an Append the caller is about to make, so that a flusher
// holding a batch waits for it (at most Options.GroupWait) instead of paying
// one fsync for the batch and another for it. Follow every Expect with
// exactly one AppendExpected, or with Unexpect. Safe for concurrent use.
func (l *Log) Expect() { l.expected.Add(1) }

// Unexpect withdraws an announcement that no Append will follow.
func (l *Log) Unexpect() {
	l.expected.Add(-1)
	l.nudge()
}

// nudge wakes a flusher waiting for announced appends.
func (l *Log) nudge() {
	select {
	case l.arrived <- struct{}{}:
	default:
	}
}

// AppendExpected is Append for a caller that announced it with Expect: the
// announcement ends when the record joins the batch, or when it fails.
func (l *Log) AppendExpected(ctx context.Context, payload []byte) (Position, error) {
	return l.append(ctx, payload, true)
}

// Append adds payload to the log and returns its position once the batch
// holding it is written to the OS and, under SyncBatch, fsynced. Concurrent
// Appends are grouped into one write(2) (and one fsync) per batch. Append
// copies payload; the caller may reuse it as soon as Append returns.
//
// If ctx is done before the record is queued, Append returns ctx.Err() and
// nothing is written. If ctx is done while Append waits for its batch, Append
// returns an error wrapping ctx.Err(), and the record may still be written.
// Close writes every queued record first; an Append still waiting for room in
// a full batch when Close is called returns ErrClosed and is not written.
// After a write or fsync error every Append returns that error.
func (l *Log) Append(ctx context.Context, payload []byte) (Position, error) {
	return l.append(ctx, payload, false)
}

func (l *Log) append(ctx context.Context, payload []byte, expected bool) (Position, error) {
	joined := false
	if expected {
		defer func() {
			if !joined { // failed before joining a batch
				l.Unexpect()
			}
		}()
	}
	if len(payload) > MaxPayload {
		return Position{}, fmt.Errorf("%w: %d bytes, maximum %d", ErrTooLarge, len(payload), MaxPayload)
	}
	if err := ctx.Err(); err != nil {
		return Position{}, err
	}
	need := recordHeaderLen + len(payload)
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return Position{}, ErrClosed
		}
		if l.err != nil {
			err := l.err
			l.mu.Unlock()
			return Position{}, err
		}
		b := l.pending
		if b.n == 0 || len(b.buf)+need <= l.opts.MaxBatchBytes {
			break
		}
		// The batch is full: wait until the flusher takes it.
		if l.room == nil {
			l.room = make(chan struct{})
		}
		room := l.room
		l.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return Position{}, ctx.Err()
		}
		l.mu.Lock()
	}
	b := l.pending
	if !b.hasWork() {
		l.work.Signal()
	}
	rel := int64(len(b.buf))
	b.buf = appendRecord(b.buf, recData, payload)
	b.n++
	if expected {
		joined = true
		l.expected.Add(-1)
		l.nudge()
	}
	res := b.result()
	l.mu.Unlock()

	select {
	case <-res.done:
	case <-ctx.Done():
		return Position{}, fmt.Errorf("wal: append: %w (the record may still be written)", ctx.Err())
	}
	if res.err != nil {
		return Position{}, res.err
	}
	return Position{Seq: res.seq, Offset: res.base + rel}, nil
}

// result returns the batch's result, making it on first use. Called with mu held.
func (b *batch) result() *result {
	if b.res == nil {
		b.res = &result{done: make(chan struct{})}
	}
	return b.res
}

// Sync writes every record queued before the call and fsyncs the active
// segment, whatever the policy.
func (l *Log) Sync() error {
	res, err := l.request(func(b *batch) { b.sync = true })
	if err != nil {
		return err
	}
	<-res.done
	return res.err
}

// Rotate writes every record queued before the call, seals the active segment
// (fsync) and starts a new one. It returns the position of the new segment's
// first record: every record whose Append returned before Rotate was called is
// before it, and every record appended after Rotate returns is at or after it.
// Concurrent Rotates may share one new segment.
func (l *Log) Rotate() (Position, error) {
	res, err := l.request(func(b *batch) { b.rotate = true })
	if err != nil {
		return Position{}, err
	}
	<-res.done
	if res.err != nil {
		return Position{}, res.err
	}
	return res.next, res.rotErr
}

// request marks the pending batch with a flusher action and returns its result.
func (l *Log) request(mark func(b *batch)) (*result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if l.err != nil {
		return nil, l.err
	}
	mark(l.pending)
	l.work.Signal()
	return l.pending.result(), nil
}

// flushLoop is the one goroutine that writes to the active segment. It takes
// the whole pending batch, writes it with one write(2), fsyncs it if the
// policy or a Sync asks, wakes its waiters and goes on with the next batch,
// which filled up meanwhile. Close stops it and waits for it.
func (l *Log) flushLoop() {
	defer close(l.flusherDone)
	var timer *time.Timer
	l.mu.Lock()
	for {
		for !l.closed && !l.pending.hasWork() {
			l.work.Wait()
		}
		// Group commit: when other callers have announced Appends, gather
		// for GroupWait before writing, so that one write and one fsync
		// serve them all (PostgreSQL's commit_delay with commit_siblings).
		// A lone caller never waits.
		if wait := l.opts.GroupWait; wait > 0 && l.expected.Load() > 0 && !l.closed {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			waiting := true
			for waiting && !l.closed && len(l.pending.buf) < l.opts.MaxBatchBytes {
				l.mu.Unlock()
				select {
				case <-l.arrived:
				case <-timer.C:
					waiting = false
				}
				l.mu.Lock()
			}
			if waiting && !timer.Stop() {
				<-timer.C
			}
			l.stats.groupWaits.Add(1)
		}
		b := l.pending
		if l.spare == nil {
			panic("BUG: wal: flusher found no spare batch")
		}
		l.pending, l.spare = l.spare, nil
		if l.room != nil {
			close(l.room)
			l.room = nil
		}
		closing, sticky := l.closed, l.err
		l.mu.Unlock()

		if l.opts.testHookFlush != nil {
			l.opts.testHookFlush()
		}
		l.flush(b, closing, sticky)

		b.n, b.sync, b.rotate, b.res = 0, false, false, nil
		if cap(b.buf) > 2*l.opts.MaxBatchBytes {
			b.buf = nil // after a huge record; do not keep the memory
		}
		b.buf = b.buf[:0]
		l.mu.Lock()
		l.spare = b
		if closing {
			l.mu.Unlock()
			return
		}
	}
}

// flush writes one batch and tells its waiters. Flusher only.
func (l *Log) flush(b *batch, closing bool, sticky error) {
	seq, base := l.seq, l.size
	err := sticky
	if err == nil && len(b.buf) > 0 {
		// pwrite at the logical end: over the zeros of a pre-zeroed segment,
		// or past the end of the file.
		if _, werr := l.f.WriteAt(b.buf, l.size); werr != nil {
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
	if err == nil && (b.sync || closing || (l.opts.Sync == SyncBatch && len(b.buf) > 0)) {
		if serr := l.fsync(l.f); serr != nil {
			err = fmt.Errorf("wal: fsync %s: %w", segmentName(l.seq), serr)
		}
	}
	if err != nil && sticky == nil {
		l.fail(err)
	}

	res := b.res
	if res != nil {
		res.seq, res.base, res.err = seq, base, err
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

// syncLoop fsyncs the active segment on every tick when anything was written
// since the last fsync. Close stops it and waits for it.
func (l *Log) syncLoop(tick <-chan time.Time, stop func()) {
	defer close(l.syncerDone)
	defer stop()
	var synced int64
	for {
		select {
		case <-l.quit:
			return
		case <-tick:
		}
		// Load written before the file: writes counted in w went to f, or to
		// a segment that rotation fsynced before closing it.
		w := l.written.Load()
		if w == synced {
			continue
		}
		f := l.active.Load()
		if err := l.fsync(f); err != nil {
			if errors.Is(err, os.ErrClosed) {
				synced = w // rotated or closed meanwhile; both fsync first
				continue
			}
			l.fail(fmt.Errorf("wal: fsync %s: %w", filepath.Base(f.Name()), err))
			return
		}
		synced = w
	}
}

// prepareLoop keeps one spare segment ready for the flusher's next cut: it
// writes Options.SegmentBytes of zeros to spareName, fsyncs the file and puts
// it in l.prepared, then waits until cut has renamed (or removed) it before
// making the next one under the same name. After a failure it logs and waits
// for the next cut (prepRetry) to try again. It never takes l.mu. Close stops
// it and waits for it; a spare no cut took is removed.
func (l *Log) prepareLoop() {
	defer close(l.prepDone)
	for {
		if l.opts.PrepareAfter >= 0 {
			select { // until the active segment is full enough to need a successor
			case <-l.prepWant:
			case <-l.quit:
				return
			}
		}
		if l.opts.testHookPrepare != nil {
			l.opts.testHookPrepare()
		}
		f, err := l.prepareSpare()
		wait := l.prepFree
		switch {
		case errors.Is(err, errStopped):
			return
		case err != nil:
			l.logger.Warn("wal: preparing a spare segment failed; cuts make plain files until the next try", "err", err)
			wait = l.prepRetry
		default:
			select {
			case l.prepared <- f:
			default:
				panic("BUG: wal: a spare segment is already prepared")
			}
			if l.opts.testHookPrepared != nil {
				l.opts.testHookPrepared()
			}
		}
		select {
		case <-wait:
			select { // a signal from the segment the spare replaced
			case <-l.prepWant:
			default:
			}
		case <-l.quit:
			select {
			case f := <-l.prepared: // no cut took it
				f.Close()
				os.Remove(f.Name())
			default:
			}
			return
		}
	}
}

// errStopped tells prepareLoop that Close interrupted a preparation.
var errStopped = errors.New("wal: stopped")

// prepareSpare creates spareName, fills it with Options.SegmentBytes of zeros
// and fsyncs it, so that records written into it later change neither the
// file's size nor its extents and their fsyncs have less metadata to
// journal. On error, or errStopped when Close interrupts it, it removes the
// file.
func (l *Log) prepareSpare() (*os.File, error) {
	path := filepath.Join(l.opts.Dir, spareName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	if err := l.zeroFill(f); err != nil {
		f.Close()
		os.Remove(path)
		if errors.Is(err, errStopped) {
			return nil, err
		}
		return nil, fmt.Errorf("wal: prepare %s: %w", path, err)
	}
	return f, nil
}

// zeroFill writes Options.SegmentBytes of zeros to f, 1 MiB per write(2), and
// fsyncs it. It returns errStopped as soon as Close was called.
func (l *Log) zeroFill(f *os.File) error {
	for off := int64(0); off < l.opts.SegmentBytes; {
		select {
		case <-l.quit:
			return errStopped
		default:
		}
		n := min(l.opts.SegmentBytes-off, int64(len(zeroBlock)))
		if _, err := f.Write(zeroBlock[:n]); err != nil {
			return err
		}
		// Sync each block: on ext4 (data=ordered) the journal commit of an
		// Append's fsync writes out every dirty page of the filesystem, and a
		// spare's 64 MiB of unsynced zeros stalled appends for seconds.
		if err := f.Sync(); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// Close writes and fsyncs every queued record, stops the flusher, the sync
// loop and the preparer, waits for them, closes the active segment and
// removes an unused spare segment. It returns the first error of that final
// flush, or the log's earlier write or fsync error. Calls after the first
// return ErrClosed.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.closed = true
	l.work.Signal()
	l.mu.Unlock()

	close(l.quit)
	if l.syncerDone != nil {
		<-l.syncerDone
	}
	<-l.flusherDone
	if l.prepDone != nil {
		<-l.prepDone
	}
	return l.closeErr
}

// Segments returns the segments, oldest first; the last one is active.
//
// Retention: every record of a segment was appended before the next segment
// was created, so it is older than the next segment's Created time (same
// clock, Options.Now). A node whose longest window is W may therefore delete
// segment i once now-W >= Segments()[i+1].Created, with RemoveBefore of the
// first segment it keeps.
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.segs)
}

// RemoveBefore deletes the sealed segments with Seq < seq, oldest first, and
// fsyncs the directory. It never deletes the active segment. It returns how
// many files it deleted; on error the segments before the failed one are gone.
func (l *Log) RemoveBefore(seq uint64) (removed int, err error) {
	l.removeMu.Lock()
	defer l.removeMu.Unlock()
	l.mu.Lock()
	var doomed []SegmentInfo
	for _, s := range l.segs {
		if s.Seq >= seq || !s.Sealed {
			break
		}
		doomed = append(doomed, s)
	}
	l.mu.Unlock()

	for _, s := range doomed {
		if err = os.Remove(s.Path); err != nil {
			err = fmt.Errorf("wal: %w", err)
			break
		}
		removed++
	}
	if removed > 0 {
		// Only RemoveBefore drops segments, so the first `removed` are still doomed[:removed].
		l.mu.Lock()
		l.segs = slices.Delete(l.segs, 0, removed)
		l.mu.Unlock()
		if serr := l.syncDir(); serr != nil && err == nil {
			err = fmt.Errorf("wal: sync dir after removing segments: %w", serr)
		}
	}
	return removed, err
}

// Replay calls fn for every data record at or after from, in log order; the
// zero Position means from the start. payload is valid only during fn. If fn
// returns an error, Replay stops and returns it.
//
// Replay reads the segment files. It is meant for recovery, between Open and
// the first Append, but it is safe at any time, also after Close: it sees the
// records written before it started and none appended later. A segment removed
// by a concurrent RemoveBefore makes it fail with an error wrapping
// fs.ErrNotExist.
func (l *Log) Replay(from Position, fn func(pos Position, payload []byte) error) error {
	l.mu.Lock()
	segs := slices.Clone(l.segs)
	l.mu.Unlock()
	var buf []byte
	for _, s := range segs {
		if s.Seq < from.Seq {
			continue
		}
		var err error
		if buf, err = readFile(s.Path, s.Size, buf); err != nil {
			return err
		}
		start := int64(0)
		if s.Seq == from.Seq {
			start = from.Offset
		}
		seq := s.Seq
		_, err = scanSegment(buf, s.Path, seq, false, l.opts.SkipCorrupt, start, func(off int64, p []byte) error {
			return fn(Position{Seq: seq, Offset: off}, p)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Stats returns the counters.
func (l *Log) Stats() Stats {
	c := &l.stats
	return Stats{
		Appends:      c.appends.Load(),
		Batches:      c.batches.Load(),
		Bytes:        c.bytes.Load(),
		Fsyncs:       c.fsyncs.Load(),
		FsyncNanos:   c.fsyncNanos.Load(),
		Rotations:    c.rotations.Load(),
		TornBytes:    c.tornBytes.Load(),
		SkippedBytes: c.skippedBytes.Load(),
		PreparedCuts: c.preparedCuts.Load(),
		GroupWaits:   c.groupWaits.Load(),
	}
}
