package window

import "fmt"

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
// RecordFormat, reading its header and skipping the recipient log's gaps.
func (s *state) contentLogs(rec []byte) (int, error) {
	if len(rec) > MaxRecordBytes {
		return 0, fmt.Errorf("%w: %d bytes, more than %d", ErrCorruptRecord, len(rec), MaxRecordBytes)
	}
	s.in = append(append(s.in[:0], rec...), make([]byte, pad)...)
	r := bitReader{b: s.in, end: uint(len(rec)) * 8}
	r.pos = tagBits + timeBits
	if n := r.count(); n > 0 {
		if r.read(1) == 1 {
			r.pos += timeBits
		}
		if n > 1 {
			w := uint(r.read(widthBits))
			if w > maxValueBits {
				return 0, fmt.Errorf("%w: recipient width %d", ErrCorruptRecord, w)
			}
			r.pos += uint(n-1) * w
		}
	}
	if r.overrun(countBits) {
		return 0, fmt.Errorf("%w: %d bytes end inside the recipient log", ErrCorruptRecord, len(rec))
	}
	nc := r.count()
	if nc > MaxContents {
		return 0, fmt.Errorf("%w: %d content logs, more than %d", ErrCorruptRecord, nc, MaxContents)
	}
	return nc, nil
}
