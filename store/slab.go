package store

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/freqring/freqring/window"
)

// Size classes: records live in fixed-size slots of the smallest class that
// holds them. Classes step by 8 bytes up to 256 bytes, where almost every
// record of the default rules falls, then by about 1/8 up to
// window.MaxRecordBytes.
var classSizes = func() []int {
	var s []int
	for size := 8; size <= 256; size += 8 {
		s = append(s, size)
	}
	for size := 256; size < window.MaxRecordBytes; {
		size = min((size+size/8+15)&^15, window.MaxRecordBytes)
		s = append(s, size)
	}
	return s
}()

// classOf[n/8] is the class of an n-byte record, for n <= 256.
var classOf = func() [33]uint8 {
	var c [33]uint8
	for i := range c {
		c[i] = uint8(max(i-1, 0))
	}
	return c
}()

// sizeClass returns the smallest class whose slots hold n bytes.
func sizeClass(n int) int {
	if n <= 256 {
		return int(classOf[(n+7)/8])
	}
	lo, hi := 32, len(classSizes)-1
	for lo < hi {
		m := (lo + hi) / 2
		if classSizes[m] >= n {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// A ref names a slot: class in the top refClassBits bits, slot number below.
type ref uint32

const (
	refClassBits = 7
	refSlotBits  = 32 - refClassBits
	maxSlots     = 1 << refSlotBits // per class per shard: 33M
)

func makeRef(class int, slot uint32) ref { return ref(uint32(class)<<refSlotBits | slot) }
func (r ref) class() int                 { return int(r >> refSlotBits) }
func (r ref) slot() uint32               { return uint32(r) & (maxSlots - 1) }

// Chunk sizes double from minChunkBytes to maxChunkBytes, so that a shard
// with few records of a class spends about a kilobyte on it, and one with
// millions allocates in steps small enough to waste little.
const (
	minChunkBytes = 1 << 10
	maxChunkBytes = 64 << 10
)

// slab holds the slots of one size class in one shard. Its chunks hold no
// pointers, so the garbage collector never scans them. Not safe for
// concurrent use: the shard's lock guards it.
type slab struct {
	size   int      // bytes per slot
	first  uint     // log2 of slots in chunk 0
	grow   uint     // chunks that double before sizes stay constant
	chunks [][]byte // chunk k holds slots [start(k), start(k+1))
	next   uint32   // slots handed out so far
	free   []uint32 // released slots, reused first
	// held is the store's heap account (nil: none), to which the slab adds
	// the bytes of the chunks and free-list capacity it allocates (see
	// reserved) and from which trim takes them back.
	held *atomic.Int64
}

func newSlab(size int, held *atomic.Int64) slab {
	first := uint(bits.Len(uint(max(minChunkBytes/size, 1)))) - 1
	grow := uint(bits.Len(uint(max(maxChunkBytes/(size<<first), 1)))) - 1
	return slab{size: size, first: first, grow: grow, held: held}
}

// addHeld adds d bytes to the heap account held, if there is one.
func addHeld(held *atomic.Int64, d int64) {
	if held != nil && d != 0 {
		held.Add(d)
	}
}

// locate returns the chunk and byte offset of slot i. Chunk k < grow holds
// 2^(first+k) slots starting at 2^first*(2^k-1); later chunks all hold
// 2^(first+grow) slots.
func (s *slab) locate(i uint32) (chunk, off int) {
	q := uint(i)>>s.first + 1
	k := uint(bits.Len(q)) - 1
	if k < s.grow {
		return int(k), (int(i) - (1<<s.first)*(1<<k-1)) * s.size
	}
	base := uint(1<<s.first) * (1<<s.grow - 1)
	per := s.first + s.grow
	j := uint(i) - base
	return int(s.grow + j>>per), int(j&(1<<per-1)) * s.size
}

// bytes returns the slot's memory.
func (s *slab) bytes(i uint32) []byte {
	c, off := s.locate(i)
	return s.chunks[c][off : off+s.size : off+s.size]
}

// alloc returns a free slot, growing the slab if it has none.
func (s *slab) alloc() (uint32, error) {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		return i, nil
	}
	if s.next == maxSlots {
		return 0, fmt.Errorf("store: size class of %d bytes holds %d records in one shard, the most it can", s.size, maxSlots)
	}
	i := s.next
	if c, _ := s.locate(i); c == len(s.chunks) {
		per := uint(1) << (s.first + min(uint(c), s.grow))
		s.chunks = append(s.chunks, make([]byte, per*uint(s.size)))
		addHeld(s.held, int64(per*uint(s.size)))
	}
	s.next++
	return i, nil
}

// release returns slot i to the free list.
func (s *slab) release(i uint32) {
	c := cap(s.free)
	s.free = append(s.free, i)
	addHeld(s.held, int64(cap(s.free)-c)*4)
}

// hasRoom reports whether alloc would hand out a slot without allocating.
func (s *slab) hasRoom() bool {
	if len(s.free) > 0 {
		return true
	}
	if s.next == maxSlots {
		return false
	}
	c, _ := s.locate(s.next)
	return c < len(s.chunks)
}

// trim gives all the slab's memory back if no slot is in use. Records pass
// through the small classes as they grow and leave them empty; the sweep
// trims them, not release, so that a class in steady use keeps its chunk.
func (s *slab) trim() {
	if len(s.free) == int(s.next) {
		addHeld(s.held, -s.reserved())
		s.chunks, s.free, s.next = nil, nil, 0
	}
}

// reserved returns the bytes the slab holds from the heap: what it has
// added to its heap account.
func (s *slab) reserved() int64 {
	var n int64
	for _, c := range s.chunks {
		n += int64(cap(c))
	}
	return n + int64(cap(s.free))*4
}
