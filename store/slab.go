package store

import (
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/freqring/freqring/window"
)

// Size classes: records live in fixed-size slots of the smallest class that
// holds them. Classes step by 2 bytes up to 64 bytes, where the records of
// recipients with a few sends fall (3 sends take 16 to 23 bytes), by 4 bytes
// up to 256 bytes, where almost every record of the default rules falls (a
// slot wastes 0.5 and 1.5 bytes on average), then by about 1/8 up to
// window.MaxRecordBytes.
const (
	tinyStep   = 2
	tinyLimit  = 64 // the largest size of the 2-byte classes
	classStep  = 4
	smallLimit = 256 // the largest size of the 4-byte classes
)

var classSizes = func() []int {
	var s []int
	for size := classStep; size <= tinyLimit; size += tinyStep {
		s = append(s, size)
	}
	for size := tinyLimit + classStep; size <= smallLimit; size += classStep {
		s = append(s, size)
	}
	for size := smallLimit; size < window.MaxRecordBytes; {
		size = min((size+size/8+15)&^15, window.MaxRecordBytes)
		s = append(s, size)
	}
	return s
}()

// classOf[n] is the class of an n-byte record, for n <= smallLimit.
var classOf = func() [smallLimit + 1]uint8 {
	var c [smallLimit + 1]uint8
	k := 0
	for n := range c {
		for classSizes[k] < n {
			k++
		}
		c[n] = uint8(k)
	}
	return c
}()

// smallClasses is the number of classes of at most smallLimit bytes.
var smallClasses = int(classOf[smallLimit]) + 1

