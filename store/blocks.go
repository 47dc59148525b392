package store

import (
	"os"
	"sync"
	"sync/atomic"
	"unsafe"
)

// blockBytes is the size of a block: a slab chunk of the largest size,
// where nearly every record of a store with millions of recipients lives.
const blockBytes = maxChunkBytes

// minBlockUse is the smallest chunk that takes a block: classes whose
// chunks fill less than 7/8 of a block (records of several KiB, rare) stay
// on the heap rather than waste the rest of it.
const minBlockUse = blockBytes / 8 * 7

// regionBytes is the address space blocks maps at a time: 2,048 blocks, 32
// huge pages.
const regionBytes = 64 << 20

// hugePageBytes is the transparent huge page size on amd64 and arm64 with
// 4 KiB base pages; regions start on one.
const hugePageBytes = 2 << 20

// blocks hands out a store's full-size slab chunks (blockBytes each) from
// memory it maps itself, outside the Go heap, advised for transparent huge
// pages before anything touches it (madvise MADV_HUGEPAGE, which takes
// effect where the kernel's mode is madvise or always). On the Go heap a
// kernel in madvise mode, the usual default, backs records with 4 KiB
// pages, and at 100M recipients nearly every check misses the TLB. Smaller
// chunks stay on the Go heap: a few per size class per space.
//
// A returned block is zeroed and reused before anything new is mapped.
// Mapped memory is unmapped only when the store becomes unreachable (a
// cleanup on its memory account), so a slice of a block never outlives its
// mapping. Where mapping fails, or with Config.HeapSlabs, chunks come from
// the Go heap. Safe for concurrent use.
type blocks struct {
	heap atomic.Bool // allocate on the Go heap: mapping is off or failed

	mu      sync.Mutex
	regions []mapping // regionBytes each
	used    int       // bytes of the last region handed out
	free    [][]byte  // returned blocks, cap blockBytes
	// carved counts the bytes of blocks handed out of regions, in use or
	// free: the mapped memory that has been touched. The rest of a region
	// takes no memory until a block of it is handed out.
	carved atomic.Int64
	// freeBytes counts the bytes of the blocks in free: memory the store
	// holds for reuse that no slab accounts for.
	freeBytes atomic.Int64

	// tables are the index tables mapped one each (see getTable), by the
	// address of their first entry; tableBytes counts their mapped bytes.
	tables     map[*uint32]mapping
	tableBytes atomic.Int64
}

// tableMinBytes is the smallest index table getTable maps rather than take
// from the Go heap: a huge page. At 100M recipients in 271 partitions each
// table is about 6 MiB, 1.5 GB in all, pointer-free; on the heap the
// collector lets the heap grow past what is live by as much again (its goal
// is twice what is live), so those bytes would be resident twice. Smaller
// tables stay on the heap: mapped with 4 KiB pages, one mapping each, they
// measured 10% slower a decision at 10M recipients (550 KiB tables).
const tableMinBytes = hugePageBytes

// getTable returns n zeroed words for an index table, each page written
// once (see writtenSlice): mapped, in a mapping of its own that starts on a
// huge page and is advised for transparent huge pages but for its last,
// partial one, when that is at least tableMinBytes and mapping works, else
// from the Go heap.
func (b *blocks) getTable(n int) []uint32 {
	size := n * 4
	if b == nil || size < tableMinBytes || b.heap.Load() {
		return writtenSlice[uint32](n)
	}
	page := os.Getpagesize()
	m, err := mapAligned((size+page-1)/page*page, hugePageBytes, size/hugePageBytes*hugePageBytes)
	if err != nil {
		return writtenSlice[uint32](n)
	}
	w := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(m.aligned))), n)
	clear(w)
	b.mu.Lock()
	if b.tables == nil {
		b.tables = make(map[*uint32]mapping)
	}
	b.tables[&w[0]] = m
	b.mu.Unlock()
	b.tableBytes.Add(int64(len(m.aligned)))
	return w
}

// putTable takes back a table getTable returned, which nothing uses any
// more: a mapped one is unmapped, one from the heap left to the collector.
func (b *blocks) putTable(w []uint32) {
	if b == nil || len(w) == 0 {
		return
	}
	b.mu.Lock()
	m, ok := b.tables[&w[0]]
	delete(b.tables, &w[0])
	b.mu.Unlock()
	if ok {
		b.tableBytes.Add(-int64(len(m.aligned)))
		unmapRegion(m.whole)
	}
}

// get returns a zeroed chunk of n bytes, n <= blockBytes. When n >=
// minBlockUse that is a block, of cap blockBytes: mapped when mapping
// works, else from the Go heap (the allocator rounds such a chunk up to
// whole pages anyway). A smaller chunk comes from the Go heap, of cap n.
func (b *blocks) get(n int) []byte {
	if n < minBlockUse {
		return make([]byte, n)
	}
	if b.heap.Load() {
		return make([]byte, n, blockBytes)
	}
	c := b.take()
	if c == nil {
		return make([]byte, n, blockBytes)
	}
	return c[:n]
}

// hasFree reports whether take has a free block to hand out without
// mapping more. Safe for concurrent use: another caller may take it first.
func (b *blocks) hasFree() bool { return b.freeBytes.Load() > 0 }

// take returns a zeroed block, nil if mapping fails.
func (b *blocks) take() []byte {
	b.mu.Lock()
	if k := len(b.free); k > 0 {
		c := b.free[k-1]
		b.free[k-1] = nil
		b.free = b.free[:k-1]
		b.freeBytes.Add(-blockBytes)
		b.mu.Unlock()
		clear(c) // nothing else holds c: zero it outside the lock
		return c
	}
	defer b.mu.Unlock()
	if len(b.regions) == 0 || b.used == regionBytes {
		m, err := mapAligned(regionBytes, hugePageBytes, regionBytes)
		if err != nil {
			b.heap.Store(true) // and stay there: the kernel refuses
			return nil
		}
		b.regions = append(b.regions, m)
		b.used = 0
	}
	r := b.regions[len(b.regions)-1].aligned
	c := r[b.used : b.used+blockBytes : b.used+blockBytes]
	b.used += blockBytes
	b.carved.Add(blockBytes)
	return c
}

// put takes back chunk c, which nothing uses any more: a block get handed
// out goes to the free list; anything else is left to the garbage
// collector.
func (b *blocks) put(c []byte) {
	if cap(c) != blockBytes {
		return
	}
	c = c[:blockBytes]
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.owns(c) {
		b.free = append(b.free, c)
		b.freeBytes.Add(blockBytes)
	}
}

// owns reports whether c lies in a mapped region. b.mu is held.
func (b *blocks) owns(c []byte) bool {
	p := &c[0]
	for _, m := range b.regions {
		if inside(p, m.aligned) {
			return true
		}
	}
	return false
}

// release unmaps every region and every mapped table. Nothing may use a
// block or a table afterwards: it runs once the store is unreachable.
func (b *blocks) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.regions {
		unmapRegion(m.whole)
	}
	for _, m := range b.tables {
		unmapRegion(m.whole)
	}
	b.carved.Store(0)
	b.freeBytes.Store(0)
	b.tableBytes.Store(0)
	b.regions, b.free, b.used, b.tables = nil, nil, 0, nil
}
