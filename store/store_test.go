package store

import (
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

const t0 = int64(1_790_000_000_000) // unix ms

// keyOf returns a test recipient's key hash and tag (the node hashes with
// xxhash64 and CRC-32C; any good hash does here).
func keyOf(rcp string) (uint64, uint16) {
	h := fnv.New64a()
	h.Write([]byte(rcp))
	k := h.Sum64()
	return k, uint16(crc32.ChecksumIEEE([]byte(rcp)))
}

// newTestStore returns a store of n partitions and a Ref of d in it.
func newTestStore(t testing.TB, d *window.Domain, n int) (*Store, Ref) {
	t.Helper()
	st, err := New(Config{Partitions: n})
	if err != nil {
		t.Fatal(err)
	}
	return st, st.Bind(d)
}

// apply is Apply with the partition computed from the key.
func apply(st *Store, r Ref, key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (uint64, bool, error) {
	return st.Apply(st.PartitionOf(storedKey(key)), r, key, tag, now, it, id, dec)
}

// TestStoreMatchesEngine checks that the store, with its index, slabs and
// size classes, answers exactly as window.Apply on one plain byte slice per
// recipient.
func TestStoreMatchesEngine(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, ref := newTestStore(t, d, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	plain := map[string][]byte{}
	var s window.Scratch
	now := t0
	for op := range 100_000 {
		now += int64(rng.IntN(400))
		rcp := fmt.Sprintf("+86%09d", rng.IntN(300))
		it := window.Item{Content: uint64(rng.IntN(4))}
		if rng.IntN(10) == 0 {
			it.Mode = window.Peek
		}
		key, tag := keyOf(rcp)
		var got, want window.Decision
		if _, _, err := apply(st, ref, key, tag, now, it, 0, &got); err != nil {
			t.Fatal(err)
		}
		out, err := d.Apply(&s, plain[rcp], tag, now, it, &want)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			plain[rcp] = append([]byte(nil), out...)
		}
		if got != want {
			t.Fatalf("op %d %s: store %+v, engine %+v", op, rcp, got, want)
		}
	}
	if s := st.Stats(ref); s.Records != int64(len(plain)) || s.Collisions != 0 {
		t.Fatalf("stats %+v, want %d records", s, len(plain))
	}
}

// TestStoreTellsCollidingRecipientsApart forces two recipients onto one key
// hash: the tag must keep their records apart and the collision be counted.
func TestStoreTellsCollidingRecipientsApart(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "one", Scope: window.ScopeRecipient, Limit: 1, Window: time.Hour}})
	st, ref := newTestStore(t, d, 1)
	const key = 0xdeadbeef
	var dec window.Decision
	for _, tag := range []uint16{1, 2} {
		if _, _, err := apply(st, ref, key, tag, t0, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
			t.Fatalf("tag %d: first send %+v, %v", tag, dec, err)
		}
	}
	for _, tag := range []uint16{1, 2} {
		if _, _, err := apply(st, ref, key, tag, t0+1, window.Item{}, 0, &dec); err != nil || dec.Admitted {
			t.Fatalf("tag %d: second send %+v, %v; want denied", tag, dec, err)
		}
	}
	if s := st.Stats(ref); s.Records != 2 || s.Collisions != 1 {
		t.Fatalf("stats %+v, want 2 records and 1 collision", s)
	}
	// Key 0 is stored as 1; it still works.
	if _, _, err := apply(st, ref, 0, 9, t0, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
		t.Fatalf("key 0: %+v %v", dec, err)
	}
}

