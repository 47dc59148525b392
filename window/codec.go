package window

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// ErrCorruptRecord reports record bytes that the codec did not write.
var ErrCorruptRecord = errors.New("window: corrupt record")

// ErrNeedsFormat3 reports a record with counter states converted to a
// format older than 3. It wraps ErrInvalid.
var ErrNeedsFormat3 = fmt.Errorf("%w: counter states need record format 3", ErrInvalid)

const (
	timeBits     = 44 // unix ms up to year 2527
	maxTime      = 1<<timeBits - 1
	widthBits    = 6
	maxValueBits = timeBits
	countBits    = 4
	countExtBits = 11
	countEscape  = 1<<countBits - 1
	maxCount     = countEscape + 1<<countExtBits - 1 // 2062
	fpBits       = 32
	tagBits      = 16
)

// contentLog locates one content log inside Scratch.ctimes.
type contentLog struct {
	fp  uint32 // fingerprint of the content hash (see contentFP)
	off int32  // first entry in Scratch.ctimes
	n   int32  // entries, ascending
}

// state is the decoded form of one record.
type state struct {
	tag    uint16
	newest int64        // unix ms of the newest entry in any log; 0 when empty
	recip  []int64      // recipient log, unix ms, ascending
	clogs  []contentLog // content logs, in record order
	ctimes []int64      // entries of every content log, each log contiguous and ascending
	in     []byte       // the record being decoded, padded for bitReader
	match  []int32      // encodeContent's recipient position per content entry, -1 for none

	counters []counterState // format 3: counter states, sorted by id once pruned
	cvals    []int64        // values of every counter state
	cnew     []int64        // pruneCounters' new cvals
}

func (s *state) reset(tag uint16) {
	s.tag, s.newest = tag, 0
	s.recip = s.recip[:0]
	s.clogs = s.clogs[:0]
	s.ctimes = s.ctimes[:0]
	s.counters = s.counters[:0]
	s.cvals = s.cvals[:0]
}

// contentFP folds a 64-bit content hash into the 32-bit fingerprint a
// record keeps. Two contents of one recipient with equal fingerprints share
// their content logs: they can only be denied early, never admitted beyond
// a limit.
func contentFP(h uint64) uint32 { return uint32(h ^ h>>32) }

// ContentFingerprint returns the fingerprint a record keeps of the content
// hash h (Explain's Logged.Content).
func ContentFingerprint(h uint64) uint32 { return contentFP(h) }

// pad is the slack after the last byte of a stream that bitReader and
// bitWriter may touch: every run of fixed-size fields between two overrun
// checks is shorter than 8*pad-64 bits.
const pad = 32

// bitReader reads a little-endian bit stream, least significant bit first.
// b holds the stream followed by pad zero bytes, so that read can always
// load 8 bytes; callers check pos against end before trusting what they read.
type bitReader struct {
	b   []byte
	pos uint // next bit
	end uint // bits in the stream
}

// read returns the next n bits, n <= 56.
func (r *bitReader) read(n uint) uint64 {
	v := binary.LittleEndian.Uint64(r.b[r.pos>>3:]) >> (r.pos & 7) & (1<<n - 1)
	r.pos += n
	return v
}

// readGaps fills dst, from its end, with t minus the running sum of len(dst)
// gaps of w bits each, and returns the oldest time. The caller has checked
// that the bits are there. It is read with the position in a local
// variable, which the compiler keeps in a register.
func (r *bitReader) readGaps(dst []int64, t int64, w uint) int64 {
	b, pos, mask := r.b, r.pos, uint64(1)<<w-1
	i := len(dst) - 1
	if w <= 28 {
		// Two gaps from each load: a load shifted by pos&7 holds at
		// least 57 bits.
		for ; i >= 1; i -= 2 {
			word := binary.LittleEndian.Uint64(b[pos>>3:]) >> (pos & 7)
			t -= int64(word & mask)
			dst[i] = t
			t -= int64(word >> w & mask)
			dst[i-1] = t
			pos += 2 * w
		}
	}
	for ; i >= 0; i-- {
		t -= int64(binary.LittleEndian.Uint64(b[pos>>3:]) >> (pos & 7) & mask)
		dst[i] = t
		pos += w
	}
	r.pos = pos
	return t
}

