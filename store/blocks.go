package store

import (
	"sync"
	"sync/atomic"
)

// blockBytes is the size of a block: a slab chunk of the largest size,
// where nearly every record of a store with millions of recipients lives.
const blockBytes = maxChunkBytes

// regionBytes is the address space blocks maps at a time: 1,024 blocks, 32
// huge pages.
const regionBytes = 64 << 20

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
// cleanup on its heap account), so a slice of a block never outlives its
// mapping. Where mapping fails, or with Config.HeapSlabs, blocks come
// from the Go heap. Safe for concurrent use.
type blocks struct {
	mu      sync.Mutex
	regions [][]byte // mapped, regionBytes each
	used    int      // bytes of the last region handed out
	free    [][]byte // returned blocks, cap blockBytes
	heap    bool     // allocate on the Go heap: mapping is off or failed
	// carved counts the bytes of blocks handed out of regions, in use or
	// free: the mapped memory that has been touched. The rest of a region
	// takes no memory until a block of it is handed out.
	carved atomic.Int64
}

// get returns a zeroed block of len and cap blockBytes.
func (b *blocks) get() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.free); n > 0 {
		c := b.free[n-1]
		b.free[n-1] = nil
		b.free = b.free[:n-1]
		clear(c)
		return c
	}
	if !b.heap && (len(b.regions) == 0 || b.used == regionBytes) {
		r, err := mapRegion(regionBytes)
		if err != nil {
			b.heap = true // and stay there: the kernel refuses
		} else {
			b.regions = append(b.regions, r)
			b.used = 0
		}
	}
	if b.heap {
		return make([]byte, blockBytes)
	}
	r := b.regions[len(b.regions)-1]
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
	}
}

// owns reports whether c lies in a mapped region. b.mu is held.
func (b *blocks) owns(c []byte) bool {
	p := &c[0]
	for _, r := range b.regions {
		if inside(p, r) {
			return true
		}
	}
	return false
}

// release unmaps every region. Nothing may use a block afterwards: it runs
// once the store is unreachable.
func (b *blocks) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.regions {
		unmapRegion(r)
	}
	b.carved.Store(0)
	b.regions, b.free, b.used = nil, nil, 0
}
