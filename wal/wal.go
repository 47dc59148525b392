package wal

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// SyncBatch fsyncs every group-commit batch before its Appends return.
	// It is the zero value and the default.
	SyncBatch SyncPolicy = iota
	// SyncInterval returns from Append after write(2); a background loop
	// fsyncs every Options.SyncInterval when anything was written. Under
	// SyncBatch, an append that is not durable (AppendCommit) is treated so.
	SyncInterval
	// SyncNone never fsyncs appended records, except on Sync, Rotate
	// (the sealed segment) and Close.
	SyncNone
)

// SyncPolicy decides when appended records are fsynced. See the package
// documentation for what each policy can lose.
type SyncPolicy int

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
	SyncInterval  time.Duration // fsync period under SyncInterval, and of appends that are not durable under SyncBatch; 0 means 10ms
	MaxBatchBytes int           // Appends wait while the pending batch holds this much; 0 means 4 MiB
	// PrepareAfter is how full the active segment gets, in bytes, before a
	// background preparer zeroes the next segment, so that an idle or newly
	// started log spends neither disk nor I/O on a spare. 0 means half of
	// SegmentBytes; negative means at once.
	PrepareAfter int64
	// GroupWait is how long the flusher, holding a batch it will fsync
	// while other callers have announced Appends (Expect), gathers more
	// before it writes and fsyncs the batch; a full batch ends it early. 0
	// means 1ms, negative never waits. With no announcement pending, or a
	// batch it will only write, it never waits.
	GroupWait time.Duration
	// PlainFsync makes segment fsyncs call fsync(2) on the calling
	// goroutine. Otherwise, where the kernel allows io_uring (Linux 5.4 or
	// later, and not refused by a seccomp profile), the kernel runs each
	// fsync on a worker thread and the caller waits in Go's netpoller,
	// holding no scheduler slot (P): under SyncBatch on a busy node a
	// blocking fsync(2) leaves a core idle for much of every fsync. Either
	// way the data is as durable.
	PlainFsync bool
	// SkipCorrupt is an operator override: Open skips damaged bytes up to the
	// next intact record instead of refusing to open, keeps what follows,
	// logs each skip and counts them in Stats.SkippedBytes.
	SkipCorrupt bool
	Now         func() int64 // unix ns, written as segment creation times; nil means time.Now().UnixNano
	// NewTicker starts the SyncInterval loop's ticker and returns its channel
	// and stop function; nil means time.NewTicker. Tests inject their own.
	NewTicker func(d time.Duration) (<-chan time.Time, func())
	Logger    *slog.Logger // nil means discard
	// OnFsync, if set, is called after every fsync counted in
	// Stats.Fsyncs, with its wall time, from the goroutine that did it
	// (the flusher, the sync loop, a rotation): it must be quick and safe
	// for concurrent use. nil means none. A node passes its metrics
	// observer's hook here; the package stays free of metrics libraries.
	OnFsync func(d time.Duration)

	testHookFlush func() // called by the flusher after it takes a batch; tests only
	// testHookWriteAt, if set, writes a batch in place of the active
	// segment's WriteAt: tests fail writes (a full disk) with it.
	testHookWriteAt  func(f *os.File, b []byte, off int64) (int, error)
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
	Failures     int64 // times a write or fsync error failed the log (see Recover)
	Recoveries   int64 // times Recover brought a failed log back
}

