package store

import (
	"math/rand/v2"
	"sync/atomic"
	"unsafe"
)

// table is an open-addressing hash index from 64-bit key hashes to slot refs,
// with linear probing and backward-shift deletion (no tombstones). It holds
// no pointers. Key 0 marks an empty entry, so callers never store key 0.
// Several entries may share a key (a 64-bit collision told apart by the
// record's tag); lookups walk them all. Not safe for concurrent use.
type table struct {
	// w holds 3 words per entry: key low, key high, ref. Keeping an entry's
	// key and ref together costs one cache miss per lookup, not two.
	w    []uint32
	len  int    // entries the table can hold
	n    int    // entries in use
	seed uint64 // mixed into homes, drawn anew for every table (see home)
	// held is the store's heap account (nil: none), to which resize adds
	// the difference between the new and the old entry arrays (see bytes).
	held *atomic.Int64
	// blk provides the entry arrays: large ones mapped outside the Go heap
	// (see blocks.getTable); nil takes them all from the heap.
	blk *blocks
}

func (t *table) key(i int) uint64    { return uint64(t.w[3*i]) | uint64(t.w[3*i+1])<<32 }
func (t *table) ref(i int) ref       { return ref(t.w[3*i+2]) }
func (t *table) setRef(i int, r ref) { t.w[3*i+2] = uint32(r) }
func (t *table) set(i int, k uint64, r ref) {
	e := t.w[3*i : 3*i+3 : 3*i+3]
	e[0], e[1], e[2] = uint32(k), uint32(k>>32), uint32(r)
}

const (
	minTableLen = 16
	maxLoad     = 0.85 // grow past this fill; probes stay short for uniform hashes
	// A full table grows by a quarter, so that its fill stays in [0.68,
	// 0.85]: growing by half would leave a third of the index empty after
	// each step, and at 100M recipients each empty entry is 12 bytes.
	growBy = 4 // grow by len/growBy
)

// home returns the first slot to probe for key h: h mixed with the table's
// seed, then scaled to the length by a multiply-shift (so lengths need not be
// powers of two). The seed matters: entries copied from one table to another
// (a resize, a snapshot load) arrive in the first table's home order, and
// without a fresh seed they would arrive in the second's too, piling up into
// one probe run as long as the table.
func (t *table) home(h uint64) int {
	m := (h ^ t.seed) * 0x9e3779b97f4a7c15
	return int(m >> 32 * uint64(t.len) >> 32)
}

// find returns the position of the next entry whose key is h, probing from
// position from (-1 means h's home), or -1 when there is none. Pass pos+1 to
// continue after an entry at pos.
func (t *table) find(h uint64, from int) int {
	if t.len == 0 {
		return -1
	}
	i := from
	if i < 0 {
		i = t.home(h)
	} else if i == t.len {
		i = 0
	}
	for {
		k := t.key(i)
		if k == h {
			return i
		}
		if k == 0 {
			return -1
		}
		if i++; i == t.len {
			i = 0
		}
	}
}

// prefetchHome prefetches the entry at which the probe for key h starts.
func (t *table) prefetchHome(h uint64) {
	if t.len > 0 {
		prefetch(unsafe.Pointer(&t.w[3*t.home(h)]))
	}
}

// insert adds an entry for h; the caller has checked that none matches.
func (t *table) insert(h uint64, r ref) {
	if !t.hasRoom() {
		t.resize(max(minTableLen, t.len+t.len/growBy))
	}
	i := t.home(h)
	for t.key(i) != 0 {
		if i++; i == t.len {
			i = 0
		}
	}
	t.set(i, h, r)
	t.n++
}

// remove deletes the entry at pos and shifts later entries of its probe run
// back, so that every remaining entry stays reachable from its home.
func (t *table) remove(pos int) {
	n := t.len
	i := pos
	for j := i + 1; ; j++ {
		if j == n {
			j = 0
		}
		k := t.key(j)
		if k == 0 {
			break
		}
		// Move entry j to the hole at i unless its home lies cyclically in (i, j].
		h := t.home(k)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.set(i, k, t.ref(j))
			i = j
		}
	}
	t.set(i, 0, 0)
	t.n--
}

// shrink resizes a table that mass expiry left mostly empty to about half
// full. It moves entries, so callers hold no positions across it.
func (t *table) shrink() {
	if t.len > 4*minTableLen && t.n < t.len/8 {
		t.resize(max(minTableLen, 2*t.n))
	}
}

// writtenSlice returns a new slice of n zero values whose memory has been
// written once. Tables the store fills by probing (an index, a cache of
// request ids) would otherwise read fresh pages before writing them: the
// read maps the kernel's shared zero page, and the write after it replaces
// that mapping, which flushes the TLB of every CPU the process runs on, by
// an interrupt to each. Written first, a page is mapped once.
func writtenSlice[T any](n int) []T {
	s := make([]T, n)
	clear(s)
	return s
}

// resize replaces the table with one of n slots holding the same entries,
// under a new seed.
func (t *table) resize(n int) {
	old := *t
	*t = table{w: old.blk.getTable(3 * n), len: n, seed: rand.Uint64(), held: old.held, blk: old.blk}
	addHeld(t.held, t.bytes()-old.bytes())
	for i := range old.len {
		if k := old.key(i); k != 0 {
			t.insert(k, old.ref(i))
		}
	}
	old.blk.putTable(old.w)
}

// free gives the table's entry array back and leaves it empty, holding
// nothing; the caller takes its bytes off the heap account.
func (t *table) free() {
	t.blk.putTable(t.w)
	t.w, t.len, t.n = nil, 0, 0
}

// hasRoom reports whether insert would add an entry without resizing.
func (t *table) hasRoom() bool { return float64(t.n+1) <= maxLoad*float64(t.len) }

// reserve grows the table to hold n more entries below maxLoad, with room
// for a few more (1/32), as a restart that loads a snapshot needs.
func (t *table) reserve(n int) {
	if need := int(float64(t.n+n)/maxLoad) + 1; need > t.len {
		t.resize(max(minTableLen, need+need/32))
	}
}

// bytes returns the heap the table holds.
func (t *table) bytes() int64 { return int64(cap(t.w)) * 4 }
