package usage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"
)

// Precision is the sketch's p: it has 2^Precision one-byte registers.
const Precision = 14

// Registers is the number of registers of a sketch (16,384: 16 KiB).
const Registers = 1 << Precision

// StdError is the relative standard error of a sketch's distinct count,
// 1.04/sqrt(2^Precision): 0.81%. About 99.7% of estimates lie within three
// of it (2.4%) of the true count; below linearCountingMax distinct keys the
// estimate is linear counting's, far closer.
var StdError = 1.04 / math.Sqrt(Registers)

// q is the number of hash bits left after the register index; a register
// holds 0 (empty) or the rank 1..q+1 of the highest-ranked hash it saw.
const q = 64 - Precision

// linearCountingMax is the estimate up to which linear counting (from the
// number of empty registers) is used: HyperLogLog++'s threshold for p = 14,
// below which linear counting's error is smaller than the sketch's.
const linearCountingMax = 11500

// ErrCorrupt is returned, wrapped with the offset and what is wrong, by
// every decoder of this package for bytes that are not what its encoder
// writes.
var ErrCorrupt = errors.New("usage: corrupt encoding")

// Sketch is a HyperLogLog sketch of distinct 64-bit keys (Flajolet et al.
// 2007, with Ertl's 2017 estimator and linear counting for small counts),
// fed with keys that are already uniform hashes (xxhash64), never re-hashed.
// Its zero value is an empty sketch. It is not safe for concurrent use (the
// Tracker's live sketches are).
type Sketch struct {
	reg [Registers]uint8
}

// slot returns the register a hash goes to and its rank there.
func slot(h uint64) (idx uint32, rank uint8) {
	idx = uint32(h >> q)
	rank = uint8(bits.LeadingZeros64(h<<Precision|1<<(Precision-1))) + 1 // at most q+1
	return idx, rank
}

// Add adds the key hash h.
func (s *Sketch) Add(h uint64) {
	idx, rank := slot(h)
	s.reg[idx] = max(s.reg[idx], rank)
}

// Merge makes s the sketch of the union of its keys and o's.
func (s *Sketch) Merge(o *Sketch) {
	for i, r := range o.reg {
		s.reg[i] = max(s.reg[i], r)
	}
}

// Estimate returns the estimated number of distinct keys added.
func (s *Sketch) Estimate() float64 {
	var c [q + 2]int // registers per value
	for _, r := range s.reg {
		c[r]++
	}
	const m = float64(Registers)
	if c[0] > 0 {
		if lc := m * math.Log(m/float64(c[0])); lc <= linearCountingMax {
			return lc
		}
	}
	z := m * tau(1-float64(c[q+1])/m)
	for k := q; k >= 1; k-- {
		z = 0.5 * (z + float64(c[k]))
	}
	z += m * sigma(float64(c[0])/m)
	return m * m / (2 * math.Ln2 * z)
}

// sigma and tau are the series of Ertl's improved raw estimator ("New
// cardinality estimation algorithms for HyperLogLog sketches", 2017, alg. 6).
func sigma(x float64) float64 {
	if x == 1 {
		return math.Inf(1)
	}
	y, z := 1.0, x
	for {
		x *= x
		prev := z
		z += x * y
		y += y
		if z == prev {
			return z
		}
	}
}

func tau(x float64) float64 {
	if x == 0 || x == 1 {
		return 0
	}
	y, z := 1.0, 1-x
	for {
		x = math.Sqrt(x)
		prev := z
		y *= 0.5
		z -= (1 - x) * (1 - x) * y
		if z == prev {
			return z / 3
		}
	}
}

// Sketch encodings (little-endian), chosen by size:
//
//	sketch := precision u8 (14) | kind u8 | body
//	kind 0, sparse: count u16 | count × (index u16 | value u8), indexes increasing, values 1..q+1
//	kind 1, dense:  2^14 × value u8, each 0..q+1
const (
	sketchSparse = 0
	sketchDense  = 1
	denseBytes   = 2 + Registers
)

// AppendBinary appends the sketch's encoding to dst: sparse (3 bytes per
// nonempty register) while that is shorter than dense (16 KiB).
func (s *Sketch) AppendBinary(dst []byte) []byte {
	used := 0
	for _, r := range s.reg {
		if r != 0 {
			used++
		}
	}
	if 4+3*used >= denseBytes {
		dst = append(dst, Precision, sketchDense)
		return append(dst, s.reg[:]...)
	}
	dst = append(dst, Precision, sketchSparse)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(used))
	for i, r := range s.reg {
		if r != 0 {
			dst = binary.LittleEndian.AppendUint16(dst, uint16(i))
			dst = append(dst, r)
		}
	}
	return dst
}

