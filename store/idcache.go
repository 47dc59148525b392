package store

// idCache remembers the request ids of recorded items, so that a retried
// item is answered from its first decision instead of being recorded again.
// It keeps two generations of maps: a lookup checks both, and the current
// generation becomes the previous one when it is horizon/2 old or holds its
// share of the capacity, so an id is remembered for at least horizon/2 and
// at most horizon (less under a load above capacity/horizon ids per second,
// which Stats counts as early rotations). Keys mix the id with the
// recipient's key hash: the same id sent for two recipients is two entries.
// Maps of integers hold no pointers, so the collector does not scan them.
// Not safe for concurrent use: the shard's lock guards it.
type idCache struct {
	cur, prev map[uint64]int64 // mixed key -> decision time, unix ms
	curStart  int64            // unix ms when cur became current
	early     int64            // rotations forced by capacity before horizon/2
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
	c.cur = make(map[uint64]int64, min(capacity/2, 1024))
	c.curStart = now
}

// get returns the decision time of a remembered id.
func (c *idCache) get(k uint64, now, horizon int64) (int64, bool) {
	if at, ok := c.cur[k]; ok && now-at < horizon {
		return at, true
	}
	if at, ok := c.prev[k]; ok && now-at < horizon {
		return at, true
	}
	return 0, false
}

// put remembers k as decided at at.
func (c *idCache) put(k uint64, at, now, horizon int64, capacity int) {
	c.rotate(now, horizon, capacity)
	c.cur[k] = at
}

func (c *idCache) len() int { return len(c.cur) + len(c.prev) }
