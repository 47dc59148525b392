package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// recover scans the segments, repairs the tail and opens the active segment.
// It runs inside Open, before the Log is shared, so it takes no lock.
func (l *Log) recover() error {
	t, err := l.scanSegments()
	if err != nil {
		return err
	}
	if err := l.openActive(t); err != nil {
		return err
	}
	// A last segment with skipped damage is sealed at once, so that nothing
	// more is appended after the damage and retention removes it in time.
	if l.size >= l.opts.SegmentBytes || (t.skipped && !t.recut) {
		if _, err := l.rotate(); err != nil {
			return err
		}
	}
	return nil
}

// recoveredTail is what recover learned about the last segment.
type recoveredTail struct {
	recut   bool  // the last segment lost its header and must be cut again
	end     int64 // file length of the last segment after repair, in bytes
	skipped bool  // SkipCorrupt skipped damage in the last segment
}

// scanSegments reads and checks every segment of the directory in log
// order, appends each to l.segs and repairs the torn tail of the last one.
// A gap in the sequence numbers is ErrCorrupt, or logged with SkipCorrupt.
func (l *Log) scanSegments() (recoveredTail, error) {
	dir := l.opts.Dir
	seqs, err := listSegments(dir, l.logger.Warn)
	if err != nil {
		return recoveredTail{}, err
	}
	var t recoveredTail
	var buf []byte
	for i, seq := range seqs {
		last := i == len(seqs)-1
		path := filepath.Join(dir, segmentName(seq))
		if i > 0 && seq != seqs[i-1]+1 {
			if !l.opts.SkipCorrupt {
				return recoveredTail{}, fmt.Errorf("%w: %s follows %s: segments missing", ErrCorrupt, path, l.segs[i-1].Path)
			}
			l.logger.Error("wal: segments missing", "file", path, "after", l.segs[i-1].Path)
		}
		if buf, err = readFile(path, -1, buf); err != nil {
			return recoveredTail{}, err
		}
		s, err := l.addSegment(buf, path, seq, last)
		if err != nil {
			return recoveredTail{}, err
		}
		if last {
			t.skipped = s.skipped > 0
			if t.end, t.recut, err = l.repairTail(path, int64(len(buf)), &s); err != nil {
				return recoveredTail{}, err
			}
		}
	}
	return t, nil
}

// addSegment scans buf, the image of segment seq read from path, logs and
// counts the damaged bytes it skipped (SkipCorrupt only), and appends the
// segment to l.segs, sealed unless it is the last.
func (l *Log) addSegment(buf []byte, path string, seq uint64, last bool) (scan, error) {
	s, err := scanSegment(buf, path, seq, last, l.opts.SkipCorrupt, 0, nil)
	if err != nil {
		return scan{}, err
	}
	if s.skipped > 0 {
		l.stats.skippedBytes.Add(s.skipped)
		for _, k := range s.skips {
			l.logger.Error("wal: skipped damaged bytes", "file", path, "offset", k.off, "bytes", k.n, "reason", k.reason)
		}
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
	return s, nil
}

// repairTail applies the torn-tail rule to the last segment, at path, of
// size bytes, whose scan is s: it truncates the file after its last intact
// record, counting and logging the bytes cut. It returns the file's length
// after repair, or recut true when not even the header is intact.
func (l *Log) repairTail(path string, size int64, s *scan) (end int64, recut bool, err error) {
	// Zeros after the last record (s.prealloc) are the unused part of a
	// pre-zeroed segment: kept, so that appends go on overwriting them.
	cut := size - s.good - s.prealloc
	if cut > 0 {
		// No intact record follows: what is cut was never acknowledged.
		l.stats.tornBytes.Add(cut)
		l.logger.Warn("wal: truncated torn tail", "file", path, "offset", s.good, "bytes", cut, "reason", s.torn)
	}
	switch {
	case s.good == 0:
		return 0, true, nil // not even the header is complete
	case cut > 0:
		// Truncating (not zeroing) also drops any preallocated zeros
		// after the damage, so no stale byte can be read back later.
		if err := truncateFile(path, s.good); err != nil {
			return 0, false, err
		}
		return s.good, false, nil
	}
	return size, false, nil
}

// openActive opens the last segment for appending at t.end, or cuts a new
// one: the first of an empty log, or in place of a last segment whose
// header was lost (t.recut).
func (l *Log) openActive(t recoveredTail) error {
	if len(l.segs) == 0 || t.recut {
		seq := uint64(1)
		if t.recut {
			seq = l.segs[len(l.segs)-1].Seq
			l.segs = l.segs[:len(l.segs)-1]
		}
		info, f, end, err := l.cut(seq)
		if err != nil {
			return err
		}
		l.segs = append(l.segs, info)
		l.f, l.seq, l.size, l.end = f, seq, info.Size, end
		l.good = l.size
		return nil
	}
	last := l.segs[len(l.segs)-1]
	f, err := os.OpenFile(last.Path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	l.f, l.seq, l.size, l.end = f, last.Seq, last.Size, t.end
	l.good = l.size
	return nil
}

// truncateFile cuts the file at path to size bytes and fsyncs it.
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