func (r *bitReader) count() int {
	v := r.read(countBits)
	if v == countEscape {
		v += r.read(countExtBits)
	}
	return int(v)
}

// overrun reports whether the reader has gone, or would go with the next
// more bits, past the end of the stream.
func (r *bitReader) overrun(more uint) bool { return r.pos+more > r.end }

// bitWriter appends a little-endian bit stream to buf, a whole word at a
// time (storing partial words would stall on store-to-load forwarding). buf
// must have room for every bit written plus 8 bytes.
type bitWriter struct {
	buf []byte
	off int    // bytes stored
	acc uint64 // pending bits
	n   uint   // pending bits in acc, < 64
}

// write appends the low nb bits of v, nb <= 56; v must have no higher bits.
func (w *bitWriter) write(v uint64, nb uint) {
	w.off, w.acc, w.n = put(w.buf, w.off, w.acc, w.n, v, nb)
}

// put is write on a writer's state held in local variables, which the
// compiler keeps in registers across a loop (a bitWriter, 6 words, stays
// in memory): it appends the low nb bits of v, nb <= 56, and returns the
// new state.
func put(buf []byte, off int, acc uint64, n uint, v uint64, nb uint) (int, uint64, uint) {
	acc |= v << n
	if n+nb < 64 {
		return off, acc, n + nb
	}
	binary.LittleEndian.PutUint64(buf[off:], acc)
	return off + 8, v >> (64 - n), n + nb - 64 // v>>64 is 0 when n == 0
}

// writeGaps writes the gaps between consecutive entries of the ascending
// log, newest first, wd bits each, keeping the writer's state in local
// variables (registers) for the loop.
func (w *bitWriter) writeGaps(log []int64, wd uint) {
	buf, off, acc, n := w.buf, w.off, w.acc, w.n
	i := len(log) - 1
	if wd <= 28 {
		// Two gaps at a time, as one value of 2*wd <= 56 bits.
		for ; i > 1; i -= 2 {
			v := uint64(log[i]-log[i-1]) | uint64(log[i-1]-log[i-2])<<wd
			off, acc, n = put(buf, off, acc, n, v, 2*wd)
		}
	}
	for ; i > 0; i-- {
		off, acc, n = put(buf, off, acc, n, uint64(log[i]-log[i-1]), wd)
	}
	w.off, w.acc, w.n = off, acc, n
}

// bytes flushes the pending bits and returns the stream's length in bytes.
func (w *bitWriter) bytes() int {
	binary.LittleEndian.PutUint64(w.buf[w.off:], w.acc)
	return w.off + int(w.n+7)/8
}

func (w *bitWriter) count(v int) {
	if v < countEscape {
		w.write(uint64(v), countBits)
		return
	}
	w.write(countEscape|uint64(v-countEscape)<<countBits, countBits+countExtBits)
}

// widthOf returns the bits needed to hold v.
func widthOf(v int64) uint { return uint(bits.Len64(uint64(v))) }

// RecordTag returns the opaque 16-bit tag stored in a record's header, or 0
// for an empty or too short record.
func RecordTag(rec []byte) uint16 {
	if len(rec) < 2 {
		return 0
	}
	return binary.LittleEndian.Uint16(rec)
}

// RecordNewest returns the unix ms time of the newest send in rec, or an
// error wrapping ErrCorruptRecord. A record whose newest send is older than
// its domain's Longest window holds nothing any rule counts.
func RecordNewest(rec []byte) (int64, error) {
	if len(rec) < (tagBits+timeBits+7)/8 {
		return 0, fmt.Errorf("%w: %d bytes, shorter than its header", ErrCorruptRecord, len(rec))
	}
	var b [8]byte
	copy(b[:], rec[tagBits/8:])
	return int64(binary.LittleEndian.Uint64(b[:]) & maxTime), nil
}

