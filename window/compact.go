package window

import (
	"encoding/binary"
	"fmt"
)

// Compact returns rec without its content logs when its newest send is at
// or before now (unix ms) minus d's longest content window: no content rule
// can count any of their entries at now or later, and the next write would
// prune them. A recipient that sends nothing more keeps them otherwise:
// every record keeps the content log of its newest send. Only a domain
// with recipient rules is compacted, so that a refund still finds every
// send in the recipient log. Counter states are left as they are.
//
// It returns compacted false and nil out when there is nothing to drop, and
// compacted true with nil out when nothing is left: the caller drops the
// record. Records are read, not decoded, until the header says there are
// logs to drop. The returned bytes live in s, valid until the next call
// with s.
func (d *Domain) Compact(s *Scratch, rec []byte, now int64) (out []byte, compacted bool, err error) {
	if d.contentCap == 0 || d.recipCap == 0 || len(rec) == 0 {
		return nil, false, nil
	}
	newest, err := RecordNewest(rec)
	if err != nil {
		return nil, false, err
	}
	if newest > now-d.contentSpan {
		return nil, false, nil
	}
	if n, err := s.st.contentLogs(rec); err != nil || n == 0 {
		return nil, false, err
	}
	if err := s.st.decode(rec); err != nil {
		return nil, false, err
	}
	st := &s.st
	st.clogs, st.ctimes = st.clogs[:0], st.ctimes[:0]
	if len(st.recip) == 0 && len(st.counters) == 0 {
		return nil, true, nil
	}
	s.out = st.encode(s.out[:0])
	return s.out, true, nil
}

// contentLogs returns the number of content logs of rec, in the current
// RecordFormat, reading its header and skipping the recipient log's gaps,
// in place: a sweep asks this of every record older than the content
// window at every pass.
func (s *state) contentLogs(rec []byte) (int, error) {
	if len(rec) > MaxRecordBytes {
		return 0, fmt.Errorf("%w: %d bytes, more than %d", ErrCorruptRecord, len(rec), MaxRecordBytes)
	}
	end := uint(len(rec)) * 8
	pos := uint(tagBits + timeBits)
	count := func() int {
		v := bitsAt(rec, pos, countBits)
		pos += countBits
		if v == countEscape {
			v += bitsAt(rec, pos, countExtBits)
			pos += countExtBits
		}
		return int(v)
	}
	if n := count(); n > 0 {
		if bitsAt(rec, pos, 1) == 1 {
			pos += timeBits
		}
		pos++
		if n > 1 {
			w := uint(bitsAt(rec, pos, widthBits))
			pos += widthBits
			if w > maxValueBits {
				return 0, fmt.Errorf("%w: recipient width %d", ErrCorruptRecord, w)
			}
			pos += uint(n-1) * w
		}
	}
	if pos+countBits > end {
		return 0, fmt.Errorf("%w: %d bytes end inside the recipient log", ErrCorruptRecord, len(rec))
	}
	nc := count()
	if nc > MaxContents {
		return 0, fmt.Errorf("%w: %d content logs, more than %d", ErrCorruptRecord, nc, MaxContents)
	}
	return nc, nil
}

// bitsAt returns the n bits (n <= 56) of the little-endian bit stream b that
// start at bit pos, reading zeros past b's end.
func bitsAt(b []byte, pos, n uint) uint64 {
	i := pos >> 3
	var v uint64
	if i+8 <= uint(len(b)) {
		v = binary.LittleEndian.Uint64(b[i:])
	} else {
		for k := uint(0); k < 8 && i+k < uint(len(b)); k++ {
			v |= uint64(b[i+k]) << (8 * k)
		}
	}
	return v >> (pos & 7) & (1<<n - 1)
}