// DecodeSketch decodes a sketch from the start of b and returns it and the
// bytes it took. Bytes that AppendBinary would not write return ErrCorrupt.
func DecodeSketch(b []byte) (*Sketch, int, error) {
	if len(b) < 2 {
		return nil, 0, fmt.Errorf("%w: sketch: %d bytes, want at least 2", ErrCorrupt, len(b))
	}
	if b[0] != Precision {
		return nil, 0, fmt.Errorf("%w: sketch: precision %d, want %d", ErrCorrupt, b[0], Precision)
	}
	s := new(Sketch)
	switch b[1] {
	case sketchDense:
		if len(b) < denseBytes {
			return nil, 0, fmt.Errorf("%w: dense sketch: %d bytes, want %d", ErrCorrupt, len(b), denseBytes)
		}
		used := 0
		for i, r := range b[2:denseBytes] {
			if r > q+1 {
				return nil, 0, fmt.Errorf("%w: dense sketch: register %d holds %d, more than %d", ErrCorrupt, i, r, q+1)
			}
			if r != 0 {
				used++
			}
			s.reg[i] = r
		}
		if 4+3*used < denseBytes {
			return nil, 0, fmt.Errorf("%w: dense sketch of %d registers: a sparse one is shorter", ErrCorrupt, used)
		}
		return s, denseBytes, nil
	case sketchSparse:
		if len(b) < 4 {
			return nil, 0, fmt.Errorf("%w: sparse sketch: %d bytes, want at least 4", ErrCorrupt, len(b))
		}
		cnt := int(binary.LittleEndian.Uint16(b[2:]))
		end := 4 + 3*cnt
		if end >= denseBytes {
			return nil, 0, fmt.Errorf("%w: sparse sketch: %d registers, a dense sketch is shorter", ErrCorrupt, cnt)
		}
		if len(b) < end {
			return nil, 0, fmt.Errorf("%w: sparse sketch: %d registers need %d bytes, have %d", ErrCorrupt, cnt, end, len(b))
		}
		prev := -1
		for off := 4; off < end; off += 3 {
			idx, r := int(binary.LittleEndian.Uint16(b[off:])), b[off+2]
			if idx <= prev || idx >= Registers {
				return nil, 0, fmt.Errorf("%w: sparse sketch: offset %d: register %d after %d (want increasing, below %d)", ErrCorrupt, off, idx, prev, Registers)
			}
			if r == 0 || r > q+1 {
				return nil, 0, fmt.Errorf("%w: sparse sketch: register %d holds %d, want 1 to %d", ErrCorrupt, idx, r, q+1)
			}
			s.reg[idx], prev = r, idx
		}
		return s, end, nil
	}
	return nil, 0, fmt.Errorf("%w: sketch: unknown kind %d", ErrCorrupt, b[1])
}

// liveSketch is a Sketch that many goroutines add to at once, without a
// lock: four registers per 32-bit word, raised by compare-and-swap.
type liveSketch struct {
	words [Registers / 4]atomic.Uint32
}

// add adds the key hash h. Once a register holds its key's rank (almost
// always, past the first keys) it is one atomic load.
func (s *liveSketch) add(h uint64) {
	idx, rank := slot(h)
	w := &s.words[idx/4]
	shift := (idx % 4) * 8
	for {
		old := w.Load()
		if uint8(old>>shift) >= rank {
			return
		}
		if w.CompareAndSwap(old, old&^(0xff<<shift)|uint32(rank)<<shift) {
			return
		}
	}
}

// raise merges o's registers in.
func (s *liveSketch) raise(o *Sketch) {
	for i, r := range o.reg {
		if r == 0 {
			continue
		}
		w := &s.words[i/4]
		shift := uint(i%4) * 8
		for {
			old := w.Load()
			if uint8(old>>shift) >= r || w.CompareAndSwap(old, old&^(0xff<<shift)|uint32(r)<<shift) {
				break
			}
		}
	}
}

// copyTo stores a copy of the registers in dst.
func (s *liveSketch) copyTo(dst *Sketch) {
	for i := range s.words {
		v := s.words[i].Load()
		dst.reg[4*i], dst.reg[4*i+1], dst.reg[4*i+2], dst.reg[4*i+3] = uint8(v), uint8(v>>8), uint8(v>>16), uint8(v>>24)
	}
}