// decode parses rec, in the current RecordFormat, into s. Trailing bytes
// after the record are ignored (a record may sit in a larger slot).
func (s *state) decode(rec []byte) error { return s.decodeFormat(rec, RecordFormat) }

// decodeFormat parses rec, in format 1, 2 or 3, into s.
func (s *state) decodeFormat(rec []byte, format int) error {
	if len(rec) > MaxRecordBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrCorruptRecord, len(rec), MaxRecordBytes)
	}
	s.in = append(append(s.in[:0], rec...), make([]byte, pad)...)
	r := bitReader{b: s.in, end: uint(len(rec)) * 8}
	s.tag = uint16(r.read(tagBits))
	s.newest = int64(r.read(timeBits))
	s.recip = s.recip[:0]
	s.clogs = s.clogs[:0]
	s.ctimes = s.ctimes[:0]
	s.counters = s.counters[:0]
	s.cvals = s.cvals[:0]

	n := r.count()
	if n > 0 {
		t := s.newest
		if r.read(1) == 1 {
			t -= int64(r.read(timeBits))
		}
		var w uint
		if n > 1 {
			w = uint(r.read(widthBits))
			if w > maxValueBits {
				return fmt.Errorf("%w: recipient width %d", ErrCorruptRecord, w)
			}
			if r.overrun(uint(n-1) * w) {
				return fmt.Errorf("%w: %d recipient entries of %d bits overrun %d bytes", ErrCorruptRecord, n, w, len(rec))
			}
		}
		s.recip = grow(s.recip, n)
		s.recip[n-1] = t
		t = r.readGaps(s.recip[:n-1], t, w)
		if t < 0 {
			return fmt.Errorf("%w: recipient entry before 1970", ErrCorruptRecord)
		}
	}

	if r.overrun(0) {
		return fmt.Errorf("%w: %d bytes end inside the recipient log", ErrCorruptRecord, len(rec))
	}
	nc := r.count()
	if nc > MaxContents {
		return fmt.Errorf("%w: %d content logs, more than %d", ErrCorruptRecord, nc, MaxContents)
	}
	if nc > 0 {
		var err error
		if format == 1 {
			err = s.decodeContentV1(&r, nc, len(rec))
		} else {
			err = s.decodeContent(&r, nc, len(rec))
		}
		if err != nil {
			return err
		}
	}
	if r.overrun(0) {
		return fmt.Errorf("%w: %d bytes end inside the record", ErrCorruptRecord, len(rec))
	}
	if format >= 3 {
		if err := s.decodeCounters(&r, len(rec)); err != nil {
			return err
		}
		if r.overrun(0) {
			return fmt.Errorf("%w: %d bytes end inside the counter states", ErrCorruptRecord, len(rec))
		}
	}
	return nil
}

// Format 3 adds counter states after the content logs:
//
//	k        count    counter states (at most MaxRules)
//	then k times, by ascending id:
//	  id     32 bits  the rule's counterID
//	  alg     3 bits  its Algorithm (not SlidingLog)
//	  m      count    values (2 to MaxBuckets+2)
//	  aw      6 bits  bits of the age (at most 44)
//	  age    aw bits  newest minus vals[0] (a time: see counterState)
//	  width   6 bits  bits per further value (at most counterBits)
//	  m-1 values: vals[1:]
const counterBits = 56

// maxCounterValue bounds every count a counter state keeps, so that sums
// over MaxBuckets+1 sub-windows cannot overflow: counts saturate there (1e15
// sends). maxDebt bounds a bucket's debt, above MaxCounterLimit sends of
// MaxWindow units (a bucket keeps at most its capacity).
const (
	maxCounterValue = 1<<50 - 1
	maxDebt         = 1<<55 - 1
)

