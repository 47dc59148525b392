package store

import (
	"fmt"
	"sync/atomic"

	"github.com/freqring/freqring/window"
)

// idCache remembers the request ids of recorded items, so that a retried
// item is answered from its first decision instead of being recorded again.
// It keeps two generations of maps: a lookup checks both, and the current
// generation becomes the previous one when it is horizon/2 old or holds its
// share of the capacity, so an id is remembered for at least horizon/2 and
// at most horizon (less under a load above capacity/horizon ids per second,
// which Stats counts as early rotations). Keys mix the id with the
// recipient's key hash: the same id sent for two recipients is two entries.
// Each id keeps the fingerprint of its item (idPrint), so that an id reused
// for another item is told from a retry. Maps of pointer-free values hold no
// pointers, so the collector does not scan them. Not safe for concurrent
// use: the shard's lock guards it.
type idCache struct {
	cur, prev map[uint64]idEntry // mixed key -> entry
	curStart  int64              // unix ms when cur became current
	early     int64              // rotations forced by capacity before horizon/2
	hint      int                // the size cur was made for
	// held is the store's heap account (nil: none); acct is what the cache
	// has added to it (see account).
	held *atomic.Int64
	acct int64
}

// idBytes is the heap one remembered id costs, as measured for a
// map[uint64]idEntry (Go 1.26's swiss tables): 53 bytes an entry in a map
// filled to the 1024 entries it was made for, 35 to 55 beyond as it doubles.
const idBytes = 55

// account brings the cache's share of its heap account up to date: idBytes
// for every entry of each generation, or for every entry the generation was
// made for if more, counted in steps of 64 entries so that most puts touch
// no shared counter.
func (c *idCache) account() {
	gen := func(m map[uint64]idEntry) int64 {
		if m == nil {
			return 0
		}
		return (int64(max(len(m), c.hint)) + 63) &^ 63
	}
	want := idBytes * (gen(c.cur) + gen(c.prev))
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

// rotate starts a new generation if the current one is too old or too full.
func (c *idCache) rotate(now, horizon int64, capacity int) {
	full := len(c.cur) >= capacity/2
	if c.cur != nil && now-c.curStart < horizon/2 && !full {
		return
	}
	if full && now-c.curStart < horizon/2 {
		c.early++
	}
	if now-c.curStart >= horizon {
		c.prev = nil // both generations are past the horizon
	} else {
		c.prev = c.cur
	}
	c.hint = min(capacity/2, 1024)
	c.cur = make(map[uint64]idEntry, c.hint)
	c.curStart = now
}

// get returns a remembered id's entry.
func (c *idCache) get(k uint64, now, horizon int64) (idEntry, bool) {
	if e, ok := c.cur[k]; ok && now-e.at < horizon {
		return e, true
	}
	if e, ok := c.prev[k]; ok && now-e.at < horizon {
		return e, true
	}
	return idEntry{}, false
}

// put remembers k as decided at at, for an item of print p.
func (c *idCache) put(k uint64, at int64, p idPrint, now, horizon int64, capacity int) {
	c.rotate(now, horizon, capacity)
	c.cur[k] = idEntry{at: at, idPrint: p}
	c.account()
}

// markRefunded notes that k's send was refunded; it reports whether k is
// remembered.
func (c *idCache) markRefunded(k uint64) bool {
	for _, m := range []map[uint64]idEntry{c.cur, c.prev} {
		if e, ok := m[k]; ok {
			e.refunded = true
			m[k] = e
			return true
		}
	}
	return false
}

func (c *idCache) len() int { return len(c.cur) + len(c.prev) }

// unrefunded counts the ids whose send was not refunded: those an image
// carries.
func (c *idCache) unrefunded() int {
	n := 0
	for _, gen := range []map[uint64]idEntry{c.prev, c.cur} {
		for _, e := range gen {
			if !e.refunded {
				n++
			}
		}
	}
	return n
}
