package store

import (
	"iter"
	"slices"
	"sync"
	"unsafe"

	"github.com/freqring/freqring/window"
)

// BatchItem is one item of ApplyBatch: the arguments of one Apply call, and
// after ApplyBatch its results.
type BatchItem struct {
	Part int    // partition of Key, as Apply's p
	Ref  Ref    // domain
	Key  uint64 // recipient's key hash
	Tag  uint16 // recipient's verifier tag
	Item window.Item
	ID   uint64 // request id, 0 for none
	// Refund makes the item a Refund of the send ID recorded instead of an
	// Apply: Dec, Seq and Err are Refund's, Dup its again, Cost its cost.
	Refund bool

	Dec  window.Decision // as Apply fills dec
	Seq  uint64          // as Apply returns seq
	Dup  bool            // as Apply returns dup
	Err  error           // as Apply returns err
	Cost int             // a refund's cost
	// Opening is the partition's Opening count when the item was decided.
	Opening uint64
}

// batchAhead is how many partition groups ahead of the one being decided
// ApplyBatch prefetches each level (index entries, then records): a group's
// decisions take longer than a cache miss, so one group would do on a quiet
// machine; two measured as well as three on a busy one.
const batchAhead = 2

// batchGroup is the run of a batch's items in one partition.
type batchGroup struct {
	part       int
	start, end int // in batchScratch.order
}

// batchKey is where one item of a batch is: its domain and key hash, and
// the request id's key in the domain's id cache.
type batchKey struct {
	dom int    // Ref.id
	key uint64 // storedKey of the item's key
	id  uint64 // the request id's slot key (idSlotKey of idKey); 0 without an id
}

