package store

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/freqring/freqring/window"
)

// Config configures a Store. A zero field takes the default named in its
// comment.
type Config struct {
	// Partitions is the number of ring partitions, in [1, MaxPartitions]; 0
	// means 271 (package ring's default). It must equal the ring's
	// PartitionCount: key k belongs to partition k % Partitions.
	Partitions int
	// IDHorizon is how long the request id of a recorded item is remembered;
	// 0 means 1 minute.
	IDHorizon time.Duration
	// IDCapacity bounds the request ids one domain remembers across all
	// partitions (at most 42 bytes of memory per id of capacity, with the
	// print of its item); 0 means 1,048,576. Past it, the oldest are
	// forgotten before IDHorizon.
	IDCapacity int
	// MaxBytes bounds the memory the store holds (Store.Memory) that Apply
	// may grow: past it, Apply refuses with ErrMemoryLimit to create a
	// record, or to move one to a larger slot, with no room held for it. 0
	// means no limit. See Memory limit in the package doc.
	MaxBytes int64
	// HeapSlabs keeps every slab chunk on the Go heap. By default the
	// full-size chunks, which hold nearly all records, come from memory
	// the store maps itself, advised for transparent huge pages (see
	// Memory outside the Go heap in the package doc).
	HeapSlabs bool
}

// MaxPartitions is the largest Config.Partitions.
const MaxPartitions = 1 << 16

// DefaultPartitions is the partition count of a zero Config.
const DefaultPartitions = 271

func (c *Config) fill() {
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.IDHorizon == 0 {
		c.IDHorizon = time.Minute
	}
	if c.IDCapacity == 0 {
		c.IDCapacity = 1 << 20
	}
}

func (c *Config) validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return fmt.Errorf("store: Partitions %d out of range [1, %d]", c.Partitions, MaxPartitions)
	case c.IDHorizon < time.Millisecond:
		return fmt.Errorf("store: IDHorizon %v is below 1ms", c.IDHorizon)
	case c.IDCapacity < 1:
		return fmt.Errorf("store: IDCapacity %d is below 1", c.IDCapacity)
	case c.MaxBytes < 0:
		return fmt.Errorf("store: MaxBytes %d is negative (0 means no limit)", c.MaxBytes)
	}
	return nil
}

// Store holds the records of every domain, organised by ring partition with
// one lock per partition. It is safe for concurrent use.
type Store struct {
	parts     []partition
	idHorizon int64 // ms
	idCap     int   // ids one partition remembers per domain
	mem       *memory

	mu     sync.Mutex     // guards names and byName
	names  []string       // domain id -> name; ids are never reused
	byName map[string]int // name -> domain id
}

// partition is one lock's worth of a store: the records of every domain
// whose keys fall in one ring partition.
type partition struct {
	mu      sync.Mutex     // guards every field below and the spaces
	spaces  []*space       // by domain id; nil until the domain has a record here
	scratch window.Scratch // working memory of window.Apply
	conv    []byte         // a record converted from an older format, being merged
	seq     uint64         // sends recorded in this partition, ever; numbers each one for the WAL
	closed  bool           // Apply refuses: another node may hold newer history (see Close)
	// opening counts the partition's opens and closes (Opening); written
	// under mu, read without it.
	opening atomic.Uint64
	mem     *memory  // the store's heap account, shared by every partition
	_       [64]byte // keep neighbouring partitions' locks off one cache line
}

// memory is a store's heap account: what its partitions hold, and what the
// limit refused. Its counters are atomic; every partition adds to held as it
// allocates and frees, rarely (chunks, table resizes, free-list growth, 64
// request ids at a time), so the shared counter stays cold.
type memory struct {
	_             [64]byte     // off the cache lines of other fields of the Store
	held          atomic.Int64 // heap bytes held (see Store.Memory)
	refused       atomic.Int64 // items Apply refused at the limit: new records, and records that would grow
	refusedGrowth atomic.Int64 // of refused, those of known recipients whose record would grow
	overshoots    atomic.Int64 // records created or grown past the limit by paths that never refuse
	limit         int64        // Config.MaxBytes; 0 means none
	blocks        *blocks      // full-size slab chunks, mapped outside the Go heap
	_             [64]byte
}

