package store

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/freqring/freqring/window"
)

// idCache remembers the request ids of recorded items, so that a retried
// item is answered from its first decision instead of being recorded again.
// An id is remembered for the horizon after its decision, unless more than
// capacity ids fall within one horizon: then the oldest are forgotten sooner
// (evicted, and counted), and at least the capacity/2 newest are kept. Past
// the store's memory limit the table does not grow: a rebuild keeps the
// newest ids that fit its size (3/8 of its slots), evicting the others.
// Keys mix the id with the recipient's key hash: the same id sent for two
// recipients is two entries. Each id keeps the fingerprint of its item
// (idPrint), so that an id reused for another item is told from a retry.
//
// The ids sit in one open-addressing table of pointer-free slots with linear
// probing: the lookup of a new id, the common case, reads one cache line or
// two, allocates nothing, and the collector does not scan the table. A slot
// whose id is past the horizon is dead: lookups pass over it until the
// table is rebuilt with its live ids only (see rebuild), which a put does
// when the used slots would pass three quarters of the table or capacity.
// Not safe for concurrent use: the partition's lock guards it.
type idCache struct {
	slots   []idSlot // len 0 or at least minIDSlots
	used    int      // slots not empty: live or dead
	evicted int64    // ids forgotten before the horizon because the cache held capacity
	// held is the store's heap account (nil: none); acct is what the cache
	// has added to it: the table's bytes.
	held *atomic.Int64
	acct int64
	// mem is the store's memory account, whose limit the table does not
	// grow past (nil: no limit).
	mem *memory
}

// idSlot is one slot of an idCache: an id's mixed key and its entry.
type idSlot struct {
	key uint64 // mixed key (idKey) folded by idSlotKey; 0 marks an empty slot
	idEntry
}

const (
	// idSlotBytes is the heap one slot takes. A remembered id costs 2 to
	// 2.5 slots right after a rebuild and 1.33 when the next is due; a
	// cache takes at most 1.75*capacity slots (a reused table is one made
	// before).
	idSlotBytes = int64(unsafe.Sizeof(idSlot{}))
	minIDSlots  = 16
)

// idSlotKey folds mixed key 0, which marks an empty slot, into 1: two mixed
// keys that differ in one bit of 64 are then one id, as two that are equal
// already are.
func idSlotKey(k uint64) uint64 { return max(k, 1) }

// home returns the first slot to probe for folded key k, by a multiply-shift
// to the table's length.
func (c *idCache) home(k uint64) int {
	return int((k * 0xbf58476d1ce4e5b9) >> 32 * uint64(len(c.slots)) >> 32)
}

// find returns the slot holding folded key k, live or dead, and true; or
// the empty slot that ends k's probe run, where a put of k goes, and false;
// or -1 and false in a table not made yet. The table is never full, so
// every run ends at an empty slot.
func (c *idCache) find(k uint64) (int, bool) {
	if len(c.slots) == 0 {
		return -1, false
	}
	for i := c.home(k); ; {
		switch c.slots[i].key {
		case k:
			return i, true
		case 0:
			return i, false
		}
		if i++; i == len(c.slots) {
			i = 0
		}
	}
}

// get returns a remembered id's entry.
func (c *idCache) get(k uint64, now, horizon int64) (idEntry, bool) {
	if i, ok := c.find(idSlotKey(k)); ok && now-c.slots[i].at < horizon {
		return c.slots[i].idEntry, true
	}
	return idEntry{}, false
}

// put remembers k as decided at at, for an item of print p: in k's slot if
// it has one (a refunded id decided again), else in a new one, after a
// rebuild if the table is at its limit.
func (c *idCache) put(k uint64, at int64, p idPrint, now, horizon int64, capacity int) {
	k = idSlotKey(k)
	i, ok := c.find(k)
	if !ok && c.used+1 > min(len(c.slots)*3/4, capacity) {
		c.rebuild(now, horizon, capacity, c.mem != nil && c.mem.over())
		i, ok = c.find(k)
	}
	if !ok {
		c.used++
	}
	c.slots[i] = idSlot{key: k, idEntry: idEntry{at: at, idPrint: p}}
}

// idAgeBins is the number of age ranges rebuild sorts live ids into to find
// the oldest.
const idAgeBins = 64

