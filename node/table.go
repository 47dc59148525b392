package node

// table is an open-addressing hash index from 64-bit key hashes to slot refs,
// with linear probing and backward-shift deletion (no tombstones). It holds
// no pointers. Key 0 marks an empty entry, so callers never store key 0.
// Several entries may share a key (a 64-bit collision told apart by the
// record's tag); lookups walk them all. Not safe for concurrent use.
type table struct {
	keys []uint64
	refs []ref
	n    int // entries in use
}

const (
	minTableLen = 16
	maxLoad     = 0.85 // grow past this fill; probes stay short for uniform hashes
)

// home returns the first slot to probe for key h: a multiply-shift of its low
// 32 bits, so table lengths need not be powers of two.
func (t *table) home(h uint64) int { return int(uint64(uint32(h)) * uint64(len(t.keys)) >> 32) }

// find returns the position of the next entry whose key is h, probing from
// position from (-1 means h's home), or -1 when there is none. Pass pos+1 to
// continue after an entry at pos.
func (t *table) find(h uint64, from int) int {
	if len(t.keys) == 0 {
		return -1
	}
	i := from
	if i < 0 {
		i = t.home(h)
	} else if i == len(t.keys) {
		i = 0
	}
	for {
		k := t.keys[i]
		if k == h {
			return i
		}
		if k == 0 {
			return -1
		}
		if i++; i == len(t.keys) {
			i = 0
		}
	}
}

// insert adds an entry for h; the caller has checked that none matches.
func (t *table) insert(h uint64, r ref) {
	if float64(t.n+1) > maxLoad*float64(len(t.keys)) {
		t.resize(max(minTableLen, len(t.keys)+len(t.keys)/2))
	}
	i := t.home(h)
	for t.keys[i] != 0 {
		if i++; i == len(t.keys) {
			i = 0
		}
	}
	t.keys[i], t.refs[i] = h, r
	t.n++
}

// remove deletes the entry at pos and shifts later entries of its probe run
// back, so that every remaining entry stays reachable from its home.
func (t *table) remove(pos int) {
	n := len(t.keys)
	i := pos
	for j := i + 1; ; j++ {
		if j == n {
			j = 0
		}
		k := t.keys[j]
		if k == 0 {
			break
		}
		// Move entry j to the hole at i unless its home lies cyclically in (i, j].
		h := t.home(k)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.keys[i], t.refs[i] = k, t.refs[j]
			i = j
		}
	}
	t.keys[i], t.refs[i] = 0, 0
	t.n--
}

// shrink resizes a table that mass expiry left mostly empty to about half
// full. It moves entries, so callers hold no positions across it.
func (t *table) shrink() {
	if len(t.keys) > 4*minTableLen && t.n < len(t.keys)/8 {
		t.resize(max(minTableLen, 2*t.n))
	}
}

func (t *table) resize(n int) {
	old := *t
	t.keys, t.refs, t.n = make([]uint64, n), make([]ref, n), 0
	for i, k := range old.keys {
		if k != 0 {
			t.insert(k, old.refs[i])
		}
	}
}

// bytes returns the heap the table holds.
func (t *table) bytes() int64 { return int64(cap(t.keys))*8 + int64(cap(t.refs))*4 }