// over reports whether the store holds its limit or more, counting the
// free blocks it keeps for reuse.
func (m *memory) over() bool {
	return m.limit > 0 && m.held.Load()+m.blocks.freeBytes.Load() >= m.limit
}

// space holds one domain's records in one partition.
type space struct {
	mem        *memory // the store's heap account
	index      table   // key hash -> slot
	slabs      []slab  // per size class
	ids        idCache // request ids of recorded items
	records    int64   // entries in index
	collisions int64   // records created for a key whose hash matched another recipient's
	expired    int64   // records reclaimed by sweep
	moved      int64   // records the sweep moved to give sparse chunks back (defrag)
	compacted  int64   // records whose dead content logs the sweep dropped
	unreadable int64   // records the current or latest sweep pass could not decode to compact
}

// spaceBytes is the heap of an empty space: the struct and its slab headers.
var spaceBytes = int64(unsafe.Sizeof(space{})) + int64(len(classSizes))*int64(unsafe.Sizeof(slab{}))

func newSpace(mem *memory) *space {
	sp := &space{mem: mem, slabs: make([]slab, len(classSizes))}
	sp.index.held, sp.index.blk = &mem.held, mem.blocks
	sp.ids.held, sp.ids.mem = &mem.held, mem
	for c, size := range classSizes {
		sp.slabs[c] = newSlab(size, &mem.held, mem.blocks)
	}
	mem.held.Add(spaceBytes)
	return sp
}

// heldBytes returns what sp has added to its heap account: its index, its
// slabs, its request ids and itself.
func (sp *space) heldBytes() int64 {
	n := spaceBytes + sp.index.bytes() + sp.ids.acct
	for c := range sp.slabs {
		n += sp.slabs[c].reserved()
	}
	return n
}

// roomFor reports whether a new record of n bytes fits sp without adding
// to what the store holds with its free blocks: room in the index, and a
// free slot in its size class or a free block for the class's next chunk
// (slab.hasHeldRoom).
func (sp *space) roomFor(n int) bool {
	return sp != nil && sp.index.hasRoom() && sp.slabs[sizeClass(n)].hasHeldRoom()
}

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		parts:     make([]partition, cfg.Partitions),
		idHorizon: cfg.IDHorizon.Milliseconds(),
		idCap:     max(2, cfg.IDCapacity/cfg.Partitions),
		mem:       &memory{limit: cfg.MaxBytes, blocks: &blocks{}},
		byName:    map[string]int{},
	}
	// Every slab points into mem (its held account), so once mem is
	// unreachable no block is in use, and the mapped memory can go.
	s.mem.blocks.heap.Store(cfg.HeapSlabs)
	runtime.AddCleanup(s.mem, (*blocks).release, s.mem.blocks)
	for p := range s.parts {
		s.parts[p].mem = s.mem
	}
	return s, nil
}

// Partitions returns the number of partitions.
func (s *Store) Partitions() int { return len(s.parts) }

// PartitionOf returns the partition of key hash key: key % Partitions, the
// ring's rule.
func (s *Store) PartitionOf(key uint64) int { return int(key % uint64(len(s.parts))) }

// ErrClosed reports a check on a closed partition (see Store.Close).
var ErrClosed = errors.New("store: partition closed")

// Close closes partition p to Apply: checks fail with ErrClosed until Open.
// Replay, merges and Insert still work. A node closes a partition it does
// not own, or whose history may be on another node, so that it never decides
// from a record that may be missing sends. Partitions start open.
func (s *Store) Close(p int) {
	pt := &s.parts[p]
	pt.mu.Lock()
	if !pt.closed {
		pt.closed = true
		pt.opening.Add(1)
	}
	pt.mu.Unlock()
}

