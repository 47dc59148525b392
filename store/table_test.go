package store

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestTableMatchesMap drives the index with random inserts and removals,
// including many entries that share a key, against a plain map.
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	var tb table
	want := map[ref]uint64{} // every entry is unique by its ref
	next := ref(1)
	keys := []uint64{}
	for op := range 60_000 {
		switch {
		case rng.IntN(3) > 0 || len(want) == 0:
			var k uint64
			if len(keys) > 0 && rng.IntN(20) == 0 {
				k = keys[rng.IntN(len(keys))] // a second entry with the same key
			} else {
				k = rng.Uint64() | 1
				if rng.IntN(64) == 0 {
					k = k&^0xffffffff | 7 // crowd one home slot: a long probe run
				}
				keys = append(keys, k)
			}
			tb.insert(k, next)
			want[next] = k
			next++
		default:
			k := keys[rng.IntN(len(keys))]
			pos := tb.find(k, -1)
			if pos < 0 {
				continue
			}
			delete(want, tb.ref(pos))
			tb.remove(pos)
		}
		if op%10_000 == 0 {
			checkTable(t, &tb, want)
			tb.shrink()
		}
	}
	checkTable(t, &tb, want)
	for r, k := range want { // remove everything, then shrink
		for pos := tb.find(k, -1); pos >= 0; pos = tb.find(k, pos+1) {
			if tb.ref(pos) == r {
				tb.remove(pos)
				break
			}
		}
	}
	tb.shrink()
	if tb.n != 0 || tb.len > 4*minTableLen {
		t.Fatalf("after removing everything: %d entries, length %d", tb.n, tb.len)
	}
}

func checkTable(t *testing.T, tb *table, want map[ref]uint64) {
	t.Helper()
	if tb.n != len(want) {
		t.Fatalf("table holds %d entries, want %d", tb.n, len(want))
	}
	for r, k := range want {
		found := false
		for pos := tb.find(k, -1); pos >= 0; pos = tb.find(k, pos+1) {
			if tb.ref(pos) == r {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("entry %d (key %x) unreachable", r, k)
		}
	}
	if load := float64(tb.n) / float64(tb.len); load > maxLoad {
		t.Fatalf("load %.2f above %.2f", load, maxLoad)
	}
}

// TestSlabLocateDivides checks locate's multiply-shift division against
// plain division for every class, up to the last slot a class can hold.
func TestSlabLocateDivides(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, size := range classSizes {
		s := newSlab(size, nil, nil)
		for range 2000 {
			i := s.base + rng.Uint32N(maxSlots-s.base)
			if rng.IntN(4) == 0 {
				i = maxSlots - 1 - rng.Uint32N(4)
			}
			j := i - s.base
			c, off := s.locate(i)
			if c != int(s.grow)+int(j/s.per) || off != int(j%s.per)*size {
				t.Fatalf("size %d slot %d: chunk %d offset %d, want %d %d", size, i, c, off, int(s.grow)+int(j/s.per), int(j%s.per)*size)
			}
		}
	}
}

func TestSlabSlotsAreDisjoint(t *testing.T) {
	for _, size := range []int{4, 8, 116, 136, 252, 256, 4112, classSizes[len(classSizes)-1]} {
		s := newSlab(size, nil, nil)
		size := s.size
		seen := map[[2]int]bool{}
		n := 3 * maxChunkBytes / size * 3 // well past the doubling chunks
		for i := range n {
			slot, err := s.alloc()
			if err != nil || slot != uint32(i) {
				t.Fatalf("size %d: alloc %d = %d, %v", size, i, slot, err)
			}
			c, off := s.locate(slot)
			if off < 0 || off+size > len(s.chunk(c)) || off%size != 0 || seen[[2]int{c, off}] {
				t.Fatalf("size %d slot %d: chunk %d offset %d (chunk %d bytes) overlaps or overruns", size, slot, c, off, len(s.chunk(c)))
			}
			seen[[2]int{c, off}] = true
			s.bytes(slot)[0] = byte(i)
		}
		// A class larger than maxChunkBytes gets chunks of one slot.
		for k := range s.chunks {
			if c := s.chunk(k); len(c) > max(maxChunkBytes, size) || (k >= int(s.grow) && len(c) <= maxChunkBytes-size) {
				t.Fatalf("size %d: chunk %d of %d bytes, not the most slots that fit %d", size, k, len(c), maxChunkBytes)
			}
		}
		s.release(5)
		if got, _ := s.alloc(); got != 5 {
			t.Fatalf("size %d: freed slot not reused: got %d", size, got)
		}
		for i := range uint32(n) {
			s.release(i)
		}
		s.trim()
		if s.chunks != nil || s.next != 0 || s.reserved() != 0 {
			t.Fatalf("size %d: an empty slab keeps %d bytes", size, s.reserved())
		}
	}
}

func TestSizeClass(t *testing.T) {
	for n := 1; n <= classSizes[len(classSizes)-1]; n++ {
		c := sizeClass(n)
		if classSizes[c] < n || (c > 0 && classSizes[c-1] >= n) {
			t.Fatalf("sizeClass(%d) = %d (%d bytes), not the smallest that holds it", n, c, classSizes[c])
		}
	}
	if len(classSizes) >= 1<<refClassBits {
		t.Fatalf("%d classes do not fit %d bits of a ref", len(classSizes), refClassBits)
	}
}

// TestSlabAbandonedDefragKeepsTailFree checks that a defragmentation given
// up puts the tail's free slots back behind the others: alloc hands out
// every free slot below the old ceiling before one at or past it, and the
// heap account still matches what the slab holds.
func TestSlabAbandonedDefragKeepsTailFree(t *testing.T) {
	var held atomic.Int64
	s := newSlab(100, &held, nil)
	n := 6 * int(s.per)
	for range n {
		if _, err := s.alloc(); err != nil {
			t.Fatal(err)
		}
	}
	// Free every third slot, and the whole last two chunks' worth.
	for i := range uint32(n) {
		if i%3 == 0 || i >= uint32(n)-2*s.per {
			s.release(i)
		}
	}
	if !s.planDefrag() {
		t.Fatal("no defragmentation planned")
	}
	ceiling := s.ceiling
	low := 0
	for _, i := range s.free {
		if i < ceiling {
			low++
		}
	}
	s.abandonDefrag()
	if s.ceiling != 0 || s.high != nil {
		t.Fatalf("plan still set: ceiling %d, %d high slots", s.ceiling, len(s.high))
	}
	if held.Load() != s.reserved() {
		t.Fatalf("heap account %d bytes, slab reserves %d", held.Load(), s.reserved())
	}
	for k := range low {
		if i, _ := s.alloc(); i >= ceiling {
			t.Fatalf("alloc %d of %d free slots below the ceiling %d handed out slot %d", k, low, ceiling, i)
		}
	}
	if i, _ := s.alloc(); i < ceiling {
		t.Fatalf("slot %d below the ceiling %d after its free slots ran out", i, ceiling)
	}
}