type counters struct {
	appends, batches, bytes, fsyncs, fsyncNanos, rotations, tornBytes, skippedBytes, preparedCuts, groupWaits atomic.Int64
	failures, recoveries                                                                                      atomic.Int64
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
	err     error         // sticky write or fsync error; the log takes no more appends until Recover clears it
	arrived chan struct{} // cap 1: an announced Append joined pending, or an announcement was withdrawn
	segs    []SegmentInfo // every segment, oldest first; the last one is active

	removeMu sync.Mutex // serializes RemoveBefore

	// Owned by the flusher goroutine (by Open before it starts, by Close after it ends).
	f    *os.File // active segment; batches go to offset size with pwrite(2)
	seq  uint64   // active segment's sequence number
	size int64    // active segment's logical size: the end of its last record, where the next batch goes
	end  int64    // active segment's file length; more than size while it ends in unused pre-zeroed bytes
	// good is the end of the last batch of the active segment whose
	// Appends were told it succeeded: Recover truncates the segment to it,
	// dropping what a failed write or fsync left after it.
	good int64

	// The preparer goroutine keeps one spare segment ready for the next cut.
	// Only one spare exists at a time, so sends on these channels never block.
	prepared  chan *os.File // cap 1: the spare (spareName, zeroed and fsynced), taken by cut
	prepFree  chan struct{} // cap 1: cut is done with the spare it took, so spareName is free again
	prepRetry chan struct{} // cap 1: a cut found no spare; after a failure the preparer tries again
	prepWant  chan struct{} // cap 1: the active segment has reached PrepareAfter

	failed   atomic.Bool             // err is set
	active   atomic.Pointer[os.File] // f, for the sync loop
	written  atomic.Int64            // bytes written since Open, for the sync loop
	synced   atomic.Int64            // of them, bytes known fsynced (or sealed by a rotation)
	expected atomic.Int64            // Appends announced by Expect and not yet made

	quit        chan struct{} // closed by Close to stop the sync loop and the preparer
	flusherDone chan struct{} // closed when the flusher has exited
	syncerDone  chan struct{} // closed when the sync loop has exited; nil without one (SyncNone)
	unsynced    chan struct{} // cap 1: the flusher wrote a batch it did not fsync, for an idle sync loop
	prepDone    chan struct{} // closed when the preparer has exited; nil without one (noSpare)
	closeErr    error         // the flusher's final flush, fsync and close; read after flusherDone

	stats  counters
	ur     *uring    // fsyncs of segment files; nil: fsync(2)
	urOnce sync.Once // logs that ur broke
}

// Open opens the log in opts.Dir, creating the directory if needed. It reads
// and validates every segment. A torn tail of the last segment (damage with
// no intact record after it) is truncated to the last intact record and
// logged; any other damage is an error wrapping ErrCorrupt that names the
// file and offset, unless opts.SkipCorrupt. Zeros after the last record of the last segment are the
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
	if !opts.PlainFsync {
		if ur, err := newURing(); err == nil {
			l.ur = ur
		} else {
			l.logger.Info("wal: no io_uring: fsync(2) holds a scheduler slot (P) while it waits", "err", err)
		}
	}
	if err := l.recover(); err != nil {
		if l.f != nil {
			l.f.Close()
		}
		if l.ur != nil {
			l.ur.close()
		}
		return nil, err
	}
	l.active.Store(l.f)
	go l.flushLoop()
	if opts.Sync != SyncNone { // SyncBatch: for appends that are not durable
		l.syncerDone = make(chan struct{})
		l.unsynced = make(chan struct{}, 1)
		every := opts.SyncInterval
		if opts.Sync == SyncBatch {
			every /= 2 // see syncLoop
		}
		tick, stop := opts.NewTicker(every)
		go l.syncLoop(every, tick, stop)
	}
	if !opts.noSpare {
		l.prepDone = make(chan struct{})
		go l.prepareLoop()
	}
	return l, nil
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
	if l.ur != nil {
		l.ur.close()
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
		Failures:     c.failures.Load(),
		Recoveries:   c.recoveries.Load(),
	}
}

// Failed reports whether a write or fsync error failed the log: Appends,
// Sync and Rotate then fail with Err until Recover succeeds. It takes no
// lock.
func (l *Log) Failed() bool { return l.failed.Load() }

// Err returns the error that failed the log, nil while it takes appends.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Recover brings a failed log back once the cause of its failure has
// cleared (space freed, a device back): it truncates the active segment to
// the end of the last batch whose Appends were told they succeeded, so that
// nothing they were told failed stays in the log, fsyncs and seals it, and
// cuts a new segment; then the log takes appends again. If any step fails,
// the log stays failed and Recover returns why: call it again later. On a
// log that has not failed it does nothing and returns nil. Safe for
// concurrent use.
func (l *Log) Recover() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.err == nil {
		l.mu.Unlock()
		return nil
	}
	b := l.pending
	if !b.hasWork() {
		l.work.Signal()
	}
	b.recover = true
	res := b.result()
	l.mu.Unlock()
	<-res.done
	return res.err
}