// Open opens partition p to Apply.
func (s *Store) Open(p int) {
	pt := &s.parts[p]
	pt.mu.Lock()
	if pt.closed {
		pt.closed = false
		pt.opening.Add(1)
	}
	pt.mu.Unlock()
}

// Opening returns how many times partition p has been opened or closed: a
// decision made while the count was n (BatchItem.Opening) was made from the
// record of the current opening, and no other, only while Opening(p) is
// still n. A node whose partition closed and opened again meanwhile (it
// acquired newer history) must not stand by a decision of the opening
// before. Safe for concurrent use.
func (s *Store) Opening(p int) uint64 { return s.parts[p].opening.Load() }

// IsOpen reports whether partition p is open.
func (s *Store) IsOpen(p int) bool {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return !pt.closed
}

// Ref is a rule domain bound to its records in a store. Records belong to the
// domain's name, not to its rules: binding new rules of the same name (a
// reload) finds the same records. The zero Ref is not valid.
type Ref struct {
	id    int
	rules *window.Domain
}

// Rules returns the domain's rules.
func (r Ref) Rules() *window.Domain { return r.rules }

// Bind returns the Ref of d's records, by d's name.
func (s *Store) Bind(d *window.Domain) Ref {
	return Ref{id: s.domainID(d.Name()), rules: d}
}

// domainID returns name's id, assigning the next one on first use.
func (s *Store) domainID(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.byName[name]
	if !ok {
		id = len(s.names)
		s.names = append(s.names, name)
		s.byName[name] = id
	}
	return id
}

// domainName returns the name of domain id.
func (s *Store) domainName(id int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[id]
}

// space returns domain id's space, or nil if it has none (and !create).
// The partition's lock is held.
func (pt *partition) space(id int, create bool) *space {
	if id < len(pt.spaces) && pt.spaces[id] != nil {
		return pt.spaces[id]
	}
	if !create {
		return nil
	}
	for len(pt.spaces) <= id {
		pt.spaces = append(pt.spaces, nil)
	}
	pt.spaces[id] = newSpace(pt.mem)
	return pt.spaces[id]
}

