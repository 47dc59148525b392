package wal

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const (
	segExt = ".wal"
	tmpExt = ".tmp"

	// spareName is the spare segment the preparer zeroes in advance; a cut
	// renames it to the new segment's name. Open removes a leftover one.
	spareName = "spare" + segExt + tmpExt
)

// zeroBlock is read-only: the zeros the preparer writes, and what tails are
// compared with. It lives in BSS, so untouched it costs no memory.
var zeroBlock [1 << 20]byte

// segmentName returns the file name of segment seq: 16 hex digits and ".wal",
// so that name order is log order.
func segmentName(seq uint64) string {
	return fmt.Sprintf("%016x%s", seq, segExt)
}

// parseSegmentName returns the sequence number of a segment file name.
func parseSegmentName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, segExt)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	seq, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || seq == 0 || segmentName(seq) != name { // reject upper case
		return 0, false
	}
	return seq, true
}

// listSegments returns the sequence numbers of the segments in dir, in order,
// and removes the temporary files of segment cuts that a crash interrupted
// and a leftover spare segment.
func listSegments(dir string, logf func(msg string, args ...any)) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	var seqs []uint64
	for _, e := range entries {
		name := e.Name()
		if name == spareName {
			p := filepath.Join(dir, name)
			if err := os.Remove(p); err != nil {
				return nil, fmt.Errorf("wal: remove spare segment: %w", err)
			}
			logf("wal: removed unused spare segment", "file", p)
			continue
		}
		if base, ok := strings.CutSuffix(name, tmpExt); ok {
			if _, ok := parseSegmentName(base); ok {
				p := filepath.Join(dir, name)
				if err := os.Remove(p); err != nil {
					return nil, fmt.Errorf("wal: remove unfinished segment: %w", err)
				}
				logf("wal: removed unfinished segment", "file", p)
			}
			continue
		}
		if seq, ok := parseSegmentName(name); ok && e.Type().IsRegular() {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// scan is what scanSegment learned about one segment image.
type scan struct {
	header   bool   // the header record is intact
	created  int64  // from the header
	first    int64  // offset just after the header record
	good     int64  // end of the last intact record
	records  int    // data records
	skipped  int64  // damaged bytes skipped (skipCorrupt only)
	skips    []skip // where, with skipCorrupt; for Open's log
	torn     string // why the tail at good is torn; "" if the image ends cleanly
	prealloc int64  // last segment: zeros after good, the unused part of a pre-zeroed segment
}

// skip is one damaged range that scanSegment skipped.
type skip struct {
	off, n int64
	reason string
}

// scanSegment walks the records of the segment image b, read from path, and
// calls fn (when not nil) for every data record at an offset >= from.
//
// In the last segment (last == true) a framing error (ErrTornTail, or
// ErrCorrupt from a bad size or checksum) with no intact data record after
// it ends the log: scanSegment stops and reports the torn point in scan.good
// and scan.torn, unless only zeros follow the header and the records before
// it: then the image ends cleanly at good, and scan.prealloc counts the zeros
// (a pre-zeroed segment's unused part). A whole image of zeros has no header
// and is torn. A framing error with an intact data record after it is
// corruption, in the last segment as in every other. Everywhere else, and for
// records whose framing is intact but whose meaning is wrong (an unknown type,
// a header where data belongs), it returns an error wrapping ErrCorrupt that
// names the file and offset, or, with skipCorrupt, skips forward to the next
// intact data record and counts the skipped bytes. A header with an unknown
// format version or a different sequence number is an error in every mode.
func scanSegment(b []byte, path string, seq uint64, last, skipCorrupt bool, from int64,
	fn func(off int64, p []byte) error) (scan, error) {
	var s scan
	off := 0
	// Every record has a non-zero type byte, so none starts at or after nz.
	nz := len(b) - zeroSuffix(b)
	// bad handles a record that cannot be used at off: it returns the offset
	// at which to go on, or stop == true with s.torn or s.prealloc set, or an
	// error.
	bad := func(off int) (next int, stop bool, err error) {
		reason, intact := describeRecord(b, off)
		next, found := resync(b, off+1, nz)
		if last && !intact {
			if off > 0 && off >= nz {
				s.good, s.prealloc = int64(off), int64(len(b)-off)
				return 0, true, nil
			}
			if !found {
				s.good, s.torn = int64(off), reason
				return 0, true, nil
			}
			// Intact records follow: damage, not an interrupted write.
			if !skipCorrupt {
				return 0, false, fmt.Errorf("%w: %s offset %d: %s, with intact records from offset %d on; "+
					"not a torn tail (skipping the %d damaged bytes and keeping the records after them needs "+
					"SkipCorrupt, freqring serve --skip-corrupt)", ErrCorrupt, path, off, reason, next, next-off)
			}
		}
		if !skipCorrupt {
			return 0, false, fmt.Errorf("%w: %s offset %d: %s", ErrCorrupt, path, off, reason)
		}
		s.skipped += int64(next - off)
		s.skips = append(s.skips, skip{off: int64(off), n: int64(next - off), reason: reason})
		return next, false, nil
	}

	typ, p, n, err := readRecord(b, 0)
	switch {
	case err != nil:
		next, stop, err := bad(0)
		if err != nil || stop {
			return s, err
		}
		off = next
	case typ != recHeader:
		if !skipCorrupt {
			return s, fmt.Errorf("%w: %s offset 0: record type %d where the segment header belongs", ErrCorrupt, path, typ)
		}
		s.skipped += int64(n)
		off = n
	default:
		h, ok := parseSegHeader(p)
		switch {
		case !ok:
			return s, fmt.Errorf("%w: %s offset 0: header of %d bytes, want %d", ErrCorrupt, path, len(p), segHeaderLen)
		case h.version != formatVersion:
			return s, fmt.Errorf("wal: %s: format version %d, this build reads version %d", path, h.version, formatVersion)
		case h.seq != seq:
			return s, fmt.Errorf("%w: %s offset 0: header says segment %d", ErrCorrupt, path, h.seq)
		}
		s.header, s.created = true, h.created
		off = n
	}
	s.first = int64(off)

	for off < len(b) {
		typ, p, n, err := readRecord(b, off)
		if err == nil && typ != recData {
			if !skipCorrupt {
				return s, fmt.Errorf("%w: %s offset %d: record type %d inside the segment", ErrCorrupt, path, off, typ)
			}
			s.skipped += int64(n)
			off += n
			continue
		}
		if err != nil {
			next, stop, err := bad(off)
			if err != nil || stop {
				return s, err
			}
			off = next
			continue
		}
		s.records++
		if fn != nil && int64(off) >= from {
			if err := fn(int64(off), p); err != nil {
				return s, err
			}
		}
		off += n
	}
	s.good = int64(off)
	return s, nil
}

// resync returns the offset of the first intact data record at or after off,
// or len(b) and false if there is none. It tries offsets before nz only: b
// holds only zeros from nz on, and a record's type byte is never zero.
func resync(b []byte, off, nz int) (int, bool) {
	for ; off < nz; off++ {
		if typ, _, _, err := readRecord(b, off); err == nil && typ == recData {
			return off, true
		}
	}
	return len(b), false
}

// zeroSuffix returns the number of zero bytes at the end of b.
func zeroSuffix(b []byte) int {
	const chunk = 4 << 10
	end := len(b)
	for end >= chunk && bytes.Equal(b[end-chunk:end], zeroBlock[:chunk]) {
		end -= chunk
	}
	for end > 0 && b[end-1] == 0 {
		end--
	}
	return len(b) - end
}

// readFile reads the first size bytes of path into buf, reusing its capacity.
// size < 0 means the whole file.
func readFile(path string, size int64, buf []byte) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return buf[:0], fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	if size < 0 {
		fi, err := f.Stat()
		if err != nil {
			return buf[:0], fmt.Errorf("wal: %w", err)
		}
		size = fi.Size()
	}
	buf = slices.Grow(buf[:0], int(size))[:size]
	if _, err := io.ReadFull(f, buf); err != nil {
		return buf[:0], fmt.Errorf("wal: read %s: %d bytes: %w", path, size, err)
	}
	return buf, nil
}

// syncDir fsyncs a directory, so that creates, renames and removes in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFileAtomic writes dir/name so that after a crash the file holds either
// its old content or all of the new content: write fills dir/name.tmp through
// a buffered writer, the file is fsynced and renamed over dir/name, and dir is
// fsynced. If write or anything before the rename fails, the old file is
// untouched and the tmp file removed; an error from the final directory fsync
// means the new file is in place but its rename may not survive a power cut.
//
// It is here, not in the node, because wal owns the bytes on disk; the node
// uses it for snapshots. Calls for different names may run concurrently;
// concurrent calls for the same name must not.
func WriteFileAtomic(dir, name string, write func(w io.Writer) error) error {
	return writeFileAtomic(dir, name, 0, write)
}

// WriteFileAtomicDirect is WriteFileAtomicDirectChunk with 8 MiB chunks.
func WriteFileAtomicDirect(dir, name string, write func(w io.Writer) error) error {
	return WriteFileAtomicDirectChunk(dir, name, 0, write)
}

// WriteFileAtomicDirectChunk is WriteFileAtomic writing with direct I/O,
// around the page cache, where the file system allows it (see
// directWriter): for large files that nobody reads soon. write's bytes are
// copied into aligned chunks (64 KiB at first, doubling to size bytes,
// rounded up to a multiple of 4 KiB; 0 means 8 MiB); a goroutine writes
// each full chunk while write fills the next. The writer holds at most two
// full chunks, and has allocated about three chunks' bytes in all.
func WriteFileAtomicDirectChunk(dir, name string, size int, write func(w io.Writer) error) error {
	return writeFileAtomic(dir, name, chunkSize(size), write)
}

// writeFileAtomic is WriteFileAtomic, with direct I/O in chunks of direct
// bytes when direct is above 0.
func writeFileAtomic(dir, name string, direct int, write func(w io.Writer) error) (err error) {
	final := filepath.Join(dir, name)
	tmp := final + tmpExt
	flag := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	var f *os.File
	isDirect := false
	if direct > 0 {
		f, isDirect, err = openDirect(tmp, flag, 0o644)
	} else {
		f, err = os.OpenFile(tmp, flag, 0o644)
	}
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close() // a second Close after a failed rename only returns ErrClosed
			os.Remove(tmp)
		}
	}()
	var w interface {
		io.Writer
		flush() error
	}
	if isDirect {
		dw := newDirectWriter(f, true, direct)
		defer dw.stop()
		w = dw
	} else {
		w = bufferedWriter{bufio.NewWriterSize(f, 64<<10)}
	}
	if err := write(w); err != nil {
		return fmt.Errorf("wal: write %s: %w", final, err)
	}
	if err := w.flush(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if err := syncDir(dir); err != nil {
		// The rename happened; only its durability is in doubt.
		return fmt.Errorf("wal: sync dir after writing %s: %w", final, err)
	}
	return nil
}

// bufferedWriter is WriteFileAtomic's writer without direct I/O.
type bufferedWriter struct{ *bufio.Writer }

func (b bufferedWriter) flush() error { return b.Flush() }