func TestSweepReclaimsIdleRecords(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{
		{Name: "a", Scope: window.ScopeRecipient, Limit: 3, Window: time.Minute},
		{Name: "b", Scope: window.ScopeContent, Limit: 1, Window: time.Hour},
	})
	st, ref := newTestStore(t, d, 2)
	var dec window.Decision
	const n = 20_000
	for i := range n {
		key, tag := keyOf(fmt.Sprint(i))
		at := t0
		if i%16 == 0 {
			at = t0 + d.Longest() // one in 16 is newer by a whole window
		}
		if _, _, err := apply(st, ref, key, tag, at, window.Item{Content: 5}, 0, &dec); err != nil {
			t.Fatal(err)
		}
	}
	before := st.Stats(ref)
	got := sweepAll(t, st, ref, t0) // reclaims records whose newest send is at or before t0
	after := st.Stats(ref)
	if left := int64(n / 16); int64(got) != n-left || after.Records != left || after.Expired != n-left {
		t.Fatalf("reclaimed %d, stats %+v; want %d reclaimed and %d left", got, after, n-left, left)
	}
	if after.IndexBytes >= before.IndexBytes {
		t.Fatalf("index did not shrink: %d -> %d bytes", before.IndexBytes, after.IndexBytes)
	}
	// The survivors still answer from their records: a repeat of the same
	// content within the hour is denied.
	for i := 0; i < n; i += 16 {
		key, tag := keyOf(fmt.Sprint(i))
		if _, _, err := apply(st, ref, key, tag, t0+d.Longest()+1, window.Item{Content: 5}, 0, &dec); err != nil || dec.Admitted {
			t.Fatalf("recipient %d after the sweep: %+v, %v; want denied by b", i, dec, err)
		}
	}
}

// TestClosedPartition: a closed partition refuses checks and changes
// nothing; replay, merges and Record still work; Open reopens it.
// CloseAndAppendImage closes in the same hold of the lock as it copies.
func TestClosedPartition(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 10, Window: time.Hour}})
	st, ref := newTestStore(t, d, 4)
	key, tag := keyOf("+8613800000000")
	p := st.PartitionOf(storedKey(key))
	var dec window.Decision
	if _, _, err := apply(st, ref, key, tag, t0, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
		t.Fatalf("open: %+v %v", dec, err)
	}
	img, n := st.CloseAndAppendImage(nil, p)
	if n != 1 || st.IsOpen(p) {
		t.Fatalf("CloseAndAppendImage: %d records, open %v", n, st.IsOpen(p))
	}
	if _, _, err := apply(st, ref, key, tag, t0+1, window.Item{}, 0, &dec); !errors.Is(err, ErrClosed) {
		t.Fatalf("check on a closed partition: %v, want ErrClosed", err)
	}
	if _, _, err := apply(st, ref, key, tag, t0+1, window.Item{Mode: window.Peek}, 0, &dec); !errors.Is(err, ErrClosed) {
		t.Fatalf("peek on a closed partition: %v, want ErrClosed", err)
	}
	// Record numbers the send and remembers its id; the same id again is a
	// duplicate and records nothing.
	seq, dup, err := st.Record(p, ref, key, tag, t0+2, window.Item{}, 77, t0+2)
	if err != nil || dup || seq != st.Seq(p) {
		t.Fatalf("Record: seq %d dup %v %v (partition seq %d)", seq, dup, err, st.Seq(p))
	}
	if _, dup, err := st.Record(p, ref, key, tag, t0+3, window.Item{}, 77, t0+3); err != nil || !dup {
		t.Fatalf("Record of a known id: dup %v %v, want a duplicate", dup, err)
	}
	if _, _, err := st.MergeImage(img, t0+3, bindTo(ref)); err != nil {
		t.Fatal(err)
	}
	st.Open(p)
	if _, _, err := apply(st, ref, key, tag, t0+4, window.Item{Mode: window.Peek}, 0, &dec); err != nil || dec.Rules[0].Used != 2 {
		t.Fatalf("reopened: used %d (%v), want 2: the send applied and the one recorded", dec.Rules[0].Used, err)
	}
}

