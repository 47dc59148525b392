package window

import "fmt"

// Format 1 is the record format before content entries referred to the
// recipient log: each content log keeps its times as gaps of one width. It
// is read from snapshots and peers that wrote it, and written for peers
// that read nothing newer (see ConvertRecord).

// decodeContentV1 reads nc format-1 content logs into s.
func (s *state) decodeContentV1(r *bitReader, nc, size int) error {
	w := uint(r.read(widthBits))
	if w > maxValueBits {
		return fmt.Errorf("%w: content width %d", ErrCorruptRecord, w)
	}
	for j := 0; j < nc; j++ {
		fp := uint32(r.read(fpBits))
		n := r.count()
		if n == 0 {
			return fmt.Errorf("%w: empty content log %d", ErrCorruptRecord, j)
		}
		if r.overrun(uint(n) * w) {
			return fmt.Errorf("%w: content log %d overruns %d bytes", ErrCorruptRecord, j, size)
		}
		off := len(s.ctimes)
		s.ctimes = grow(s.ctimes, off+n)
		t := s.newest - int64(r.read(w))
		s.ctimes[off+n-1] = t
		for i := off + n - 2; i >= off; i-- {
			t -= int64(r.read(w))
			s.ctimes[i] = t
		}
		if t < 0 {
			return fmt.Errorf("%w: content entry before 1970", ErrCorruptRecord)
		}
		s.clogs = append(s.clogs, contentLog{fp: fp, off: int32(off), n: int32(n)})
	}
	return nil
}

// encodeContentV1 writes s's content logs (at least one) in format 1.
func (s *state) encodeContentV1(w *bitWriter) {
	var or int64
	for _, c := range s.clogs {
		e := s.ctimes[c.off : c.off+c.n]
		or |= s.newest - e[len(e)-1]
		for i := len(e) - 1; i > 0; i-- {
			or |= e[i] - e[i-1]
		}
	}
	wd := widthOf(or)
	w.write(uint64(wd), widthBits)
	for _, c := range s.clogs {
		e := s.ctimes[c.off : c.off+c.n]
		w.write(uint64(c.fp), fpBits)
		w.count(len(e))
		w.write(uint64(s.newest-e[len(e)-1]), wd)
		for i := len(e) - 1; i > 0; i-- {
			w.write(uint64(e[i]-e[i-1]), wd)
		}
	}
}