// sizeClass returns the smallest class whose slots hold n bytes.
func sizeClass(n int) int {
	if n <= smallLimit {
		return int(classOf[n])
	}
	i, _ := slices.BinarySearch(classSizes[smallClasses:], n) // the first size >= n
	return min(smallClasses+i, len(classSizes)-1)
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
// millions allocates in steps small enough to waste little: each (shard,
// class) leaves about half a chunk unused at its end, 16 KiB at 32 KiB
// chunks, which at 10M recipients in 271 partitions is 3 bytes a recipient.
const (
	minChunkBytes = 1 << 10
	maxChunkBytes = 32 << 10
)

// slab holds the slots of one size class in one shard. Its chunks hold no
// pointers, so the garbage collector never scans them. Not safe for
// concurrent use: the shard's lock guards it.
type slab struct {
	size  int    // bytes per slot
	first uint   // log2 of slots in chunk 0
	grow  uint   // chunks that double before sizes stay constant
	base  uint32 // slots in the doubling chunks: 2^first * (2^grow - 1)
	per   uint32 // slots in each later chunk: maxChunkBytes / size
	magic uint64 // ceil(2^64 / per) (0 for per 1), to divide by per with a multiply
	// chunks[k] is the first byte of chunk k, which holds slots [start(k),
	// start(k+1)); chunk(k) gives its bytes. A pointer, not a slice, so that
	// the table of a slab with many chunks takes a third of the cache lines:
	// every record's lookup reads it.
	chunks []unsafe.Pointer
	next   uint32   // slots handed out so far
	free   []uint32 // released slots, reused first
	// held is the store's heap account (nil: none), to which the slab adds
	// the bytes of the chunks and free-list capacity it allocates (see
	// reserved) and from which trim takes them back. It points into the
	// store's memory, which keeps that alive, and with it the mapping of
	// every block the slab holds (see blocks).
	held *atomic.Int64
	// blocks gives the full-size chunks (nil: the Go heap gives them).
	blocks *blocks
	// ceiling, while a defragmentation is planned (see planDefrag), is the
	// first slot of the chunks it would give back; 0 otherwise. high holds
	// the free slots at or past it meanwhile, which alloc does not hand out.
	ceiling uint32
	high    []uint32
}

func newSlab(size int, held *atomic.Int64, blk *blocks) slab {
	first := uint(bits.Len(uint(max(minChunkBytes/size, 1)))) - 1
	grow := uint(bits.Len(uint(max(maxChunkBytes/(size<<first), 1)))) - 1
	per := uint32(max(maxChunkBytes/size, 1))
	return slab{size: size, first: first, grow: grow, held: held, blocks: blk,
		base: uint32(1<<first) * (1<<grow - 1), per: per, magic: ^uint64(0)/uint64(per) + 1}
}

// addHeld adds d bytes to the heap account held, if there is one.
func addHeld(held *atomic.Int64, d int64) {
	if held != nil && d != 0 {
		held.Add(d)
	}
}

// locate returns the chunk and byte offset of slot i. Chunk k < grow holds
// 2^(first+k) slots starting at 2^first*(2^k-1); later chunks all hold per
// slots, filling maxChunkBytes as nearly as the slot size allows: the
// allocator rounds a large object up to whole 8 KiB pages, so a chunk of a
// power-of-two number of 116-byte slots would waste a tenth of itself.
func (s *slab) locate(i uint32) (chunk, off int) {
	if i >= s.base {
		j := uint64(i - s.base)
		q, _ := bits.Mul64(s.magic, j) // j / per, exact for 32-bit j (Lemire)
		if s.per == 1 {                // magic would be 2^64
			q = j
		}
		return int(s.grow) + int(q), int(j-q*uint64(s.per)) * s.size
	}
	q := uint(i)>>s.first + 1
	k := uint(bits.Len(q)) - 1
	return int(k), (int(i) - (1<<s.first)*(1<<k-1)) * s.size
}

// bytes returns the memory of slot i, which alloc has handed out.
func (s *slab) bytes(i uint32) []byte {
	c, off := s.locate(i)
	return unsafe.Slice((*byte)(unsafe.Add(s.chunks[c], off)), s.size)
}

// chunkLen returns the bytes of chunk k's slots.
func (s *slab) chunkLen(k int) int {
	if uint(k) < s.grow {
		return (1 << (s.first + uint(k))) * s.size
	}
	return int(s.per) * s.size
}

// fromBlocks reports whether alloc asks the store's blocks for chunk k:
// a full-size chunk, when the slab has blocks.
func (s *slab) fromBlocks(k int) bool {
	return uint(k) >= s.grow && s.blocks != nil && s.chunkLen(k) <= blockBytes
}

// chunkCap returns the bytes chunk k takes: a block (blockBytes) for a
// chunk the store's blocks give as one (blocks.get: whether mapped or,
// where mapping fails, from the heap); its slots' bytes otherwise.
func (s *slab) chunkCap(k int) int {
	n := s.chunkLen(k)
	if s.fromBlocks(k) && n >= minBlockUse {
		return blockBytes
	}
	return n
}

// chunk returns chunk k, of len chunkLen(k) and cap chunkCap(k).
func (s *slab) chunk(k int) []byte {
	return unsafe.Slice((*byte)(s.chunks[k]), s.chunkCap(k))[:s.chunkLen(k)]
}

// alloc returns a free slot, growing the slab if it has none.
func (s *slab) alloc() (uint32, error) {
	if i, ok := s.popFree(); ok {
		return i, nil
	}
	if s.next == maxSlots {
		return 0, fmt.Errorf("store: size class of %d bytes holds %d records in one shard, the most it can", s.size, maxSlots)
	}
	i := s.next
	if c, _ := s.locate(i); c == len(s.chunks) {
		var chunk []byte
		if n := s.chunkLen(c); s.fromBlocks(c) {
			chunk = s.blocks.get(n)
		} else {
			chunk = make([]byte, n)
		}
		if len(chunk) != s.chunkLen(c) || cap(chunk) != s.chunkCap(c) {
			panic(fmt.Sprintf("store: chunk %d of the %d-byte class: len %d cap %d, want %d and %d", c, s.size, len(chunk), cap(chunk), s.chunkLen(c), s.chunkCap(c)))
		}
		s.chunks = append(s.chunks, unsafe.Pointer(unsafe.SliceData(chunk)))
		addHeld(s.held, int64(cap(chunk)))
	}
	s.next++
	return i, nil
}

// release returns slot i to the free list.
func (s *slab) release(i uint32) {
	if s.ceiling != 0 && i >= s.ceiling {
		c := cap(s.high)
		s.high = append(s.high, i)
		addHeld(s.held, int64(cap(s.high)-c)*4)
		return
	}
	c := cap(s.free)
	s.free = append(s.free, i)
	addHeld(s.held, int64(cap(s.free)-c)*4)
}

// hasHeldRoom reports whether alloc would hand out a slot without adding to
// what the store holds with its free blocks (memory.over): a free slot, room
// in its chunks, or a next chunk that is a block the store keeps free, taken
// rather than mapped anew. A caller under another partition's lock may take
// that block first; the store then passes its limit by one block.
func (s *slab) hasHeldRoom() bool {
	if len(s.free) > 0 {
		return true
	}
	if s.next == maxSlots {
		return false
	}
	c, _ := s.locate(s.next)
	return c < len(s.chunks) || s.fromBlocks(c) && s.chunkLen(c) >= minBlockUse && s.blocks.hasFree()
}

// inUse returns the slots holding a record: those handed out, less the free
// ones (on the free list, or waiting past a planned ceiling).
func (s *slab) inUse() uint32 { return s.next - uint32(len(s.free)+len(s.high)) }

// start returns the first slot of chunk k.
func (s *slab) start(k int) uint32 {
	if uint(k) < s.grow {
		return uint32(1<<s.first) * (1<<uint(k) - 1)
	}
	return s.base + uint32(k-int(s.grow))*s.per
}

// Defragmentation: a slab keeps every chunk it has carved until it is
// wholly empty, so records that move to other size classes (as their sends
// come and expire) leave their old classes' chunks sparse, and a long-running
// store would hold the highest occupancy each class ever had. When a sweep
// pass starts, planDefrag picks the tail chunks that the slab's records
// would fit without (keeping a quarter chunk of free slots as headroom),
// when they hold at least a full-size chunk's slots, and sets the ceiling at
// their first slot. While the pass walks the index, each record it finds at
// or past the ceiling moves to a free slot below (popFree), and the slots
// freed there wait on high. When the pass ends, finishDefrag gives the tail
// chunks back if no record is left in them; if one is (a record created in
// a fresh slot meanwhile, an entry the walk missed), it puts high back on
// the free list and the next pass tries again.

// planDefrag plans a defragmentation, replacing one still planned, and
// reports whether there is one.
func (s *slab) planDefrag() bool {
	s.abandonDefrag()
	if s.next == 0 {
		return false
	}
	want := s.inUse() + max(s.per/4, 1)
	k := 0
	for k < len(s.chunks) && s.start(k) < want {
		k++
	}
	// At least a whole full-size chunk's slots, counted in slots so that
	// heap and mapped slabs plan alike.
	if k == 0 || k == len(s.chunks) || s.start(len(s.chunks))-s.start(k) < s.per {
		return false
	}
	s.ceiling = s.start(k)
	low := s.free[:0]
	for _, i := range s.free {
		if i < s.ceiling {
			low = append(low, i)
		} else {
			c := cap(s.high)
			s.high = append(s.high, i)
			addHeld(s.held, int64(cap(s.high)-c)*4)
		}
	}
	s.free = low
	return true
}

// popFree takes the last slot of the free list, or reports false when it is
// empty. While a defragmentation is planned, every slot there is below the
// ceiling: alloc's, and those of records the sweep moves down.
func (s *slab) popFree() (uint32, bool) {
	n := len(s.free)
	if n == 0 {
		return 0, false
	}
	i := s.free[n-1]
	s.free = s.free[:n-1]
	return i, true
}

// finishDefrag ends a planned defragmentation: it gives back the chunks at
// or past the ceiling when every slot there is free (to the store's blocks,
// bytes off the heap account), and abandons the plan otherwise.
func (s *slab) finishDefrag() {
	if s.ceiling == 0 {
		return
	}
	if s.next-s.ceiling != uint32(len(s.high)) {
		s.abandonDefrag()
		return
	}
	k := 0
	for s.start(k) < s.ceiling {
		k++
	}
	for j := k; j < len(s.chunks); j++ {
		addHeld(s.held, -int64(s.chunkCap(j)))
		if s.blocks != nil {
			s.blocks.put(s.chunk(j))
		}
		s.chunks[j] = nil
	}
	s.chunks = s.chunks[:k]
	s.next, s.ceiling = s.ceiling, 0
	addHeld(s.held, -int64(cap(s.high))*4)
	s.high = nil
	// The free list held the slots of the chunks given back too.
	if c := cap(s.free); c > 2*len(s.free)+16 {
		s.free = append(make([]uint32, 0, 2*len(s.free)+16), s.free...)
		addHeld(s.held, int64(cap(s.free)-c)*4)
	}
}

// abandonDefrag drops a planned defragmentation, if any: the free slots at
// or past the ceiling go back on the free list, at its bottom, so that
// alloc hands out the slots below the ceiling first and the next plan finds
// the tail chunks still emptying.
func (s *slab) abandonDefrag() {
	if s.ceiling == 0 {
		return
	}
	s.ceiling = 0
	c, n := cap(s.free)+cap(s.high), len(s.free)
	if need := len(s.high) + n; need <= cap(s.free) {
		s.free = s.free[:need]
	} else {
		s.free = append(s.free, make([]uint32, need-n)...)
	}
	copy(s.free[len(s.high):], s.free[:n])
	copy(s.free, s.high)
	s.high = nil
	addHeld(s.held, int64(cap(s.free)-c)*4)
}

// trim gives all the slab's memory back if no slot is in use. Records pass
// through the small classes as they grow and leave them empty; the sweep
// trims them, not release, so that a class in steady use keeps its chunk.
func (s *slab) trim() {
	if s.inUse() == 0 {
		s.drop()
	}
}

// drop gives all the slab's memory back, records and all: its blocks to
// the store's blocks, the bytes to its heap account.
func (s *slab) drop() {
	addHeld(s.held, -s.reserved())
	if s.blocks != nil {
		for k := range s.chunks {
			s.blocks.put(s.chunk(k))
		}
	}
	s.chunks, s.free, s.next = nil, nil, 0
	s.ceiling, s.high = 0, nil
}

// reserved returns the bytes the slab holds, from the heap or in blocks:
// what it has added to its memory account.
func (s *slab) reserved() int64 {
	var n int64
	for k := range s.chunks {
		n += int64(s.chunkCap(k))
	}
	return n + int64(cap(s.free)+cap(s.high))*4
}
