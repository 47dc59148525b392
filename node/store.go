package node

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/freqring/freqring/window"
)

// store holds the records of one domain, sharded by key hash with one lock
// per shard. Records live in pointer-free slabs and the index maps key hashes
// to slots, so the garbage collector's work does not grow with the number of
// recipients. A store is safe for concurrent use.
type store struct {
	domain *window.Domain
	shift  uint // shard = key >> shift
	shards []shard

	idHorizon int64 // ms a recorded request id is remembered
	idCap     int   // ids one shard remembers at most
}

// shard is one lock's worth of a store.
type shard struct {
	mu         sync.Mutex     // guards every field below
	index      table          // key hash -> slot
	slabs      []slab         // per size class
	scratch    window.Scratch // working memory of window.Apply
	seq        uint64         // sends recorded in this shard, ever; numbers each one for the WAL
	records    int64          // entries in index
	collisions int64          // records created for a key whose hash matched another recipient's
	expired    int64          // records reclaimed by sweep
	ids        idCache        // request ids of recorded items
	_          [64]byte       // keep neighbouring shards' locks off one cache line
}

func newStore(d *window.Domain, shards int, idHorizon int64, idCapacity int) *store {
	// shards is a power of two; with one shard, key >> 64 is 0.
	st := &store{domain: d, shift: uint(64 - bits.Len(uint(shards-1))), shards: make([]shard, shards),
		idHorizon: idHorizon, idCap: max(2, idCapacity/shards)}
	for i := range st.shards {
		st.shards[i].slabs = make([]slab, len(classSizes))
		for c, size := range classSizes {
			st.shards[i].slabs[c] = newSlab(size)
		}
	}
	return st
}

func (st *store) shardOf(key uint64) *shard { return &st.shards[key>>st.shift] }