// rebuild replaces the table with one that holds its live ids (younger than
// horizon at now) in twice as many slots (up to a quarter more when it
// reuses the table), and at least minIDSlots. When more
// than 7/8 of capacity are live, it keeps only the capacity/2 youngest (ids
// decided in the same millisecond at the limit are kept in slot order) in
// 4*capacity/3 slots and counts the others evicted, so that a full cache is
// rebuilt once per capacity/2 puts, in place. With atLimit (the store is at
// its memory limit) the table keeps its size (at least minIDSlots) and the
// 3/8 of it youngest, so that the next rebuild is as many puts away.
func (c *idCache) rebuild(now, horizon int64, capacity int, atLimit bool) {
	bin := func(at int64) int { return int(max(0, now-at) * idAgeBins / horizon) }
	var bins [idAgeBins]int
	live := 0
	for i := range c.slots {
		if sl := &c.slots[i]; sl.key != 0 && now-sl.at < horizon {
			bins[bin(sl.at)]++
			live++
		}
	}
	keep, size := live, 2*live
	if live*8 > capacity*7 {
		keep, size = capacity/2, capacity*4/3+1
	}
	if most := max(minIDSlots, len(c.slots)); atLimit && size > most {
		keep, size = min(keep, most*3/8), most
	}
	// Ids younger than cut are kept, and room of those decided at cut. Age
	// ranges narrow the search: only the range where keep is reached is
	// sorted.
	cut, room := int64(math.MinInt64), 0
	for b, kept := 0, 0; b < idAgeBins; b++ {
		if kept+bins[b] <= keep {
			kept += bins[b]
			continue
		}
		ats := make([]int64, 0, bins[b])
		for i := range c.slots {
			if sl := &c.slots[i]; sl.key != 0 && now-sl.at < horizon && bin(sl.at) == b {
				ats = append(ats, sl.at)
			}
		}
		slices.Sort(ats)
		slices.Reverse(ats) // youngest first
		// The room-th youngest of this range is the cut; room is then
		// what is left for the ids decided at cut.
		room = keep - kept
		cut = ats[max(room-1, 0)]
		room -= countAbove(ats, cut)
		break
	}
	// The kept ids go to a new table, or back into this one when it has the
	// size wanted or up to a quarter more (a cache whose load holds steady,
	// rebuilt as often as ids expire), through a pooled buffer instead of a
	// new table each time.
	old := c.slots
	if size = max(minIDSlots, size); size <= len(c.slots) && len(c.slots) <= size+size/4 {
		buf := idBuffers.Get().(*[]idSlot)
		defer idBuffers.Put(buf)
		*buf = append((*buf)[:0], c.slots...)
		old = *buf
		clear(c.slots)
	} else {
		c.slots = writtenSlice[idSlot](size)
	}
	c.used = 0
	for i := range old {
		sl := &old[i]
		if sl.key == 0 || now-sl.at >= horizon {
			continue
		}
		if sl.at < cut || sl.at == cut && room == 0 {
			c.evicted++
			continue
		} else if sl.at == cut {
			room--
		}
		j, _ := c.find(sl.key)
		c.slots[j] = *sl
		c.used++
	}
	c.account()
}

// idBuffers holds the buffers through which rebuild rehashes a table in
// place.
var idBuffers = sync.Pool{New: func() any { return new([]idSlot) }}

// countAbove returns how many of ats are above t.
func countAbove(ats []int64, t int64) int {
	n := 0
	for _, at := range ats {
		if at > t {
			n++
		}
	}
	return n
}

// account brings the cache's share of its heap account up to date.
func (c *idCache) account() {
	want := int64(len(c.slots)) * idSlotBytes
	addHeld(c.held, want-c.acct)
	c.acct = want
}

// idEntry is a remembered id: when its item was decided, what it was, and
// whether its send was refunded (taken back by Refund or Unrecord).
type idEntry struct {
	at int64 // decision time, unix ms
	idPrint
	refunded bool
}

// idPrint is what an id's item was. A zero field is unknown and matches
// anything: ids merged from images carry no print, and the WAL carries no
// mode.
type idPrint struct {
	content uint32 // low bits of the content hash, | 1 (so never 0 when known)
	cost    uint16 // 1 to window.MaxCost
	mode    uint8  // 1 + window.Mode
}

// printOf returns the print of it, with its mode unknown unless withMode.
func printOf(it window.Item, withMode bool) idPrint {
	p := idPrint{content: uint32(it.Content) | 1, cost: uint16(it.Cost)}
	if withMode {
		p.mode = 1 + uint8(it.Mode)
	}
	return p
}

// mismatch names the first field in which p, the print of a new item, and
// q, the print remembered with its id, are known to differ; "" if none.
func (p idPrint) mismatch(q idPrint) string {
	switch {
	case p.content != 0 && q.content != 0 && p.content != q.content:
		return "contents"
	case p.cost != 0 && q.cost != 0 && p.cost != q.cost:
		return fmt.Sprintf("costs (first %d, now %d)", q.cost, p.cost)
	case p.mode != 0 && q.mode != 0 && p.mode != q.mode:
		return fmt.Sprintf("modes (first %v, now %v)", window.Mode(q.mode-1), window.Mode(p.mode-1))
	}
	return ""
}

// idKey mixes a request id with the recipient's key hash.
func idKey(id, key uint64) uint64 { return id ^ key*0x9e3779b97f4a7c15 }

// markRefunded notes that k's send was refunded; it reports whether k is
// remembered (live or dead).
func (c *idCache) markRefunded(k uint64) bool {
	i, ok := c.find(idSlotKey(k))
	if !ok {
		return false
	}
	c.slots[i].refunded = true
	return true
}

// len returns the slots in use: the ids remembered, and those past the
// horizon that no rebuild has dropped yet.
func (c *idCache) len() int { return c.used }

// unrefunded yields the ids whose send was not refunded, live or dead:
// those an image carries.
func (c *idCache) unrefunded(yield func(*idSlot) bool) {
	for i := range c.slots {
		if sl := &c.slots[i]; sl.key != 0 && !sl.refunded && !yield(sl) {
			return
		}
	}
}