func (s *state) decodeCounters(r *bitReader, size int) error {
	k := r.count()
	if k > MaxRules {
		return fmt.Errorf("%w: %d counter states, more than %d", ErrCorruptRecord, k, MaxRules)
	}
	for j := range k {
		// The header's fields fit in the reader's padding; the check of m*w
		// values below covers them.
		id := uint32(r.read(32))
		alg := Algorithm(r.read(3))
		m := r.count()
		aw := uint(r.read(widthBits))
		if aw > timeBits {
			return fmt.Errorf("%w: counter state %d: age width %d", ErrCorruptRecord, j, aw)
		}
		age := int64(r.read(aw))
		w := uint(r.read(widthBits))
		switch {
		case alg == SlidingLog || alg > FixedWindow:
			return fmt.Errorf("%w: counter state %d: algorithm %d", ErrCorruptRecord, j, alg)
		case m < 2 || m > MaxBuckets+2 || (m > 3 && alg != SlidingCounter):
			return fmt.Errorf("%w: counter state %d: %d values for %v", ErrCorruptRecord, j, m, alg)
		case w > counterBits:
			return fmt.Errorf("%w: counter state %d: width %d", ErrCorruptRecord, j, w)
		case j > 0 && id <= s.counters[j-1].id:
			return fmt.Errorf("%w: counter state %d: id %08x out of order", ErrCorruptRecord, j, id)
		case r.overrun(uint(m-1) * w):
			return fmt.Errorf("%w: counter state %d overruns %d bytes", ErrCorruptRecord, j, size)
		}
		off := len(s.cvals)
		if age > s.newest {
			return fmt.Errorf("%w: counter state %d: time before 1970", ErrCorruptRecord, j)
		}
		s.cvals = append(s.cvals, s.newest-age)
		for range m - 1 {
			v := int64(r.read(w))
			if most := int64(maxCounterValue); v > most && (!alg.isBucket() || v > maxDebt) {
				return fmt.Errorf("%w: counter state %d: value %d out of range", ErrCorruptRecord, j, v)
			}
			s.cvals = append(s.cvals, v)
		}
		s.counters = append(s.counters, counterState{id: id, alg: alg, off: int32(off), n: int32(m)})
	}
	return nil
}

// encodeCounters writes s's counter states in format 3. The caller has
// normalized them to s.newest and sorted them by id.
func (s *state) encodeCounters(w *bitWriter) {
	w.count(len(s.counters))
	for _, c := range s.counters {
		v := s.cvals[c.off : c.off+c.n]
		var or int64
		for _, x := range v[1:] {
			or |= x
		}
		age := s.newest - v[0]
		aw, wd := widthOf(age), widthOf(or)
		w.write(uint64(c.id), 32)
		w.write(uint64(c.alg), 3)
		w.count(int(c.n))
		w.write(uint64(aw), widthBits)
		w.write(uint64(age), aw)
		w.write(uint64(wd), widthBits)
		for _, x := range v[1:] {
			w.write(uint64(x), wd)
		}
	}
}

// encode appends the record form of s, in the current RecordFormat, to dst.
// The caller has pruned s: every log holds at most maxCount entries, all
// within 2^44-1 ms of s.newest.
func (s *state) encode(dst []byte) []byte { return s.encodeFormat(dst, RecordFormat) }