// TestDuplicateOfACostlyRecordOnlySend: a retry of a record-only send whose
// cost exceeds a limit is answered as the duplicate it is, not refused for
// its cost (which only a check or a peek may not exceed).
func TestDuplicateOfACostlyRecordOnlySend(t *testing.T) {
	d, err := window.NewDomain("fast", []window.Rule{{Name: "c-1-1s", Scope: window.ScopeRecipient, Limit: 1, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	st, ref := newTestStore(t, d, 4)
	key, tag := keyOf("+1")
	it := window.Item{Cost: 2, Mode: window.RecordOnly}
	var dec window.Decision
	if _, dup, err := apply(st, ref, key, tag, t0, it, 42, &dec); err != nil || dup || !dec.Recorded {
		t.Fatalf("first: dup %v, err %v, %+v", dup, err, dec)
	}
	if _, dup, err := apply(st, ref, key, tag, t0+10, it, 42, &dec); err != nil || !dup || !dec.Recorded || dec.At != t0 || dec.Rules[0].Used != 1 {
		t.Fatalf("retry: dup %v, err %v, %+v; want the first decision, used 1 (saturated at the limit)", dup, err, dec)
	}
}

// TestSizeClasses checks the size-class histogram against the records the
// store was given: one class per record size, counts summing to Records,
// reserved bytes summing to SlabBytes, and nothing for another domain.
func TestSizeClasses(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	other, _ := window.NewDomain("other", window.DefaultRules())
	st, ref := newTestStore(t, d, 4)
	otherRef := st.Bind(other)
	now := t0 + 86_400_000
	want := map[int]int64{} // slot size -> records
	var dec window.Decision
	var ws window.Scratch
	for i := range 300 {
		key, tag := keyOf(fmt.Sprintf("+86%011d", i))
		sends := 1 + i%3 // 1, 2 or 3 sends a minute apart: three record sizes
		var plain []byte // the record, kept by the engine alone
		for k := range sends {
			at, it := now+int64(k)*60_000, window.Item{Content: uint64(i*7+k) + 1}
			if _, _, err := apply(st, ref, key, tag, at, it, 0, &dec); err != nil {
				t.Fatal(err)
			}
			out, err := d.Apply(&ws, plain, tag, at, it, &dec)
			if err != nil {
				t.Fatal(err)
			}
			plain = append(plain[:0], out...)
		}
		want[classSizes[sizeClass(len(plain))]]++
	}
	got := st.SizeClasses(ref)
	var records, reserved int64
	for i, c := range got {
		if i > 0 && c.Size <= got[i-1].Size {
			t.Fatalf("classes out of order: %+v", got)
		}
		if c.Records != want[c.Size] {
			t.Errorf("class %d: %d records, want %d", c.Size, c.Records, want[c.Size])
		}
		if c.Reserved < c.Records*int64(c.Size) {
			t.Errorf("class %d: %d bytes reserved for %d records", c.Size, c.Reserved, c.Records)
		}
		records += c.Records
		reserved += c.Reserved
	}
	if len(want) < 2 {
		t.Fatalf("the records fell in %d classes; the test wants several", len(want))
	}
	s := st.Stats(ref)
	if records != s.Records || reserved != s.SlabBytes {
		t.Errorf("histogram sums to %d records, %d bytes; Stats says %d, %d", records, reserved, s.Records, s.SlabBytes)
	}
	if c := st.SizeClasses(otherRef); len(c) != 0 {
		t.Errorf("a domain without records has classes %+v", c)
	}
}

// TestSweepGivesSparseChunksBack checks that a sweep moves the records out
// of a slab's sparse tail chunks and gives those chunks back, on the heap
// and in mapped blocks, changing no record and no later decision.
func TestSweepGivesSparseChunksBack(t *testing.T) {
	onSlabKinds(t, func(t *testing.T, st *Store, ref Ref, d *window.Domain) {
		const n = 20_000
		var dec window.Decision
		var ws window.Scratch
		plain := make([][]byte, n)
		keys := make([]uint64, n)
		tags := make([]uint16, n)
		send := func(i int, at int64) {
			it := window.Item{Content: uint64(i) + 1}
			var sd window.Decision
			if _, _, err := apply(st, ref, keys[i], tags[i], at, it, 0, &sd); err != nil {
				t.Fatal(err)
			}
			out, err := d.Apply(&ws, plain[i], tags[i], at, it, &dec)
			if err != nil {
				t.Fatal(err)
			}
			if sd != dec {
				t.Fatalf("recipient %d at %d: store decides %+v, engine %+v", i, at, sd, dec)
			}
			if out != nil {
				plain[i] = append(plain[i][:0], out...)
			}
		}
		for i := range n {
			keys[i], tags[i] = keyOf(fmt.Sprintf("+86%011d", i))
			send(i, t0+int64(i))
		}
		first := st.SizeClasses(ref)[0] // every record has one send: one class
		for i := range n {
			if i%10 != 0 { // 90% move up a class, leaving the first sparse
				send(i, t0+n+int64(i))
			}
		}
		before, heldBefore := st.Stats(ref), st.Memory().HeldBytes
		if got := sweepAll(t, st, ref, 0); got != 0 {
			t.Fatalf("reclaimed %d", got)
		}
		after, heldAfter := st.Stats(ref), st.Memory().HeldBytes
		if after.Moved == 0 || after.Records != n {
			t.Fatalf("after the sweep: %+v", after)
		}
		var firstAfter ClassStats
		for _, c := range st.SizeClasses(ref) {
			if c.Size == first.Size {
				firstAfter = c
			}
		}
		if firstAfter.Records != n/10 || firstAfter.Reserved >= first.Reserved/4 {
			t.Errorf("class %d: %+v before the moves up, %+v after the sweep", first.Size, first, firstAfter)
		}
		if freed := before.SlabBytes - after.SlabBytes; freed < first.Reserved/2 || heldBefore-heldAfter != freed {
			t.Errorf("slabs %d -> %d bytes, held %d -> %d", before.SlabBytes, after.SlabBytes, heldBefore, heldAfter)
		}
		seen := 0
		st.ForEach(0, func(_ string, key uint64, rec []byte) bool {
			for i := range n {
				if storedKey(keys[i]) == key {
					if string(rec[:len(plain[i])]) != string(plain[i]) {
						t.Fatalf("recipient %d: store holds %x, engine %x", i, rec[:len(plain[i])], plain[i])
					}
					seen++
					break
				}
			}
			return seen < 200 // a sample: the decisions below check every record
		})
		if held := heldNow(st); held != heldAfter {
			t.Errorf("held account %d, recount %d", heldAfter, held)
		}
		if got := sweepAll(t, st, ref, 0); got != 0 || st.Stats(ref).Moved != after.Moved {
			t.Errorf("a second sweep reclaimed %d and moved %d more", got, st.Stats(ref).Moved-after.Moved)
		}
		// New records of the first class fill the slots and chunks given
		// back before the store carves any new block (the index, which
		// grows with them, may map a larger table).
		mapped := st.mem.blocks.carved.Load()
		for i := range n {
			if i%10 != 0 {
				k, tag := keyOf(fmt.Sprintf("+87%011d", i))
				if _, _, err := apply(st, ref, k, tag, t0+2*n, window.Item{Content: 1}, 0, &dec); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got := st.mem.blocks.carved.Load(); got != mapped {
			t.Errorf("refilling the class carved %d bytes more", got-mapped)
		}
		for i := range n {
			send(i, t0+3*n+int64(i))
		}
		if got := sweepAll(t, st, ref, 0); got != 0 {
			t.Fatalf("reclaimed %d", got)
		}
		if held := heldNow(st); held != st.Memory().HeldBytes {
			t.Errorf("held account %d, recount %d", st.Memory().HeldBytes, held)
		}
	})
}

// TestSweepAbandonsADefragmentationARecordLanded checks that a sweep pass
// gives no chunk back while a record sits in it: a record created, between
// two steps of the pass, in a slot past the ceiling makes the pass abandon
// its plan, changing no record, and the next pass gives the chunks back.
func TestSweepAbandonsADefragmentationARecordLanded(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, ref := newTestStore(t, d, 1)
	const n = 20_000
	var dec window.Decision
	key := func(i int) (uint64, uint16) { return keyOf(fmt.Sprintf("+86%011d", i)) }
	for i := range n {
		k, tag := key(i)
		if _, _, err := apply(st, ref, k, tag, t0, window.Item{Content: 1}, 0, &dec); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if i%10 != 0 { // leave the first class sparse
			k, tag := key(i)
			if _, _, err := apply(st, ref, k, tag, t0+1, window.Item{Content: 2}, 0, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := st.Stats(ref)
	pos, _, err := st.Sweep(0, ref, 0, 0, 100) // plans, moves some
	if err != nil || pos < 0 {
		t.Fatalf("first step: %d %v", pos, err)
	}
	if live := st.Stats(ref).LiveBytes; live != before.LiveBytes {
		t.Errorf("with a defragmentation planned, %d bytes of slots in use; %d before", live, before.LiveBytes)
	}
	sp := st.parts[0].space(ref.id, false)
	var planned *slab
	for c := range sp.slabs {
		if sp.slabs[c].ceiling != 0 {
			planned = &sp.slabs[c]
		}
	}
	if planned == nil {
		t.Fatal("no slab planned a defragmentation")
	}
	// New recipients until one lands in a fresh slot, past the ceiling.
	for i, next := n, planned.next; planned.next == next; i++ {
		k, tag := key(i)
		if _, _, err := apply(st, ref, k, tag, t0+2, window.Item{Content: 1}, 0, &dec); err != nil {
			t.Fatal(err)
		}
	}
	for pos >= 0 {
		if pos, _, err = st.Sweep(0, ref, pos, 0, 100); err != nil {
			t.Fatal(err)
		}
	}
	mid := st.Stats(ref)
	if planned.ceiling != 0 || len(planned.high) != 0 || mid.SlabBytes < before.SlabBytes {
		t.Fatalf("the pass gave chunks back with a record in them: slabs %d -> %d bytes", before.SlabBytes, mid.SlabBytes)
	}
	if held := heldNow(st); held != st.Memory().HeldBytes {
		t.Errorf("held account %d, recount %d", st.Memory().HeldBytes, held)
	}
	sweepAll(t, st, ref, 0)
	if after := st.Stats(ref); after.SlabBytes >= mid.SlabBytes || after.Records != mid.Records {
		t.Errorf("the next pass: slabs %d -> %d bytes, records %d -> %d", mid.SlabBytes, after.SlabBytes, mid.Records, after.Records)
	}
	for i := range n + 100 {
		k, tag := key(i)
		var pd window.Decision
		if _, _, err := apply(st, ref, k, tag, t0+3, window.Item{Mode: window.Peek}, 0, &pd); err != nil {
			t.Fatalf("recipient %d: %v", i, err)
		}
	}
}

// TestSweepCompactsDeadContent checks that a sweep drops the content logs
// that no rule can count any more, exactly as window.Domain.Compact does,
// changing no later decision; that compactions count against a sweep step's
// budget; and that the slots they leave are given back: slab memory falls
// once a second pass has defragmented the classes the records left.
func TestSweepCompactsDeadContent(t *testing.T) {
	onSlabKinds(t, func(t *testing.T, st *Store, ref Ref, d *window.Domain) {
		const n = 3000
		const contentWindow = 59 * 60_000
		var dec window.Decision
		var ws window.Scratch
		plain := make([][]byte, n) // each recipient's record, kept by the engine alone
		keys := make([][2]uint64, n)
		// 3 sends an hour apart, the newest at t0+2h+i ms; every third
		// recipient sends a fourth time 2 hours later.
		record := func(i int, at int64, it window.Item) {
			key, tag := uint64(keys[i][0]), uint16(keys[i][1])
			if _, _, err := apply(st, ref, key, tag, at, it, 0, &dec); err != nil {
				t.Fatal(err)
			}
			out, err := d.Apply(&ws, plain[i], tag, at, it, &dec)
			if err != nil {
				t.Fatal(err)
			}
			plain[i] = append(plain[i][:0], out...)
		}
		for i := range n {
			key, tag := keyOf(fmt.Sprintf("+86%011d", i))
			keys[i] = [2]uint64{key, uint64(tag)}
			for k := range 3 {
				record(i, t0+int64(k)*3_600_000+int64(i), window.Item{Content: uint64(i*4+k) + 1})
			}
		}
		sweep := func(now int64, budget int) (steps int) {
			for pos := 0; pos >= 0; steps++ {
				var err error
				if pos, _, err = st.Sweep(0, ref, pos, now, budget); err != nil {
					t.Fatal(err)
				}
			}
			return steps
		}
		sweep(t0+2*3_600_000+contentWindow-1, 2048) // the newest send of recipient 0 is still inside
		if s := st.Stats(ref); s.Compacted != 0 {
			t.Fatalf("compacted %d records inside their content window", s.Compacted)
		}
		for i := 0; i < n; i += 3 {
			record(i, t0+4*3_600_000+int64(i), window.Item{Content: uint64(i*4+3) + 1})
		}
		before := st.Stats(ref)
		now := t0 + 2*3_600_000 + n + contentWindow
		steps := sweep(now, 64)
		s := st.Stats(ref)
		if want := int64(n - n/3); s.Compacted != want || s.Records != n || s.Expired != 0 || s.Unreadable != 0 {
			t.Fatalf("after the content window: %+v, want %d compacted and every record kept", s, want)
		}
		if s.LiveBytes >= before.LiveBytes {
			t.Errorf("slots in use: %d bytes before, %d after", before.LiveBytes, s.LiveBytes)
		}
		if min := int(s.Compacted) * compactCost / 64; steps < min {
			t.Errorf("%d sweep steps of budget 64 for %d compactions; want at least %d", steps, s.Compacted, min)
		}
		sweep(now, 2048) // defragments the classes the compacted records left
		after := st.Stats(ref)
		if after.Compacted != s.Compacted {
			t.Errorf("a second sweep compacted again: %d", after.Compacted-s.Compacted)
		}
		if after.SlabBytes >= before.SlabBytes {
			t.Errorf("slab bytes %d before the compaction, %d after two passes", before.SlabBytes, after.SlabBytes)
		}
		if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
			t.Errorf("running count %d, recount %d", got, want)
		}
		t.Logf("slabs %d -> %d bytes, slots in use %d -> %d bytes, %d moved", before.SlabBytes, after.SlabBytes, before.LiveBytes, after.LiveBytes, after.Moved)
		for i := range n {
			want, ok, err := d.Compact(&ws, plain[i], now)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				want = plain[i]
			}
			want = append([]byte(nil), want...)
			var got []byte
			st.ForEach(0, func(_ string, key uint64, rec []byte) bool {
				if key == storedKey(keys[i][0]) {
					got = append([]byte(nil), rec[:min(len(rec), len(want))]...)
					return false
				}
				return true
			})
			if string(got) != string(want) {
				t.Fatalf("recipient %d: store holds %x, engine compacts to %x", i, got, want)
			}
			// A later send is decided as on the uncompacted record.
			at, it := now+int64(i), window.Item{Content: uint64(i*4+2) + 1}
			var sd, pd window.Decision
			if _, _, err := apply(st, ref, keys[i][0], uint16(keys[i][1]), at, it, 0, &sd); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Apply(&ws, plain[i], uint16(keys[i][1]), at, it, &pd); err != nil {
				t.Fatal(err)
			}
			if sd != pd {
				t.Fatalf("recipient %d: store decides %+v, engine on the uncompacted record %+v", i, sd, pd)
			}
		}
	})
}

// TestSweepCompactsPastADefragmentationCeiling compacts records while a
// pass defragments: half the recipients expire in a first pass, which
// leaves their slabs sparse; the second pass plans to give chunks back and
// compacts the other half, many of them past the ceiling. Memory accounting
// must equal a recount, every later decision the engine's, and the slabs
// must end below where the first pass left them.
func TestSweepCompactsPastADefragmentationCeiling(t *testing.T) {
	onSlabKinds(t, func(t *testing.T, st *Store, ref Ref, d *window.Domain) {
		const n = 12000
		var dec window.Decision
		var ws window.Scratch
		plain := make([][]byte, n)
		keys := make([]uint64, n)
		tags := make([]uint16, n)
		for i := range n {
			keys[i], tags[i] = keyOf(fmt.Sprintf("+1%011d", i))
			base := t0 - 2*3_600_000
			if i >= n/2 {
				base = t0 + 23*3_600_000 + 30*60_000 - 2*3_600_000
			}
			for k := range 3 {
				at, it := base+int64(k)*3_600_000, window.Item{Content: uint64(i*4+k) + 1}
				if _, _, err := apply(st, ref, keys[i], tags[i], at, it, 0, &dec); err != nil {
					t.Fatal(err)
				}
				out, err := d.Apply(&ws, plain[i], tags[i], at, it, &dec)
				if err != nil {
					t.Fatal(err)
				}
				plain[i] = append(plain[i][:0], out...)
			}
		}
		sweep := func(now int64) {
			for pos := 0; pos >= 0; {
				var err error
				if pos, _, err = st.Sweep(0, ref, pos, now, 2048); err != nil {
					t.Fatal(err)
				}
			}
		}
		p1 := t0 + 24*3_600_000 + 1
		sweep(p1)
		s1 := st.Stats(ref)
		p2 := t0 + 24*3_600_000 + 30*60_000 + 1
		sweep(p2)
		s2 := st.Stats(ref)
		sweep(p2)
		s3 := st.Stats(ref)
		if s1.Expired != n/2 || s1.Compacted != 0 {
			t.Fatalf("first pass: %+v, want %d expired and none compacted", s1, n/2)
		}
		if s3.Compacted != s2.Compacted || s3.SlabBytes >= s1.SlabBytes {
			t.Errorf("third pass: %+v; slab bytes after the first %d", s3, s1.SlabBytes)
		}
		if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
			t.Errorf("held %d recount %d", got, want)
		}
		if s2.Compacted != n/2 || s2.Records != n/2 {
			t.Fatalf("%+v", s2)
		}
		for i := n / 2; i < n; i++ {
			at, it := p2+int64(i), window.Item{Content: uint64(i*4+2) + 1}
			var sd, pd window.Decision
			if _, _, err := apply(st, ref, keys[i], tags[i], at, it, 0, &sd); err != nil {
				t.Fatal(i, err)
			}
			if _, err := d.Apply(&ws, plain[i], tags[i], at, it, &pd); err != nil {
				t.Fatal(err)
			}
			if sd != pd {
				t.Fatalf("%d: %+v vs %+v", i, sd, pd)
			}
		}
		if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
			t.Errorf("held %d recount %d", got, want)
		}
	})
}

// TestSweepCompactsAtTheLimitOnlyIntoFreeSlots: past the memory limit a
// compaction that would need a fresh chunk waits (the slot it leaves is
// given back only by a later pass), and one that finds a free slot goes
// ahead.
func TestSweepCompactsAtTheLimitOnlyIntoFreeSlots(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, err := New(Config{Partitions: 1, MaxBytes: 1}) // always over
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	const n = 200
	key := func(i int) (uint64, uint16) { return keyOf(fmt.Sprintf("+44%09d", i)) }
	for i := range n { // one send with content each: compacts to a smaller class
		k, tag := key(i)
		if _, _, err := st.Record(0, ref, k, tag, t0+int64(i), window.Item{Content: uint64(i) + 1}, 0, t0); err != nil {
			t.Fatal(err)
		}
	}
	now := t0 + n + 2*3_600_000
	sweep := func() { sweepAll(t, st, ref, now-ref.rules.Longest()) }
	sweep()
	if s := st.Stats(ref); s.Compacted != 0 {
		t.Fatalf("at the limit with no free slot of the smaller class, %d records compacted", s.Compacted)
	}
	// Free slots of that class: recipients whose records have the size of
	// a compacted one (one send, no content), which then expire.
	for i := n; i < 2*n; i++ {
		k, tag := key(i)
		if _, _, err := st.Record(0, ref, k, tag, t0-2*86_400_000, window.Item{}, 0, t0); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	s := st.Stats(ref)
	if s.Compacted == 0 || s.Compacted > n || s.Expired != n {
		t.Fatalf("with %d free slots of the smaller class: %+v", n, s)
	}
	if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
		t.Errorf("running count %d, recount %d", got, want)
	}
}

// TestSweepCompactsAtTheLimitWithAFullIndex: a compaction never adds an
// index entry, so past the memory limit it takes a free slot of the
// smaller class even when the index is at its growth threshold.
func TestSweepCompactsAtTheLimitWithAFullIndex(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, err := New(Config{Partitions: 1, MaxBytes: 1}) // always over
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	next := 0
	record := func(at int64, content uint64) {
		k, tag := keyOf(fmt.Sprintf("+45%09d", next))
		next++
		if _, _, err := st.Record(0, ref, k, tag, at, window.Item{Content: content}, 0, t0); err != nil {
			t.Fatal(err)
		}
	}
	sweep := func(now int64) { sweepAll(t, st, ref, now-ref.rules.Longest()) }
	// Free slots of the class a compacted record takes (one send, no
	// content): 40 such records expire, one stays so that the class keeps
	// its chunk.
	for range 40 {
		record(t0-2*86_400_000, 0)
	}
	record(t0, 0)
	sweep(t0)
	if s := st.Stats(ref); s.Expired != 40 {
		t.Fatalf("expired %d, want 40", s.Expired)
	}
	// Records with content, until the index is at its growth threshold.
	sp := st.parts[0].space(ref.id, false)
	for i := uint64(1); sp.index.hasRoom(); i++ {
		record(t0+int64(i), i)
	}
	// The class of the record kept: the one a compacted record takes.
	k, tag := keyOf(fmt.Sprintf("+45%09d", 40))
	pos, _, _ := sp.lookup(storedKey(k), tag)
	small := &sp.slabs[sp.index.ref(pos).class()]
	chunks := len(small.chunks)
	sweep(t0 + 2*3_600_000) // their content logs are dead, their sends not
	if s := st.Stats(ref); s.Compacted == 0 {
		t.Fatal("with 40 free slots of the smaller class and a full index, no record compacted")
	}
	if len(small.chunks) != chunks {
		t.Errorf("compactions at the limit took the smaller class from %d chunks to %d", chunks, len(small.chunks))
	}
	if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
		t.Errorf("running count %d, recount %d", got, want)
	}
}

// TestSweepLeavesAnUnreadableRecord: a record whose header reads but whose
// body does not decode is left as it is, counted once per pass, and the
// sweep goes on to compact the others.
func TestSweepLeavesAnUnreadableRecord(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, ref := newTestStore(t, d, 1)
	var dec window.Decision
	const n = 50
	for i := range n { // two sends each, the second with content
		k, tag := keyOf(fmt.Sprintf("+49%09d", i))
		for j := range 2 {
			if _, _, err := apply(st, ref, k, tag, t0+int64(j)*60_000, window.Item{Content: uint64(i*2+j) + 1}, 0, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	var bad []byte
	st.ForEach(0, func(_ string, _ uint64, rec []byte) bool {
		bad = rec // the slot itself
		return false
	})
	// Bits 65-70 hold the recipient log's gap width (after the tag, the
	// newest send, the count and the age flag): 63 is out of range.
	bad[8] |= 0x7e
	before := append([]byte(nil), bad...)
	now := t0 + 2*3_600_000
	for pass := range 2 {
		for pos := 0; pos >= 0; {
			var err error
			if pos, _, err = st.Sweep(0, ref, pos, now, 2048); err != nil {
				t.Fatal(err)
			}
		}
		s := st.Stats(ref)
		if s.Unreadable != 1 || s.Compacted != n-1 || s.Records != n {
			t.Fatalf("pass %d: %+v, want 1 unreadable, %d compacted, %d records", pass, s, n-1, n)
		}
	}
	var after []byte
	st.ForEach(0, func(_ string, _ uint64, rec []byte) bool {
		if string(rec[:len(before)]) == string(before) {
			after = rec
		}
		return after == nil
	})
	if after == nil {
		t.Fatal("the unreadable record changed")
	}
}

// onSlabKinds runs f as two subtests, each on a one-partition store of the
// default rules, with slabs in mapped blocks (heap=false) and on the heap.
func onSlabKinds(t *testing.T, f func(t *testing.T, st *Store, ref Ref, d *window.Domain)) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	for _, heap := range []bool{false, true} {
		t.Run(fmt.Sprintf("heap=%v", heap), func(t *testing.T) {
			st, err := New(Config{Partitions: 1, HeapSlabs: heap})
			if err != nil {
				t.Fatal(err)
			}
			f(t, st, st.Bind(d), d)
		})
	}
}