// batchScratch is the working memory of ApplyBatch and RecordBatch, pooled.
type batchScratch struct {
	order  []uint64 // partition<<32 | item index, sorted
	groups []batchGroup
	keys   []batchKey // by item index
	// ws is the engine's working memory for the whole batch, in place of
	// each partition's: one that stays in the CPU's caches, where the
	// partitions' would miss once per partition.
	ws window.Scratch
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

// plan groups n items by partition, in ascending partition order and item
// order within each: where(i) is item i's partition, domain, key hash and
// request id (0 for none).
func (sc *batchScratch) plan(n int, where func(i int) (part int, r Ref, key, id uint64)) {
	order, keys := sc.order[:0], sc.keys[:0]
	sorted := true
	for i := range n {
		p, r, key, id := where(i)
		o := uint64(p)<<32 | uint64(i)
		sorted = sorted && (i == 0 || o > order[i-1])
		order = append(order, o)
		k := batchKey{dom: r.id, key: storedKey(key)}
		if id != 0 {
			k.id = idSlotKey(idKey(id, k.key))
		}
		keys = append(keys, k)
	}
	if !sorted {
		slices.Sort(order)
	}
	groups := sc.groups[:0]
	for g := 0; g < len(order); {
		p := int(order[g] >> 32)
		e := g + 1
		for e < len(order) && int(order[e]>>32) == p {
			e++
		}
		groups = append(groups, batchGroup{p, g, e})
		g = e
	}
	sc.order, sc.groups, sc.keys = order, groups, keys
}

// lockedGroups yields the groups sc planned, in order, each with its
// partition's lock held until the loop body returns; it prefetches the
// index entries and request-id cache slots of the items batchAhead*2
// groups ahead and the records of those batchAhead ahead, so that the
// misses of later partitions are in flight while the body decides the
// current one. It holds at most
// 2*batchAhead+1 locks at a time, always taken in ascending order, so two
// batches never deadlock.
func (s *Store) lockedGroups(sc *batchScratch) iter.Seq[batchGroup] {
	return func(yield func(batchGroup) bool) {
		groups := sc.groups
		for step := -2 * batchAhead; step < len(groups); step++ {
			if g := step + 2*batchAhead; g < len(groups) {
				s.parts[groups[g].part].mu.Lock()
				s.prefetchEntries(sc, groups[g])
			}
			if g := step + batchAhead; g >= 0 && g < len(groups) {
				s.prefetchRecords(sc, groups[g])
			}
			if step < 0 {
				continue
			}
			more := yield(groups[step])
			s.parts[groups[step].part].mu.Unlock()
			if !more {
				// Let go of the locks taken ahead.
				for _, gr := range groups[step+1 : min(len(groups), step+2*batchAhead+1)] {
					s.parts[gr.part].mu.Unlock()
				}
				return
			}
		}
	}
}

// ApplyBatch applies each item x of items at time now (unix ms) as
// Apply(x.Part, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec) would, and
// puts Apply's results in x.Seq, x.Dup and x.Err: the outcome is that of
// calling Apply on the items one by one in slice order. The items of one
// partition are decided in slice order under one hold of its lock, so two
// items of one recipient see each other and the partition's recorded items
// get consecutive sequence numbers in slice order; partitions share no
// state, so the order between them changes nothing. Safe for concurrent
// use; it does not allocate once its pooled working memory is warm.
//
// Deciding an item needs its index entry and then its record: two
// dependent cache misses that Apply pays one after the other, each a TLB
// miss too at millions of recipients. ApplyBatch goes through the batch's
// partitions in ascending order and prefetches (a CPU prefetch instruction,
// which neither waits for the line nor faults) ahead of deciding: the index
// entries and request-id cache slots of the items batchAhead*2 partitions
// ahead, and the records of those batchAhead ahead, whose entries have
// arrived by then. So the misses
// of later partitions are in flight while it decides the current one. It
// takes each partition's lock once, holding it from its entries' prefetch
// to its last decision (lockedGroups).
func (s *Store) ApplyBatch(now int64, items []BatchItem) {
	if len(items) == 0 {
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer batchScratches.Put(sc)
	sc.plan(len(items), func(i int) (int, Ref, uint64, uint64) {
		x := &items[i]
		id := x.ID
		if x.Item.Mode == window.Peek && !x.Refund {
			id = 0 // a peek does not look its id up (apply)
		}
		return x.Part, x.Ref, x.Key, id
	})
	for gr := range s.lockedGroups(sc) {
		pt := &s.parts[gr.part]
		for _, o := range sc.order[gr.start:gr.end] {
			x := &items[uint32(o)]
			x.Opening = pt.opening.Load()
			if x.Refund {
				x.Seq, x.Cost, x.Dup, x.Err = s.refund(pt, gr.part, &sc.ws, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec)
				continue
			}
			x.Seq, x.Dup, x.Err = s.apply(pt, gr.part, &sc.ws, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec)
		}
	}
}

// RecordItem is one send of RecordBatch: the arguments of one Record call
// (or of one Unrecord call, with Refund), and after RecordBatch its results.
type RecordItem struct {
	Part int    // partition of Key
	Ref  Ref    // domain
	Key  uint64 // recipient's key hash
	Tag  uint16 // recipient's verifier tag
	At   int64  // the send's time, unix ms
	Item window.Item
	ID   uint64 // request id, 0 for none
	// Refund makes the item an Unrecord of the send at At (seq 0: numbered
	// with the partition's next sequence number) instead of a Record; Dup
	// is then !applied.
	Refund bool
	// Replace, for a backup's copy of its owner's send, first takes back a
	// send held under ID at another time: the owner took that attempt
	// back (it did not stand) and decided the retry afresh, and the backup
	// follows the owner, whose record holds the retry only. Replaced and
	// ReplacedSeq are then the time (unix ms) and sequence number of the
	// send taken back; Replaced is 0 if none was.
	Replace     bool
	Replaced    int64
	ReplacedSeq uint64

	Seq uint64 // as Record (or Unrecord) returns seq
	Dup bool   // as Record returns dup
	Err error  // as Record returns err
}

// RecordBatch records each send x of items as Record(x.Part, x.Ref, x.Key,
// x.Tag, x.At, x.Item, x.ID, now) would (Unrecord with x.Refund), and puts
// the results in x.Seq, x.Dup and x.Err: the outcome is that of calling
// Record on the items one by one in slice order. A backup records its
// owner's sends this way: one hold of each partition's lock, in ascending
// partition order and slice order within one, with the index entries and
// records of later partitions prefetched while it records the current
// one, as ApplyBatch does. Safe for concurrent use.
func (s *Store) RecordBatch(now int64, items []RecordItem) {
	s.inOrder(len(items), func(i int) (int, Ref, uint64, uint64) { return items[i].Part, items[i].Ref, items[i].Key, items[i].ID },
		func(pt *partition, ws *window.Scratch, i int) {
			x := &items[i]
			if x.Refund {
				var applied bool
				x.Seq, applied, x.Err = s.unrecordLocked(pt, ws, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, 0, now)
				x.Dup = !applied
				return
			}
			if x.Replace {
				if x.Replaced, x.ReplacedSeq, x.Err = s.replaceHeld(pt, ws, x, now); x.Err != nil {
					return
				}
			}
			x.Seq, x.Dup, x.Err = s.record(pt, ws, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, now)
		})
}

// inOrder calls do for each of n items, item i being where(i)'s (its
// partition, domain, key hash and request id), grouped by partition:
// partitions in ascending order, items in slice order within one, each
// partition's lock held across its items, and later partitions' index
// entries and records prefetched meanwhile (lockedGroups). do works in ws,
// the batch's engine scratch.
func (s *Store) inOrder(n int, where func(i int) (int, Ref, uint64, uint64), do func(pt *partition, ws *window.Scratch, i int)) {
	if n == 0 {
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer batchScratches.Put(sc)
	sc.plan(n, where)
	for gr := range s.lockedGroups(sc) {
		pt := &s.parts[gr.part]
		for _, o := range sc.order[gr.start:gr.end] {
			do(pt, &sc.ws, int(uint32(o)))
		}
	}
}

// replaceHeld takes back the send held under x's request id if it was
// recorded at another time than x.At and not refunded, and returns its
// time and the sequence number of taking it back (0, 0 if there was
// none). Partition pt's lock is held.
func (s *Store) replaceHeld(pt *partition, ws *window.Scratch, x *RecordItem, now int64) (int64, uint64, error) {
	if x.ID == 0 {
		return 0, 0, nil
	}
	sp := pt.space(x.Ref.id, false)
	if sp == nil {
		return 0, 0, nil
	}
	e, ok := sp.ids.get(idKey(x.ID, storedKey(x.Key)), now, s.idHorizon)
	if !ok || e.refunded || e.at == x.At {
		return 0, 0, nil
	}
	seq, _, err := s.unrecordLocked(pt, ws, x.Ref, x.Key, x.Tag, e.at, x.Item, x.ID, 0, now)
	if err != nil {
		return 0, 0, err
	}
	return e.at, seq, nil
}

// prefetchEntries prefetches the index entry at which the lookup of each of
// g's items starts, and the id cache slot at which the lookup of its
// request id starts. Partition g.part's lock is held.
func (s *Store) prefetchEntries(sc *batchScratch, g batchGroup) {
	pt := &s.parts[g.part]
	for _, o := range sc.order[g.start:g.end] {
		k := sc.keys[uint32(o)]
		sp := pt.space(k.dom, false)
		if sp == nil {
			continue
		}
		sp.index.prefetchHome(k.key)
		if k.id != 0 && len(sp.ids.slots) > 0 {
			prefetch(unsafe.Pointer(&sp.ids.slots[sp.ids.home(k.id)]))
		}
	}
}

// prefetchSlot prefetches every cache line of the slot r.
func (sp *space) prefetchSlot(r ref) {
	b := sp.slabs[r.class()].bytes(r.slot())
	for off := 0; off < len(b); off += 64 {
		prefetch(unsafe.Pointer(&b[off]))
	}
	prefetch(unsafe.Pointer(&b[len(b)-1])) // a slot need not start on a line
}

// prefetchRecords prefetches every cache line of the record of each of g's
// items. Partition g.part's lock is held.
func (s *Store) prefetchRecords(sc *batchScratch, g batchGroup) {
	pt := &s.parts[g.part]
	for _, o := range sc.order[g.start:g.end] {
		k := sc.keys[uint32(o)]
		sp := pt.space(k.dom, false)
		if sp == nil {
			continue
		}
		if pos := sp.index.find(k.key, -1); pos >= 0 {
			sp.prefetchSlot(sp.index.ref(pos))
		}
	}
}

// InsertItem is one send of InsertBatch: the arguments of one Insert, or
// with Refund of one Unrecord, and after InsertBatch its error.
type InsertItem struct {
	Part int    // partition of Key
	Ref  Ref    // domain
	Key  uint64 // recipient's key hash
	Tag  uint16 // recipient's verifier tag
	At   int64  // the send's time, unix ms
	Item window.Item
	Seq  uint64 // the send's sequence number in its partition
	ID   uint64 // request id, 0 for none
	// Refund makes the item an Unrecord of the send at At instead of an
	// Insert.
	Refund bool

	Err error // as Insert (or Unrecord) returns err
}

// InsertBatch inserts items, for replaying a write-ahead log: the outcome
// is that of calling Insert (Unrecord for a refund) on the items one by one
// in slice order, with each partition's lock held once, in ascending
// partition order and slice order within one, and the index entries and
// records of later partitions prefetched while it inserts into the current
// one, as ApplyBatch does: replay walks records spread over the whole
// store, and waits on memory more than on anything else. Safe for
// concurrent use.
func (s *Store) InsertBatch(now int64, items []InsertItem) {
	s.inOrder(len(items), func(i int) (int, Ref, uint64, uint64) { return items[i].Part, items[i].Ref, items[i].Key, items[i].ID },
		func(pt *partition, ws *window.Scratch, i int) {
			x := &items[i]
			if x.Refund {
				_, _, x.Err = s.unrecordLocked(pt, ws, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, x.Seq, now)
				return
			}
			x.Err = s.insertLocked(pt, ws, x.Ref, x.Key, x.Tag, x.At, x.Item, x.Seq, x.ID, now)
		})
}