// Apply decides it for the recipient with key hash key and verifier tag, in
// partition p (PartitionOf(key), which the caller has computed), at time now
// (unix ms), recording it if the decision says so. A recorded item gets
// seq, its partition's next sequence number (0 if not recorded).
//
// A nonzero id that the store recorded for this recipient within the id
// horizon makes the item a duplicate: nothing is recorded, and dec is the
// first decision (admitted, recorded, at its time) with per-rule counts as
// of now. If that id was recorded with another item (other content, cost,
// mode, or in another domain), Apply fails with ErrIDReused and changes
// nothing. A peek neither consults nor remembers ids.
func (s *Store) Apply(p int, r Ref, key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (seq uint64, dup bool, err error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return s.apply(pt, p, &pt.scratch, r, key, tag, now, it, id, dec)
}

// apply is Apply with partition p's lock held; pt is &s.parts[p]. The
// engine works in ws: the partition's scratch, or one the caller owns.
func (s *Store) apply(pt *partition, p int, ws *window.Scratch, r Ref, key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (seq uint64, dup bool, err error) {
	key = storedKey(key)
	if pt.closed {
		return 0, false, fmt.Errorf("%w: partition %d", ErrClosed, p)
	}
	sp := pt.space(r.id, false)
	var pos int = -1
	var rec []byte
	var other bool
	if sp != nil {
		pos, rec, other = sp.lookup(key, tag)
	}
	if id != 0 && it.Mode != window.Peek {
		var e idEntry
		known := false
		if sp != nil {
			e, known = sp.ids.get(idKey(id, key), now, s.idHorizon)
		}
		if known {
			if f := printOf(it, true).mismatch(e.idPrint); f != "" {
				return 0, false, fmt.Errorf("%w: request id %d was first used for an item of other %s", ErrIDReused, id, f)
			}
			// A retry of a send that was taken back (refunded) is a new
			// attempt at it: decided and recorded afresh below (its record
			// renews the id), never answered as recorded for free.
			if !e.refunded {
				// The counts as of now: a peek of cost 1, since a record-only
				// send may cost more than a limit, which a peek refuses.
				peek := it
				peek.Mode, peek.Cost = window.Peek, 1
				if _, err := r.rules.Apply(ws, rec, tag, now, peek, dec); err != nil {
					return 0, false, err
				}
				dec.Admitted, dec.Recorded, dec.DeniedBy, dec.RetryAfter, dec.At, dec.ShadowDeniedBy = true, true, -1, 0, e.at, -1
				for i := range dec.NumRules {
					dec.Rules[i].RetryAfter = 0
				}
				return 0, true, nil
			}
		} else if d, ok := s.idElsewhere(pt, r.id, idKey(id, key), now); ok {
			return 0, false, fmt.Errorf("%w: request id %d was first used in domain %q", ErrIDReused, id, d)
		}
	}
	out, err := r.rules.Apply(ws, rec, tag, now, it, dec)
	if err != nil || out == nil {
		return 0, false, err
	}
	if pos < 0 && s.mem.over() && !sp.roomFor(len(out)) {
		s.mem.refused.Add(1)
		dec.Recorded = false
		return 0, false, &limitError{held: s.mem.held.Load(), limit: s.mem.limit}
	}
	if sp == nil {
		sp = pt.space(r.id, true)
	}
	if err := sp.put(key, pos, out, other, true); err != nil {
		dec.Recorded = false
		return 0, false, err
	}
	if id != 0 {
		sp.ids.put(idKey(id, key), dec.At, printOf(it, true), now, s.idHorizon, s.idCap)
	}
	pt.seq++
	return pt.seq, false, nil
}

// ErrMemoryLimit reports an item that Apply refused because it would create a
// record (its recipient has none in its domain), or move its recipient's
// record to a larger slot, while the store holds Config.MaxBytes or more and
// has no free room for it. Nothing changed.
var ErrMemoryLimit = errors.New("store: memory limit reached")

// limitError is an ErrMemoryLimit refusal: what the store held, its limit,
// and for a record that would grow, its slot's size and the new record's.
// Its text is made only when read: past the limit a node may refuse most
// of the items it decides.
type limitError struct {
	held, limit int64
	from, to    int // 0 for a new record
}

func (e *limitError) Error() string {
	if e.to == 0 {
		return fmt.Sprintf("%v: the store holds %d bytes, its limit is %d: a recipient with no record is refused until idle records free room",
			ErrMemoryLimit, e.held, e.limit)
	}
	return fmt.Sprintf("%v: the store holds %d bytes, its limit is %d: a record that would grow from %d to %d bytes is refused until idle records free room",
		ErrMemoryLimit, e.held, e.limit, e.from, e.to)
}

func (e *limitError) Unwrap() error { return ErrMemoryLimit }

// ErrIDReused reports a request id that the store remembers for this
// recipient with another item: other content, cost, mode or domain. Such an
// item is neither a retry nor recorded.
var ErrIDReused = errors.New("store: request id reused")

// idElsewhere returns the name of a domain other than dom in which pt
// remembers mixed id key k, if any. Called with pt's lock held.
func (s *Store) idElsewhere(pt *partition, dom int, k uint64, now int64) (string, bool) {
	for d, sp := range pt.spaces {
		if d == dom || sp == nil || sp.ids.len() == 0 {
			continue
		}
		if _, ok := sp.ids.get(k, now, s.idHorizon); ok {
			return s.domainName(d), true
		}
	}
	return "", false
}

// Insert records it as sent at time at (unix ms) without deciding
// (window.Insert), for replaying a write-ahead log, and raises partition p's
// sequence number to seq if it is below. A nonzero id is remembered as of
// now (unix ms).
func (s *Store) Insert(p int, r Ref, key uint64, tag uint16, at int64, it window.Item, seq, id uint64, now int64) error {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return s.insertLocked(pt, &pt.scratch, r, key, tag, at, it, seq, id, now)
}

// insertLocked is Insert with partition pt's lock held, the engine working
// in ws.
func (s *Store) insertLocked(pt *partition, ws *window.Scratch, r Ref, key uint64, tag uint16, at int64, it window.Item, seq, id uint64, now int64) error {
	key = storedKey(key)
	pt.seq = max(pt.seq, seq)
	sp := pt.space(r.id, true)
	if id != 0 && now-at < s.idHorizon {
		sp.ids.put(idKey(id, key), at, printOf(it, false), now, s.idHorizon, s.idCap)
	}
	pos, rec, other := sp.lookup(key, tag)
	out, err := r.rules.Insert(ws, rec, tag, at, it)
	if err != nil || out == nil {
		return err
	}
	return sp.put(key, pos, out, other, false)
}

// Record records it as sent at time at (unix ms) without deciding, as
// Insert does, in partition p whether open or closed, and numbers the send
// with the partition's next sequence number, which it returns: a backup
// records the sends its owner admitted this way. A send whose nonzero id is
// remembered for this recipient is a send recorded already: Record skips it
// and returns dup, unless that send was refunded (the owner admitted a new
// attempt at it).
func (s *Store) Record(p int, r Ref, key uint64, tag uint16, at int64, it window.Item, id uint64, now int64) (seq uint64, dup bool, err error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return s.record(pt, &pt.scratch, r, key, tag, at, it, id, now)
}

// record is Record with the partition's lock held; pt is the partition. The
// engine works in ws: the partition's scratch, or one the caller owns.
func (s *Store) record(pt *partition, ws *window.Scratch, r Ref, key uint64, tag uint16, at int64, it window.Item, id uint64, now int64) (seq uint64, dup bool, err error) {
	key = storedKey(key)
	sp := pt.space(r.id, true)
	if id != 0 {
		if e, ok := sp.ids.get(idKey(id, key), now, s.idHorizon); ok && !e.refunded {
			return 0, true, nil
		}
		if now-at < s.idHorizon {
			sp.ids.put(idKey(id, key), at, printOf(it, false), now, s.idHorizon, s.idCap)
		}
	}
	pos, rec, other := sp.lookup(key, tag)
	out, err := r.rules.Insert(ws, rec, tag, at, it)
	if err != nil {
		return 0, false, err
	}
	if out != nil {
		if err := sp.put(key, pos, out, other, false); err != nil {
			return 0, false, err
		}
	}
	pt.seq++
	return pt.seq, false, nil
}

// Seq returns partition p's sequence number: the number of the last send it
// recorded.
func (s *Store) Seq(p int) uint64 {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return pt.seq
}

// RaiseSeq raises partition p's sequence number to seq if it is below.
func (s *Store) RaiseSeq(p int, seq uint64) {
	pt := &s.parts[p]
	pt.mu.Lock()
	pt.seq = max(pt.seq, seq)
	pt.mu.Unlock()
}

// storedKey maps key hash 0, which marks empty index entries, to 1.
func storedKey(key uint64) uint64 { return max(key, 1) }

// lookup returns the index position and slot of key's record with tag, or -1
// and nil if there is none; other reports an entry of the same key with
// another tag (a 64-bit hash collision between two recipients).
func (sp *space) lookup(key uint64, tag uint16) (pos int, rec []byte, other bool) {
	for pos = sp.index.find(key, -1); pos >= 0; pos = sp.index.find(key, pos+1) {
		r := sp.index.ref(pos)
		rec = sp.slabs[r.class()].bytes(r.slot())
		if window.RecordTag(rec) == tag {
			return pos, rec, other
		}
		other = true
	}
	return -1, nil, other
}

// put stores rec as key's record: in place when it fits the same size class,
// else in a new slot. pos is key's index position, or -1 for a new record.
//
// Past the memory limit (memory.over), a record that would move to a class
// with no room the store holds already (slab.hasHeldRoom) does not: one
// that shrank stays in its slot, which holds it (a record ignores the bytes
// after it); one that grew is refused with ErrMemoryLimit, changing
// nothing, if refuse (Apply's decisions), and otherwise takes its new slot
// past the limit, counted as an overshoot (replay, backups and merges
// carry sends already admitted, and never refuse).
func (sp *space) put(key uint64, pos int, rec []byte, collision, refuse bool) error {
	c := sizeClass(len(rec))
	if pos >= 0 {
		r := sp.index.ref(pos)
		if r.class() == c {
			copy(sp.slabs[c].bytes(r.slot()), rec)
			return nil
		}
		if sp.mem != nil && sp.mem.over() && !sp.slabs[c].hasHeldRoom() {
			switch {
			case len(rec) <= sp.slabs[r.class()].size:
				copy(sp.slabs[r.class()].bytes(r.slot()), rec)
				return nil
			case refuse:
				sp.mem.refused.Add(1)
				sp.mem.refusedGrowth.Add(1)
				return &limitError{held: sp.mem.held.Load(), limit: sp.mem.limit, from: sp.slabs[r.class()].size, to: len(rec)}
			}
			sp.mem.overshoots.Add(1)
		}
	} else if sp.mem != nil && sp.mem.over() && !sp.roomFor(len(rec)) {
		sp.mem.overshoots.Add(1) // replay, backups and merges never refuse
	}
	slot, err := sp.slabs[c].alloc()
	if err != nil {
		return err
	}
	copy(sp.slabs[c].bytes(slot), rec)
	if pos >= 0 {
		old := sp.index.ref(pos)
		sp.slabs[old.class()].release(old.slot())
		sp.index.setRef(pos, makeRef(c, slot))
		return nil
	}
	sp.index.insert(key, makeRef(c, slot))
	sp.records++
	if collision {
		sp.collisions++
	}
	return nil
}

// drop removes the record at index position pos.
func (sp *space) drop(pos int) {
	r := sp.index.ref(pos)
	sp.slabs[r.class()].release(r.slot())
	sp.index.remove(pos)
	sp.records--
}

// Sweep reclaims, in partition p, the records of domain r whose newest send
// is at or before now (unix ms) minus the domain's longest window, and
// compacts those whose content logs no rule can count at now or later
// (window.Domain.Compact). It visits at most budget index entries from
// position from (a record it moves counts as moveCost of them, one it
// compacts as compactCost). It returns the position to continue from, or -1
// when the partition is done. A record the sweep cannot read is left as it
// is and counted (Stats.Unreadable, per pass): a decision on it reports the
// error.
// A pass from position 0 to the end also gives sparse slab chunks back: it
// moves the records out of them as it goes (see "Sparse chunks" in the
// package doc), and its last step shrinks the index, trims empty slabs and
// gives back the chunks it emptied.
func (s *Store) Sweep(p int, r Ref, from int, now int64, budget int) (next int, reclaimed int, err error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	sp := pt.space(r.id, false)
	if sp == nil {
		return -1, 0, nil
	}
	if from == 0 {
		for c := range sp.slabs {
			sp.slabs[c].planDefrag()
		}
		sp.unreadable = 0
	}
	cutoff := now - r.rules.Longest()
	t := &sp.index
	pos := from
	for spent := 0; pos < t.len && spent < budget; spent++ {
		k := t.key(pos)
		if k == 0 {
			pos++
			continue
		}
		ref := t.ref(pos)
		sl := &sp.slabs[ref.class()]
		rec := sl.bytes(ref.slot())
		newest, err := window.RecordNewest(rec)
		if err != nil {
			return -1, reclaimed, fmt.Errorf("store: partition %d domain %q position %d: %w", p, r.rules.Name(), pos, err)
		}
		if newest > cutoff && r.rules.Compactable(newest, now) {
			out, compacted, err := r.rules.Compact(&pt.scratch, rec, now)
			switch {
			case err != nil:
				sp.unreadable++
			case compacted && out != nil:
				spent += compactCost - 1
				// The smaller record may need a fresh chunk while the slot it
				// leaves is given back only by a later pass: at the memory
				// limit, it waits for a free slot of its class or a free
				// block for the class's next chunk (it adds no index entry,
				// and stays in place within its class). A failed put (no
				// memory to map) leaves the record as it was.
				c := sizeClass(len(out))
				if s.mem.over() && c != ref.class() && !sp.slabs[c].hasHeldRoom() || sp.put(k, pos, out, false, false) != nil {
					break
				}
				sp.compacted++
				ref = t.ref(pos)
				sl = &sp.slabs[ref.class()]
				rec = sl.bytes(ref.slot())
			case compacted: // nothing left: reclaimed below
				newest = cutoff
			}
		}
		if newest > cutoff {
			if sl.ceiling != 0 && ref.slot() >= sl.ceiling {
				if to, ok := sl.popFree(); ok {
					copy(sl.bytes(to), rec)
					t.setRef(pos, makeRef(ref.class(), to))
					sl.release(ref.slot())
					sp.moved++
					spent += moveCost - 1
				}
			}
			pos++
			continue
		}
		sp.drop(pos) // a later entry may move into pos: look at it again
		sp.expired++
		reclaimed++
	}
	if pos < t.len {
		return pos, reclaimed, nil
	}
	t.shrink()
	for c := range sp.slabs {
		sp.slabs[c].finishDefrag()
		sp.slabs[c].trim()
	}
	return -1, reclaimed, nil
}

// compactCost is what compacting a record counts against a sweep step's
// budget of index entries: it decodes and encodes the record, where a visit
// reads its header.
const compactCost = 8

// moveCost is what moving a record to a lower slot counts against a sweep
// step's budget of index entries: a copy to a slot likely out of the
// caches, where a visit reads a record's header.
const moveCost = 4

// Stats are one domain's counters in a store at one moment.
type Stats struct {
	Records    int64 // recipients with a record
	Collisions int64 // records created beside another recipient's with the same 64-bit key hash
	Expired    int64 // records reclaimed because nothing in them was inside any window
	Moved      int64 // records the sweep moved to lower slots so as to give sparse slab chunks back
	Compacted  int64 // records whose content logs the sweep dropped because no rule could count them
	Unreadable int64 // records the current or latest sweep pass could not decode to compact, left as they were
	IDs        int64 // request ids held: those remembered, and those past the horizon that no rebuild has dropped yet
	EvictedIDs int64 // request ids forgotten before the horizon because the domain held IDCapacity, or the store its memory limit
	IndexBytes int64 // heap held by the index
	SlabBytes  int64 // heap held by record slabs, free slots included
	LiveBytes  int64 // bytes of slots in use
}

func (a *Stats) add(sp *space) {
	a.Records += sp.records
	a.Collisions += sp.collisions
	a.Expired += sp.expired
	a.Moved += sp.moved
	a.Compacted += sp.compacted
	a.Unreadable += sp.unreadable
	a.IDs += int64(sp.ids.len())
	a.EvictedIDs += sp.ids.evicted
	a.IndexBytes += sp.index.bytes()
	for c := range sp.slabs {
		sl := &sp.slabs[c]
		a.SlabBytes += sl.reserved()
		a.LiveBytes += int64(sl.inUse()) * int64(sl.size)
	}
}

// Stats returns domain r's counters over every partition. It takes each
// partition's lock briefly.
func (s *Store) Stats(r Ref) Stats {
	var st Stats
	for p := range s.parts {
		st = st.plus(s.PartitionStats(p, r))
	}
	return st
}

// ClassStats is one size class of a domain's record slots.
type ClassStats struct {
	Size     int   // bytes per slot; a record takes a slot of the smallest class that holds it
	Records  int64 // slots in use
	Reserved int64 // bytes held for the class's slots: in use, free, and not yet handed out
}

// SizeClasses returns domain r's size classes that hold a record or
// reserve memory, smallest first, summed over every partition: the
// histogram of its record sizes. It takes each partition's lock briefly.
func (s *Store) SizeClasses(r Ref) []ClassStats {
	sum := make([]ClassStats, len(classSizes))
	for p := range s.parts {
		pt := &s.parts[p]
		pt.mu.Lock()
		if sp := pt.space(r.id, false); sp != nil {
			for c := range sp.slabs {
				sl := &sp.slabs[c]
				sum[c].Records += int64(sl.inUse())
				sum[c].Reserved += sl.reserved()
			}
		}
		pt.mu.Unlock()
	}
	var out []ClassStats
	for c, cs := range sum {
		if cs.Records > 0 || cs.Reserved > 0 {
			cs.Size = classSizes[c]
			out = append(out, cs)
		}
	}
	return out
}

// PartitionLen returns the number of records in partition p, all domains.
func (s *Store) PartitionLen(p int) int64 {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var n int64
	for _, sp := range pt.spaces {
		if sp != nil {
			n += sp.records
		}
	}
	return n
}

// PartitionStats returns domain r's counters in partition p.
func (s *Store) PartitionStats(p int, r Ref) Stats {
	var st Stats
	pt := &s.parts[p]
	pt.mu.Lock()
	if sp := pt.space(r.id, false); sp != nil {
		st.add(sp)
	}
	pt.mu.Unlock()
	return st
}

func (a Stats) plus(b Stats) Stats {
	a.Records += b.Records
	a.Collisions += b.Collisions
	a.Expired += b.Expired
	a.Moved += b.Moved
	a.Compacted += b.Compacted
	a.Unreadable += b.Unreadable
	a.IDs += b.IDs
	a.EvictedIDs += b.EvictedIDs
	a.IndexBytes += b.IndexBytes
	a.SlabBytes += b.SlabBytes
	a.LiveBytes += b.LiveBytes
	return a
}

// MemoryStats are a store's memory account at one moment.
type MemoryStats struct {
	// HeldBytes is the memory the store holds, all domains: index tables,
	// slab chunks and free lists (exact, counted as they are allocated and
	// freed) and request ids (their tables, exact).
	HeldBytes int64
	// MappedBytes is the memory the store took outside the Go heap: for
	// full-size slab chunks, those in HeldBytes and those freed for reuse
	// (kept until the store is unreachable), and its large index tables
	// (unmapped as they are replaced).
	MappedBytes int64
	// FreeBytes is the part of MappedBytes in slab chunks given back (by the
	// sweep, a partition's move) and kept, zeroed, for the next chunk the
	// store needs: resident, counted toward MaxBytes, and room a new
	// recipient may take at the limit.
	FreeBytes int64
	MaxBytes  int64 // Config.MaxBytes; 0 means no limit
	// Refused counts the items Apply refused with ErrMemoryLimit: for
	// recipients with no record, and (RefusedGrowth of them) for known
	// recipients whose record would have grown.
	Refused, RefusedGrowth int64
	// Overshoots counts the records that replay (Insert), backups (Record),
	// merges and refunds created or grew past the limit with no free room:
	// they are never refused, since losing an admitted send is worse than
	// holding more.
	Overshoots int64
}

// Memory returns the store's memory account. It takes no lock.
func (s *Store) Memory() MemoryStats {
	b := s.mem.blocks
	return MemoryStats{HeldBytes: s.mem.held.Load(), MappedBytes: b.carved.Load() + b.tableBytes.Load(), FreeBytes: b.freeBytes.Load(),
		MaxBytes: s.mem.limit, Refused: s.mem.refused.Load(), RefusedGrowth: s.mem.refusedGrowth.Load(), Overshoots: s.mem.overshoots.Load()}
}
