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
	if len(rec) == 0 {
		return nil, false, nil
	}
	newest, err := RecordNewest(rec)
	if err != nil {
		return nil, false, err
	}
	if !d.Compactable(newest, now) {
		return nil, false, nil
	}
	if n, err := contentLogs(rec); err != nil || n == 0 {
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

// Compactable reports whether Compact at now (unix ms) may drop something
// from a record whose newest send is at newest: whether the domain has
// recipient and content rules and newest is at or before now minus the
// longest content window. Callers skip Compact otherwise.
func (d *Domain) Compactable(newest, now int64) bool {
	return d.contentCap > 0 && d.recipCap > 0 && newest <= now-d.contentSpan
}

// contentLogs returns the number of content logs of rec, in the current
// RecordFormat, reading its header and skipping the recipient log's gaps,
// in place: a sweep asks this of every record older than the content
// window at every pass.
func contentLogs(rec []byte) (int, error) {
	if len(rec) > MaxRecordBytes {
		return 0, fmt.Errorf("%w: %d bytes, more than %d", ErrCorruptRecord, len(rec), MaxRecordBytes)
	}
	n, pos := countAt(rec, tagBits+timeBits)
	if n > 0 {
		pos += 1 + uint(bitsAt(rec, pos, 1))*timeBits
		if n > 1 {
			w := uint(bitsAt(rec, pos, widthBits))
			if w > maxValueBits {
				return 0, fmt.Errorf("%w: recipient width %d", ErrCorruptRecord, w)
			}
			pos += widthBits + uint(n-1)*w
		}
	}
	if pos+countBits > uint(len(rec))*8 {
		return 0, fmt.Errorf("%w: %d bytes end inside the recipient log", ErrCorruptRecord, len(rec))
	}
	nc, _ := countAt(rec, pos)
	if nc > MaxContents {
		return 0, fmt.Errorf("%w: %d content logs, more than %d", ErrCorruptRecord, nc, MaxContents)
	}
	return nc, nil
}

// countAt reads the count field (see bitReader.count) at bit pos of b and
// returns it and the position after it.
func countAt(b []byte, pos uint) (int, uint) {
	v := bitsAt(b, pos, countBits+countExtBits)
	if v&countEscape != countEscape {
		return int(v & countEscape), pos + countBits
	}
	return int(countEscape + v>>countBits), pos + countBits + countExtBits
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