// encodeFormat appends the record form of s in format 1, 2 or 3 to dst;
// formats 1 and 2 leave out the counter states.
func (s *state) encodeFormat(dst []byte, format int) []byte {
	entries := len(s.recip)
	for _, c := range s.clogs {
		entries += int(c.n)
	}
	maxBits := tagBits + timeBits + 2*(countBits+countExtBits) + 1 + timeBits + 2*widthBits +
		len(s.clogs)*(fpBits+countBits+countExtBits) + entries*(maxValueBits+1) +
		countBits + countExtBits + len(s.counters)*(32+3+countBits+countExtBits+2*widthBits+timeBits) + len(s.cvals)*counterBits
	start := len(dst)
	need := start + maxBits/8 + 1 + pad
	if cap(dst) < need {
		dst = append(dst[:cap(dst)], make([]byte, need-cap(dst))...)
	}
	dst = dst[:need]
	w := bitWriter{buf: dst[start:]}

	w.write(uint64(s.tag), tagBits)
	w.write(uint64(s.newest), timeBits)
	n := len(s.recip)
	w.count(n)
	if n > 0 {
		if age := s.newest - s.recip[n-1]; age != 0 {
			w.write(1, 1)
			w.write(uint64(age), timeBits)
		} else {
			w.write(0, 1)
		}
		if n > 1 {
			// bits.Len of the OR of the gaps is that of their max; two
			// accumulators halve the loop's dependency chain.
			var or, or2 int64
			i := n - 1
			for ; i > 1; i -= 2 {
				or |= s.recip[i] - s.recip[i-1]
				or2 |= s.recip[i-1] - s.recip[i-2]
			}
			if i == 1 {
				or |= s.recip[1] - s.recip[0]
			}
			wd := widthOf(or | or2)
			w.write(uint64(wd), widthBits)
			w.writeGaps(s.recip, wd)
		}
	}

	w.count(len(s.clogs))
	if len(s.clogs) > 0 {
		if format == 1 {
			s.encodeContentV1(&w)
		} else {
			s.encodeContent(&w)
		}
	}
	if format >= 3 {
		s.encodeCounters(&w)
	}
	return dst[:start+w.bytes()]
}

// grow returns s resized to n, reusing its storage when it can.
func grow(s []int64, n int) []int64 {
	if n <= cap(s) {
		return s[:n]
	}
	return append(s[:cap(s)], make([]int64, n-cap(s))...)
}

// RecordFormat is the format of the records this package writes. Records
// carry no version of their own: containers that hold them (store images)
// say which format they hold, and ConvertRecord translates.
//
// Format 2 differs from format 1 in the content logs only: an entry that is
// also in the recipient log (almost every entry: a recorded send with
// content goes into both) is written as its position there, a few bits
// instead of a timestamp. Format 3 adds the states of the counting
// algorithms after the content logs (see decodeCounters); a record of
// format 2 is a format-3 record without them.
const RecordFormat = 3

// ConvertRecord returns rec, written in format from, rewritten in format to
// (each 1 to RecordFormat); equal formats return rec itself. The returned
// bytes live in s, valid until the next call with s. An error wraps
// ErrCorruptRecord, or ErrInvalid for an unknown format or a record whose
// counter states format to cannot carry (ErrNeedsFormat3): only a release
// that reads format 3 can hold rules of the counting algorithms.
func ConvertRecord(s *Scratch, rec []byte, from, to int) ([]byte, error) {
	for _, f := range []int{from, to} {
		if f < 1 || f > RecordFormat {
			return nil, fmt.Errorf("%w: record format %d, not 1 to %d", ErrInvalid, f, RecordFormat)
		}
	}
	if from == to {
		return rec, nil
	}
	if err := s.st.decodeFormat(rec, from); err != nil {
		return nil, err
	}
	if to < 3 && len(s.st.counters) > 0 {
		return nil, fmt.Errorf("%w: the record holds %d counter states (rule ids %08x...), which format %d cannot carry", ErrNeedsFormat3, len(s.st.counters), s.st.counters[0].id, to)
	}
	s.out = s.st.encodeFormat(s.out[:0], to)
	return s.out, nil
}

// gammaMaxZeros bounds the leading zeros of a gamma code (z zeros, a one,
// then the low z bits of a value of width z+1, least significant bit
// first): positions in a recipient log are below maxCount+1 < 2^12.
const gammaMaxZeros = 11

// Format 2 content logs, after the count k of logs:
//
//	refs    1 bit   0: the logs follow as in format 1 (no entry is in the
//	                recipient log); 1: as below
//	width   6 bits  bits per explicit value in every content log
//	then k times:
//	  fp    32 bits
//	  m     count   entries (>= 1)
//	  m entries, newest first, each:
//	    1 bit: 1 = in the recipient log, at position p, written as the gamma
//	           code of q-p, where q is the position of the log's previous
//	           entry found there (the recipient log's length at first);
//	           0 = explicit, written as width bits: the previous entry of the
//	           log (newest at first) minus this one.
//
// The encoder matches entries to recipient positions greedily from the
// newest, so equal states still encode to equal bytes.

