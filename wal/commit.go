package wal

import (
	"context"
	"fmt"
	"time"
)

// batch is one group-commit buffer. Two of them alternate: appends fill the
// pending one while the flusher writes the other.
type batch struct {
	buf     []byte  // framed records
	n       int     // records in buf
	sync    bool    // fsync after writing, whatever the policy (Sync)
	durable bool    // an append waits for an fsync (under SyncBatch)
	rotate  bool    // cut a new segment after writing (Rotate)
	recover bool    // bring a failed log back before writing (Recover)
	res     *result // shared by everyone waiting on this batch; nil until the first
}

func (b *batch) hasWork() bool { return len(b.buf) > 0 || b.sync || b.rotate || b.recover }

// result is what the flusher tells the waiters of one batch. A new one is
// made per batch, so a waiter may read it after the batch buffer is reused.
type result struct {
	done   chan struct{} // closed when the fields below are set
	seq    uint64        // segment the batch went to
	base   int64         // offset of the batch's first byte in that segment
	err    error         // write or fsync error
	next   Position      // Rotate: first position of the new segment
	rotErr error         // Rotate: error cutting the new segment

	// When the flusher took the batch, finished its write, and finished
	// its fsync (zero when it made none).
	taken, wrote, synced time.Time
}

// result returns the batch's result, making it on first use. Called with mu held.
func (b *batch) result() *result {
	if b.res == nil {
		b.res = &result{done: make(chan struct{})}
	}
	return b.res
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

// AppendExpected is AppendCommit for a caller that announced it with
// Expect: the announcement ends when the record joins the batch, or when it
// fails.
func (l *Log) AppendExpected(ctx context.Context, payload []byte, durable bool) (Commit, error) {
	return l.append(ctx, payload, true, durable)
}

// AppendCommit is Append, and tells how long each step of the wait took.
// Under SyncBatch, a durable append returns once its batch is fsynced, as
// Append does; one that is not returns once the batch is written to the
// OS, and the sync loop fsyncs it within Options.SyncInterval (as under
// SyncInterval). Under the other policies durable changes nothing.
func (l *Log) AppendCommit(ctx context.Context, payload []byte, durable bool) (Commit, error) {
	return l.append(ctx, payload, false, durable)
}

// Commit is where an appended record went, and what its Append waited
// for: each duration is the wall time of one step of its group commit.
type Commit struct {
	Position
	// Queued is from the call until the flusher took the record's batch:
	// waiting for room in a full batch, the group-commit wait, and the
	// flush of the batch before.
	Queued time.Duration
	// Write is the batch's write(2).
	Write time.Duration
	// Fsync is the batch's fsync; 0 when the batch was not fsynced (the
	// policy is not SyncBatch, or no append of the batch was durable).
	Fsync time.Duration
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
	c, err := l.append(ctx, payload, false, true)
	return c.Position, err
}

func (l *Log) append(ctx context.Context, payload []byte, expected, durable bool) (Commit, error) {
	joined := false
	if expected {
		defer func() {
			if !joined { // failed before joining a batch
				l.Unexpect()
			}
		}()
	}
	if len(payload) > MaxPayload {
		return Commit{}, fmt.Errorf("%w: %d bytes, maximum %d", ErrTooLarge, len(payload), MaxPayload)
	}
	if err := ctx.Err(); err != nil {
		return Commit{}, err
	}
	need := recordHeaderLen + len(payload)
	arrived := time.Now()
	l.mu.Lock()
	for {
		if l.closed {
			l.mu.Unlock()
			return Commit{}, ErrClosed
		}
		if l.err != nil {
			err := l.err
			l.mu.Unlock()
			return Commit{}, err
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
			return Commit{}, ctx.Err()
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
	b.durable = b.durable || durable
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
		return Commit{}, fmt.Errorf("wal: append: %w (the record may still be written)", ctx.Err())
	}
	if res.err != nil {
		return Commit{}, res.err
	}
	c := Commit{Position: Position{Seq: res.seq, Offset: res.base + rel}, Queued: max(0, res.taken.Sub(arrived)), Write: res.wrote.Sub(res.taken)}
	if !res.synced.IsZero() {
		c.Fsync = res.synced.Sub(res.wrote)
	}
	return c, nil
}

// fsyncs reports whether flushing b fsyncs it: a Sync, or a durable append
// under SyncBatch. Called with mu held, or by the flusher on the batch it
// took.
func (l *Log) fsyncs(b *batch) bool {
	return b.sync || (l.opts.Sync == SyncBatch && b.durable)
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
		// A lone caller never waits, nor does a batch that will not be
		// fsynced: a write alone costs less than the wait.
		if wait := l.opts.GroupWait; wait > 0 && l.expected.Load() > 0 && !l.closed && l.fsyncs(l.pending) {
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

		b.n, b.sync, b.durable, b.rotate, b.recover, b.res = 0, false, false, false, false, nil
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
