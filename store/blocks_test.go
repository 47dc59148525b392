package store

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/freqring/freqring/window"
)

// TestBlocksReuse checks that a returned block is handed out again, zeroed,
// before anything new is mapped, that chunks blocks did not give out are
// left alone, and the accounts of carved and free bytes.
func TestBlocksReuse(t *testing.T) {
	b := &blocks{}
	defer b.release()
	c := b.get(blockBytes)
	if len(c) != blockBytes || cap(c) != blockBytes {
		t.Fatalf("block of len %d cap %d, want %d", len(c), cap(c), blockBytes)
	}
	if len(b.regions) == 0 {
		t.Skip("this kernel refused to map a region: blocks come from the Go heap")
	}
	if got := b.carved.Load(); got != blockBytes {
		t.Fatalf("carved %d bytes after one block, want %d", got, blockBytes)
	}
	if start := uintptr(unsafe.Pointer(&b.regions[0].aligned[0])); start%hugePageBytes != 0 {
		t.Fatalf("region at %#x, not on a huge page", start)
	}
	c[0], c[blockBytes-1] = 1, 2
	b.put(c[:100]) // a slab's chunk: len per*size, cap blockBytes
	b.put(make([]byte, blockBytes))
	if len(b.free) != 1 || b.freeBytes.Load() != blockBytes {
		t.Fatalf("%d blocks free, %d free bytes; want 1, %d (a heap slice is not a block)", len(b.free), b.freeBytes.Load(), blockBytes)
	}
	d := b.get(blockBytes - 100)
	if &d[0] != &c[0] || len(d) != blockBytes-100 {
		t.Fatal("a freed block was not reused")
	}
	d = d[:blockBytes]
	if d[0] != 0 || d[blockBytes-1] != 0 {
		t.Fatal("a reused block was not zeroed")
	}
	if b.carved.Load() != blockBytes || b.freeBytes.Load() != 0 {
		t.Fatalf("after reuse: carved %d, free %d; want %d, 0", b.carved.Load(), b.freeBytes.Load(), blockBytes)
	}
	if small := b.get(minBlockUse - 1); cap(small) != minBlockUse-1 {
		t.Fatalf("a chunk of %d bytes took a block (cap %d)", minBlockUse-1, cap(small))
	}
	for range regionBytes / blockBytes {
		b.get(blockBytes)
	}
	if len(b.regions) != 2 || b.carved.Load() != regionBytes+blockBytes {
		t.Fatalf("%d regions, %d bytes carved after %d blocks; want 2, %d", len(b.regions), b.carved.Load(), regionBytes/blockBytes+1, regionBytes+blockBytes)
	}
}

// TestBlocksOnHeap checks Config.HeapSlabs' path: chunks of the size asked
// for from the Go heap, of a block's capacity when they are that large
// (what a slab counts for them), nothing mapped, nothing kept.
func TestBlocksOnHeap(t *testing.T) {
	b := &blocks{}
	b.heap.Store(true)
	c := b.get(blockBytes - 100)
	if len(c) != blockBytes-100 || cap(c) != blockBytes || b.carved.Load() != 0 || len(b.regions) != 0 {
		t.Fatalf("heap chunk: len %d, cap %d, carved %d, regions %d", len(c), cap(c), b.carved.Load(), len(b.regions))
	}
	b.put(c)
	if len(b.free) != 0 {
		t.Fatal("a heap chunk went to the free list")
	}
	if small := b.get(minBlockUse - 1); len(small) != minBlockUse-1 || cap(small) != minBlockUse-1 {
		t.Fatalf("chunk below a block's use: len %d cap %d, want %d", len(small), cap(small), minBlockUse-1)
	}
}