// apply decides it for the recipient with key hash key and verifier tag at
// time now (unix ms), recording it if the decision says so. A recorded
// item gets seq, its shard's next sequence number (0 if not recorded).
//
// A nonzero id that the store recorded for this recipient within its
// horizon makes it a duplicate: nothing is recorded, and dec is the first
// decision (admitted, recorded, at its time) with per-rule counts as of now.
func (st *store) apply(key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (seq uint64, dup bool, err error) {
	key = storedKey(key)
	sh := st.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	pos, rec, other := sh.lookup(key, tag)
	if id != 0 && it.Mode != window.Peek {
		if at, ok := sh.ids.get(idKey(id, key), now, st.idHorizon); ok {
			peek := it
			peek.Mode = window.Peek
			if _, err := st.domain.Apply(&sh.scratch, rec, tag, now, peek, dec); err != nil {
				return 0, false, err
			}
			dec.Admitted, dec.Recorded, dec.DeniedBy, dec.RetryAfter, dec.At = true, true, -1, 0, at
			for i := range dec.NumRules {
				dec.Rules[i].RetryAfter = 0
			}
			return 0, true, nil
		}
	}
	out, err := st.domain.Apply(&sh.scratch, rec, tag, now, it, dec)
	if err != nil || out == nil {
		return 0, false, err
	}
	if err := sh.put(key, pos, out, other); err != nil {
		dec.Recorded = false
		return 0, false, err
	}
	if id != 0 {
		sh.ids.put(idKey(id, key), dec.At, now, st.idHorizon, st.idCap)
	}
	sh.seq++
	return sh.seq, false, nil
}

// insert records it as sent at time at without deciding (window.Insert), for
// replaying the write-ahead log, and raises the shard's sequence number to
// seq if it is below. A nonzero id is remembered as of now (unix ms).
func (st *store) insert(key uint64, tag uint16, at int64, it window.Item, seq, id uint64, now int64) error {
	key = storedKey(key)
	sh := st.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.seq = max(sh.seq, seq)
	if id != 0 && now-at < st.idHorizon {
		sh.ids.put(idKey(id, key), at, now, st.idHorizon, st.idCap)
	}
	pos, rec, other := sh.lookup(key, tag)
	out, err := st.domain.Insert(&sh.scratch, rec, tag, at, it)
	if err != nil || out == nil {
		return err
	}
	return sh.put(key, pos, out, other)
}

// raiseSeq raises the sequence number of key's shard to seq if it is below.
func (st *store) raiseSeq(key, seq uint64) {
	sh := st.shardOf(storedKey(key))
	sh.mu.Lock()
	sh.seq = max(sh.seq, seq)
	sh.mu.Unlock()
}

// storedKey maps key hash 0, which marks empty index entries, to 1.
func storedKey(key uint64) uint64 { return max(key, 1) }

// lookup returns the index position and slot of key's record with tag, or -1
// and nil if there is none; other reports an entry of the same key with
// another tag (a 64-bit hash collision between two recipients).
func (sh *shard) lookup(key uint64, tag uint16) (pos int, rec []byte, other bool) {
	for pos = sh.index.find(key, -1); pos >= 0; pos = sh.index.find(key, pos+1) {
		r := sh.index.ref(pos)
		rec = sh.slabs[r.class()].bytes(r.slot())
		if window.RecordTag(rec) == tag {
			return pos, rec, other
		}
		other = true
	}
	return -1, nil, other
}

// put stores rec as key's record: in place when it fits the same size class,
// else in a new slot. pos is key's index position, or -1 for a new record.
func (sh *shard) put(key uint64, pos int, rec []byte, collision bool) error {
	c := sizeClass(len(rec))
	if pos >= 0 {
		r := sh.index.ref(pos)
		if r.class() == c {
			copy(sh.slabs[c].bytes(r.slot()), rec)
			return nil
		}
	}
	slot, err := sh.slabs[c].alloc()
	if err != nil {
		return err
	}
	copy(sh.slabs[c].bytes(slot), rec)
	if pos >= 0 {
		old := sh.index.ref(pos)
		sh.slabs[old.class()].release(old.slot())
		sh.index.setRef(pos, makeRef(c, slot))
		return nil
	}
	sh.index.insert(key, makeRef(c, slot))
	sh.records++
	if collision {
		sh.collisions++
	}
	return nil
}

// sweep reclaims the records of shard i whose newest send is at or before
// cutoff (unix ms), visiting at most budget entries from position from. It
// returns the position to continue from, or -1 when the shard is done.
func (st *store) sweep(i int, from int, cutoff int64, budget int) (next int, reclaimed int, err error) {
	sh := &st.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t := &sh.index
	end := min(t.len, from+budget)
	for pos := from; pos < end; {
		if t.key(pos) == 0 {
			pos++
			continue
		}
		r := t.ref(pos)
		newest, err := window.RecordNewest(sh.slabs[r.class()].bytes(r.slot()))
		if err != nil {
			return -1, reclaimed, fmt.Errorf("node: shard %d position %d: %w", i, pos, err)
		}
		if newest > cutoff {
			pos++
			continue
		}
		sh.slabs[r.class()].release(r.slot())
		t.remove(pos) // a later entry may move into pos: look at it again
		sh.records--
		sh.expired++
		reclaimed++
	}
	if end < t.len {
		return end, reclaimed, nil
	}
	t.shrink()
	for c := range sh.slabs {
		sh.slabs[c].trim()
	}
	return -1, reclaimed, nil
}

// storeStats are a store's counters at one moment.
type storeStats struct {
	Records          int64 // recipients with a record
	Collisions       int64 // records created beside another recipient's with the same 64-bit key hash
	Expired          int64 // records reclaimed because nothing in them was inside any window
	IDs              int64 // request ids remembered
	EarlyIDRotations int64 // id generations retired before half the horizon because full
	IndexBytes       int64 // heap held by the index
	SlabBytes        int64 // heap held by record slabs, free slots included
	LiveBytes        int64 // bytes of slots in use
}

func (st *store) stats() storeStats {
	var s storeStats
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		s.Records += sh.records
		s.Collisions += sh.collisions
		s.Expired += sh.expired
		s.IDs += int64(sh.ids.len())
		s.EarlyIDRotations += sh.ids.early
		s.IndexBytes += sh.index.bytes()
		for c := range sh.slabs {
			sl := &sh.slabs[c]
			s.SlabBytes += sl.reserved()
			s.LiveBytes += int64(int(sl.next)-len(sl.free)) * int64(sl.size)
		}
		sh.mu.Unlock()
	}
	return s
}
