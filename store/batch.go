package store

import (
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

// batchScratch is ApplyBatch's working memory, pooled.
type batchScratch struct {
	order  []uint64 // partition<<32 | item index, sorted
	groups []batchGroup
	// ws is the engine's working memory for the whole batch, in place of
	// each partition's: one that stays in the CPU's caches, where the
	// partitions' would miss once per partition.
	ws window.Scratch
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

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
// entries of the items batchAhead*2 partitions ahead, and the records of
// those batchAhead ahead, whose entries have arrived by then. So the misses
// of later partitions are in flight while it decides the current one. It
// takes each partition's lock once, holding it from its entries' prefetch
// to its last decision: at most 2*batchAhead+1 locks at a time, always
// taken in ascending order, so two batches never deadlock.
func (s *Store) ApplyBatch(now int64, items []BatchItem) {
	if len(items) == 0 {
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer batchScratches.Put(sc)
	order := sc.order[:0]
	sorted := true
	for i := range items {
		o := uint64(items[i].Part)<<32 | uint64(i)
		sorted = sorted && (i == 0 || o > order[i-1])
		order = append(order, o)
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
	sc.order, sc.groups = order, groups
	for step := -2 * batchAhead; step < len(groups); step++ {
		if g := step + 2*batchAhead; g < len(groups) {
			s.parts[groups[g].part].mu.Lock()
			s.prefetchEntries(items, order, groups[g])
		}
		if g := step + batchAhead; g >= 0 && g < len(groups) {
			s.prefetchRecords(items, order, groups[g])
		}
		if step < 0 {
			continue
		}
		gr := groups[step]
		pt := &s.parts[gr.part]
		for _, o := range order[gr.start:gr.end] {
			x := &items[uint32(o)]
			if x.Refund {
				x.Seq, x.Cost, x.Dup, x.Err = s.refund(pt, gr.part, &sc.ws, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec)
				continue
			}
			x.Seq, x.Dup, x.Err = s.apply(pt, gr.part, &sc.ws, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec)
		}
		pt.mu.Unlock()
	}
}

// prefetchEntries prefetches the index entry at which the lookup of each of
// g's items starts. Partition g.part's lock is held.
func (s *Store) prefetchEntries(items []BatchItem, order []uint64, g batchGroup) {
	pt := &s.parts[g.part]
	if pt.closed {
		return
	}
	for _, o := range order[g.start:g.end] {
		x := &items[uint32(o)]
		if sp := pt.space(x.Ref.id, false); sp != nil && sp.index.len > 0 {
			prefetch(unsafe.Pointer(&sp.index.w[3*sp.index.home(storedKey(x.Key))]))
		}
	}
}

// prefetchRecords prefetches every cache line of the record of each of g's
// items. Partition g.part's lock is held.
func (s *Store) prefetchRecords(items []BatchItem, order []uint64, g batchGroup) {
	pt := &s.parts[g.part]
	if pt.closed {
		return
	}
	for _, o := range order[g.start:g.end] {
		x := &items[uint32(o)]
		sp := pt.space(x.Ref.id, false)
		if sp == nil {
			continue
		}
		if pos := sp.index.find(storedKey(x.Key), -1); pos >= 0 {
			r := sp.index.ref(pos)
			b := sp.slabs[r.class()].bytes(r.slot())
			for off := 0; off < len(b); off += 64 {
				prefetch(unsafe.Pointer(&b[off]))
			}
			prefetch(unsafe.Pointer(&b[len(b)-1])) // a slot need not start on a line
		}
	}
}
