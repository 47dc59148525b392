package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// recover scans the segments, repairs the tail and opens the active segment.
func (l *Log) recover() error {
	dir := l.opts.Dir
	seqs, err := listSegments(dir, l.logger.Warn)
	if err != nil {
		return err
	}
	var buf []byte
	recut := false       // the last segment lost its header and must be cut again
	lastEnd := int64(0)  // file length of the last segment after repair
	skippedLast := false // SkipCorrupt skipped damage in the last segment
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
			for _, k := range s.skips {
				l.logger.Error("wal: skipped damaged bytes", "file", path, "offset", k.off, "bytes", k.n, "reason", k.reason)
			}
			if last {
				skippedLast = true
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
		if !last {
			continue
		}
		// Zeros after the last record (s.prealloc) are the unused part of a
		// pre-zeroed segment: kept, so that appends go on overwriting them.
		cut := int64(len(buf)) - s.good - s.prealloc
		if cut > 0 {
			// No intact record follows: what is cut was never acknowledged.
			l.stats.tornBytes.Add(cut)
			l.logger.Warn("wal: truncated torn tail", "file", path, "offset", s.good, "bytes", cut, "reason", s.torn)
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
		l.good = l.size
	} else {
		last := l.segs[len(l.segs)-1]
		f, err := os.OpenFile(last.Path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		l.f, l.seq, l.size, l.end = f, last.Seq, last.Size, lastEnd
		l.good = l.size
	}
	// A last segment with skipped damage is sealed at once, so that nothing
	// more is appended after the damage and retention removes it in time.
	if l.size >= l.opts.SegmentBytes || (skippedLast && !recut) {
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