// encodeContent writes s's content logs (at least one) in format 2.
func (s *state) encodeContent(w *bitWriter) {
	// Match every entry first: the explicit values' width comes first.
	s.match = s.match[:0]
	var or int64
	refs := false
	for _, c := range s.clogs {
		e := s.ctimes[c.off : c.off+c.n]
		cur, prev := len(s.recip), s.newest
		for i := len(e) - 1; i >= 0; i-- {
			t := e[i]
			for cur > 0 && s.recip[cur-1] > t {
				cur--
			}
			if cur > 0 && s.recip[cur-1] == t {
				cur--
				s.match = append(s.match, int32(cur))
				refs = true
			} else {
				s.match = append(s.match, -1)
				or |= prev - t
			}
			prev = t
		}
	}
	if !refs {
		// Nothing to refer to (a domain without recipient rules keeps no
		// recipient log): format 1's logs, without a bit per entry.
		w.write(0, 1)
		s.encodeContentV1(w)
		return
	}
	wd := widthOf(or)
	w.write(1|uint64(wd)<<1, 1+widthBits)
	k := 0
	for _, c := range s.clogs {
		e := s.ctimes[c.off : c.off+c.n]
		if len(e) < countEscape {
			w.write(uint64(c.fp)|uint64(len(e))<<fpBits, fpBits+countBits)
		} else {
			w.write(uint64(c.fp), fpBits)
			w.count(len(e))
		}
		q, prev := int32(len(s.recip)), s.newest
		for i := len(e) - 1; i >= 0; i-- {
			if p := s.match[k]; p >= 0 {
				// The kind bit 1, then the gamma code of q-p.
				d := uint64(q - p)
				z := widthOf(int64(d)) - 1
				w.write(1|(1<<z|(d&(1<<z-1))<<(z+1))<<1, 2*z+2)
				q = p
			} else {
				w.write(uint64(prev-e[i])<<1, 1+wd)
			}
			prev = e[i]
			k++
		}
	}
}

// decodeContent reads nc format-2 content logs into s, after its recipient
// log.
func (s *state) decodeContent(r *bitReader, nc, size int) error {
	if r.read(1) == 0 {
		return s.decodeContentV1(r, nc, size)
	}
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
		off := len(s.ctimes)
		s.ctimes = grow(s.ctimes, off+n)
		q, t := len(s.recip), s.newest
		for i := off + n - 1; i >= off; i-- {
			if r.overrun(0) {
				return fmt.Errorf("%w: content log %d overruns %d bytes", ErrCorruptRecord, j, size)
			}
			// One load for the kind bit and what follows it.
			word := binary.LittleEndian.Uint64(r.b[r.pos>>3:]) >> (r.pos & 7)
			if word&1 == 1 {
				z := uint(bits.TrailingZeros64(word >> 1))
				if z > gammaMaxZeros {
					return fmt.Errorf("%w: content log %d refers past the recipient log", ErrCorruptRecord, j)
				}
				r.pos += 2*z + 2
				d := int(1<<z | word>>(z+2)&(1<<z-1))
				if d > q {
					return fmt.Errorf("%w: content log %d refers past the recipient log", ErrCorruptRecord, j)
				}
				q -= d
				if s.recip[q] > t {
					return fmt.Errorf("%w: content log %d out of order", ErrCorruptRecord, j)
				}
				t = s.recip[q]
			} else {
				r.pos++
				t -= int64(r.read(w))
			}
			s.ctimes[i] = t
		}
		if t < 0 {
			return fmt.Errorf("%w: content entry before 1970", ErrCorruptRecord)
		}
		s.clogs = append(s.clogs, contentLog{fp: fp, off: int32(off), n: int32(n)})
	}
	return nil
}