// fillSpread records one send for each of recipients [from, from+n) at now.
func fillSpread(t *testing.T, st *Store, ref Ref, from, n int, now int64) []window.Decision {
	t.Helper()
	decs := make([]window.Decision, n)
	for i := range n {
		key, tag := keyOf(fmt.Sprintf("+86%011d", from+i))
		if _, _, err := apply(st, ref, key, tag, now, window.Item{Content: uint64(i%5 + 1)}, 0, &decs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return decs
}

// TestMappedSlabsMatchHeapSlabs runs the same checks, sweeps and drops on a
// store with mapped slabs and one with heap slabs, and compares every
// decision, every image and the memory accounts: slab memory's origin
// changes nothing a caller sees. It then checks that swept and dropped
// blocks are reused instead of mapping more.
func TestMappedSlabsMatchHeapSlabs(t *testing.T) {
	d, err := window.NewDomain("default", window.DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	var sts [2]*Store
	var refs [2]Ref
	for i, heap := range []bool{false, true} {
		if sts[i], err = New(Config{Partitions: 2, HeapSlabs: heap}); err != nil {
			t.Fatal(err)
		}
		refs[i] = sts[i].Bind(d)
	}
	const n = 30_000 // per partition, several full-size chunks of the one-send class
	now := t0
	step := func(what string, f func(st *Store, ref Ref) any) {
		t.Helper()
		a, b := f(sts[0], refs[0]), f(sts[1], refs[1])
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s: mapped slabs and heap slabs differ", what)
		}
	}
	// records lists every record by partition and key (the index's order
	// depends on a random seed per table), each its whole slot.
	records := func(st *Store, _ Ref) any {
		var out []string
		for p := range st.Partitions() {
			st.ForEach(p, func(domain string, key uint64, rec []byte) bool {
				out = append(out, fmt.Sprintf("%d %s %016x %x", p, domain, key, rec))
				return true
			})
		}
		slices.Sort(out)
		return out
	}
	// held compares the held accounts, and checks each against a recount,
	// and the mapped store's carved bytes against its blocks in use and free.
	held := func(st *Store, _ Ref) any {
		if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
			t.Fatalf("HeldBytes %d, recount %d", got, want)
		}
		if m := st.Memory().MappedBytes; m != blocksInUse(st)*blockBytes+st.mem.blocks.freeBytes.Load()+tablesMapped(t, st) {
			t.Fatalf("MappedBytes %d: %d blocks in use, %d free bytes, %d bytes of tables", m, blocksInUse(st), st.mem.blocks.freeBytes.Load(), tablesMapped(t, st))
		}
		return st.Memory().HeldBytes
	}
	step("first fill", func(st *Store, ref Ref) any { return fillSpread(t, st, ref, 0, 2*n, now) })
	step("records", records)
	step("held", held)
	mapped := sts[0].Memory().MappedBytes
	if mapped == 0 {
		t.Skip("this kernel refused to map a region")
	}
	if m := sts[1].Memory().MappedBytes; m != 0 {
		t.Fatalf("HeapSlabs store mapped %d bytes", m)
	}

	// A second send for a random half, out of order: records change class.
	rng := rand.New(rand.NewPCG(5, 5))
	order := rng.Perm(2 * n)[:n]
	step("second sends", func(st *Store, ref Ref) any {
		var out []window.Decision
		for _, i := range order {
			key, tag := keyOf(fmt.Sprintf("+86%011d", i))
			var dec window.Decision
			if _, _, err := apply(st, ref, key, tag, now+1000, window.Item{Content: 1}, 0, &dec); err != nil {
				t.Fatal(err)
			}
			out = append(out, dec)
		}
		return out
	})
	step("records after second sends", records)

	// Everything expires: sweeps empty the slabs, which give their blocks back.
	later := now + 2*86_400_000
	step("sweep", func(st *Store, ref Ref) any { return sweepAll(t, st, ref, later) })
	step("held after sweep", held)
	// The blocks carved, not MappedBytes: the sweep shrank the emptied
	// index tables, and the refill grows them again.
	before := sts[0].mem.blocks.carved.Load()
	step("refill", func(st *Store, ref Ref) any { return fillSpread(t, st, ref, 2*n, 2*n, later) })
	step("records after refill", records)
	step("held after refill", held)
	if m := sts[0].mem.blocks.carved.Load(); m != before {
		t.Fatalf("refill after the sweep carved %d more bytes: swept blocks were not reused", m-before)
	}

	// Drop partition 0 and fill again.
	step("drop", func(st *Store, _ Ref) any { return st.Drop(0) })
	step("held after drop", held)
	step("refill after drop", func(st *Store, ref Ref) any { return fillSpread(t, st, ref, 4*n, n, later) })
	step("records after drop", records)
	step("held after refill after drop", held)
	if m := sts[0].mem.blocks.carved.Load(); m != before {
		t.Fatalf("refill after Drop carved %d more bytes: dropped blocks were not reused", m-before)
	}
}

// tablesMapped returns the bytes of st's mapped index tables, recounted: it
// checks that each table of tableMinBytes or more is mapped (when st maps
// at all), no smaller one is, and no mapping is left that no table uses.
func tablesMapped(t *testing.T, st *Store) int64 {
	t.Helper()
	b := st.mem.blocks
	var n, tables int64
	forEachSpace(st, func(sp *space) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(sp.index.w) == 0 {
			return
		}
		m, ok := b.tables[&sp.index.w[0]]
		if want := sp.index.bytes() >= tableMinBytes && !b.heap.Load(); ok != want {
			t.Fatalf("a table of %d bytes: mapped %v", sp.index.bytes(), ok)
		}
		if ok {
			n += int64(len(m.aligned))
			tables++
		}
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if int64(len(b.tables)) != tables {
		t.Fatalf("%d tables mapped, %d in use", len(b.tables), tables)
	}
	return n
}

// blocksInUse counts the chunks of st's slabs that are mapped blocks.
func blocksInUse(st *Store) int64 {
	var n int64
	b := st.mem.blocks
	forEachSpace(st, func(sp *space) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for c := range sp.slabs {
			for k := range sp.slabs[c].chunks {
				if ch := sp.slabs[c].chunk(k); cap(ch) == blockBytes && b.owns(ch[:1]) {
					n++
				}
			}
		}
	})
	return n
}

// TestMappedSlabsSurviveCollections checks that garbage collections while
// a store is in use unmap nothing it holds: every record reads back after
// several.
func TestMappedSlabsSurviveCollections(t *testing.T) {
	d, err := window.NewDomain("default", window.DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	st, err := New(Config{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	fillSpread(t, st, ref, 0, 20_000, t0)
	if st.Memory().MappedBytes == 0 {
		t.Skip("this kernel refused to map a region")
	}
	before, _ := st.AppendImage(nil, 0)
	for range 5 {
		runtime.GC()
	}
	after, _ := st.AppendImage(nil, 0)
	if string(before) != string(after) {
		t.Fatal("the store's records changed across garbage collections")
	}
	runtime.KeepAlive(st)
}

// TestMappedSlabsUnmappedWhenUnreachable checks that a store's mapped memory
// goes once nothing can reach the store.
func TestMappedSlabsUnmappedWhenUnreachable(t *testing.T) {
	d, err := window.NewDomain("default", window.DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	blk := func() *blocks {
		st, err := New(Config{Partitions: 1})
		if err != nil {
			t.Fatal(err)
		}
		fillSpread(t, st, st.Bind(d), 0, 20_000, t0)
		if st.Memory().MappedBytes == 0 {
			t.Skip("this kernel refused to map a region")
		}
		return st.mem.blocks
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC() // the cleanup runs on its own goroutine after a cycle
		blk.mu.Lock()
		gone := len(blk.regions) == 0
		blk.mu.Unlock()
		if gone && blk.carved.Load() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still mapped 10 s after the store became unreachable", blk.carved.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFreeBlocksCountTowardTheLimit: blocks kept for reuse are memory the
// store holds, so the limit counts them beside what its slabs hold.
func TestFreeBlocksCountTowardTheLimit(t *testing.T) {
	m := &memory{limit: 100 * blockBytes, blocks: &blocks{}}
	m.held.Store(60 * blockBytes)
	if m.over() {
		t.Fatal("over at 60% of the limit")
	}
	m.blocks.freeBytes.Store(40 * blockBytes)
	if !m.over() {
		t.Fatal("not over with 60% held and 40% in free blocks")
	}
}
