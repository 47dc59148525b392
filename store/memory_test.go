package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// heldNow recounts, from the structures themselves, the heap a store holds:
// what its running count must equal.
func heldNow(st *Store) int64 {
	var n int64
	forEachSpace(st, func(sp *space) { n += sp.heldBytes() })
	return n
}

// forEachSpace calls fn with every space of st, under its partition's lock.
func forEachSpace(st *Store, fn func(sp *space)) {
	for p := range st.parts {
		pt := &st.parts[p]
		pt.mu.Lock()
		for _, sp := range pt.spaces {
			if sp != nil {
				fn(sp)
			}
		}
		pt.mu.Unlock()
	}
}

// images returns every partition's image, for comparing a store's whole
// state (deterministic when no request ids are remembered).
func images(st *Store) [][]byte {
	var out [][]byte
	for p := range st.Partitions() {
		img, _ := st.AppendImage(nil, p)
		out = append(out, img)
	}
	return out
}

// TestMemoryAccountIsExact runs checks with request ids, sweeps, merges and
// drops, and after each step compares the running count of held bytes with
// a recount of the structures; it must also cover the slabs and the index
// as Stats reports them.
func TestMemoryAccountIsExact(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, err := New(Config{Partitions: 8, IDCapacity: 4096})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	check := func(step string) {
		t.Helper()
		got, want := st.Memory().HeldBytes, heldNow(st)
		if got != want {
			t.Fatalf("%s: running count %d bytes, recount %d", step, got, want)
		}
		s := st.Stats(ref)
		if got < s.IndexBytes+s.SlabBytes {
			t.Fatalf("%s: held %d bytes, below index %d + slabs %d", step, got, s.IndexBytes, s.SlabBytes)
		}
	}
	check("empty")
	rng := rand.New(rand.NewPCG(3, 4))
	var dec window.Decision
	now := t0
	for i := range 30_000 {
		now += int64(rng.IntN(20))
		key, tag := keyOf(fmt.Sprintf("+86%09d", rng.IntN(5000)))
		id := uint64(0)
		if i%3 == 0 {
			id = uint64(i + 1)
		}
		if _, _, err := apply(st, ref, key, tag, now, window.Item{Content: uint64(rng.IntN(6))}, id, &dec); err != nil {
			t.Fatal(err)
		}
	}
	check("after checks")
	img, _ := st.AppendImage(nil, 3)
	sweepAll(t, st, ref, now-d.Longest()/2) // reclaims nothing of the day's rule, but walks every table
	sweepAll(t, st, ref, now+1)             // reclaims everything: slabs trimmed, tables shrunk
	check("after sweeps")
	if _, _, err := st.MergeImage(img, now, bindTo(ref)); err != nil {
		t.Fatal(err)
	}
	check("after a merge")
	for p := range st.Partitions() {
		st.Drop(p)
	}
	check("after drops")
	if got := st.Memory().HeldBytes; got != 0 {
		t.Fatalf("an empty store holds %d bytes", got)
	}
}

// TestMemoryLimitRefusesNewRecipients fills a store to its limit: a new
// recipient is refused with ErrMemoryLimit and changes nothing; a known
// recipient's send is recorded when its record's slot holds it and refused
// like a new recipient's when the record would grow past the memory held,
// and denials are answered; peeks are answered; replay, backups and merges
// never refuse and count their overshoots; reclaimed room is used again.
func TestMemoryLimitRefusesNewRecipients(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 3, Window: time.Hour}})
	const limit = 64 << 10
	st, err := New(Config{Partitions: 1, MaxBytes: limit}) // one partition: after one refusal, the next new recipient finds no room either
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	var dec window.Decision
	var known []string
	now := t0
	for i := 0; ; i++ {
		if i > 100_000 {
			t.Fatalf("no refusal after %d recipients: the store holds %d bytes, limit %d", i, st.Memory().HeldBytes, limit)
		}
		rcp := fmt.Sprintf("+86%09d", i)
		key, tag := keyOf(rcp)
		_, _, err := apply(st, ref, key, tag, now, window.Item{}, 0, &dec)
		if errors.Is(err, ErrMemoryLimit) {
			break
		}
		if err != nil || !dec.Admitted {
			t.Fatalf("recipient %d: %+v, %v", i, dec, err)
		}
		known = append(known, rcp)
	}
	if m := st.Memory(); m.HeldBytes < limit || m.Refused != 1 || m.MaxBytes != limit {
		t.Fatalf("at the first refusal: %+v, want at least %d held and 1 refused", m, limit)
	}

	// A refusal changes nothing, for any mode that would create a record.
	before, stats, seqs := images(st), st.Stats(ref), make([]uint64, st.Partitions())
	for p := range seqs {
		seqs[p] = st.Seq(p)
	}
	held := st.Memory().HeldBytes
	for i, mode := range []window.Mode{window.CheckAndRecord, window.RecordOnly} {
		key, tag := keyOf(fmt.Sprintf("+1%09d", i))
		seq, dup, err := apply(st, ref, key, tag, now, window.Item{Mode: mode}, 99, &dec)
		if !errors.Is(err, ErrMemoryLimit) || seq != 0 || dup || dec.Recorded {
			t.Fatalf("new recipient, mode %v: seq %d dup %v recorded %v %v; want ErrMemoryLimit", mode, seq, dup, dec.Recorded, err)
		}
		for _, want := range []string{"holds", fmt.Sprint(limit)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
	after := images(st)
	for p := range before {
		if !bytes.Equal(before[p], after[p]) || st.Seq(p) != seqs[p] {
			t.Fatalf("partition %d changed by refused items (seq %d -> %d)", p, seqs[p], st.Seq(p))
		}
	}
	if s := st.Stats(ref); s != stats || st.Memory().HeldBytes != held {
		t.Fatalf("refused items changed the store: stats %+v -> %+v, held %d -> %d", stats, s, held, st.Memory().HeldBytes)
	}
	if got := st.Memory().Refused; got != 3 {
		t.Fatalf("refused %d, want 3", got)
	}

	// A peek creates nothing: it is answered.
	key, tag := keyOf("+1999999999")
	if _, _, err := apply(st, ref, key, tag, now, window.Item{Mode: window.Peek}, 0, &dec); err != nil || !dec.Admitted || dec.Rules[0].Used != 0 {
		t.Fatalf("peek of a new recipient: %+v, %v", dec, err)
	}

	// Known recipients are decided, within the memory the store holds: a
	// send their record's slot holds is recorded; one that would move the
	// record to a larger slot, with none free, is refused as a new
	// recipient is, and changes nothing; the store holds no more after them.
	held = st.Memory().HeldBytes
	sends := map[string]int{} // recorded sends per known recipient
	var recorded, refused int
	for _, rcp := range known {
		key, tag := keyOf(rcp)
		sends[rcp] = 1
		for k := 1; k <= 2; k++ {
			img := images(st)[0]
			seq, _, err := apply(st, ref, key, tag, now+int64(k), window.Item{}, 0, &dec)
			switch {
			case errors.Is(err, ErrMemoryLimit):
				refused++
				if seq != 0 || dec.Recorded || !bytes.Equal(img, images(st)[0]) {
					t.Fatalf("known %s send %d refused, but seq %d recorded %v or the image changed", rcp, k+1, seq, dec.Recorded)
				}
				if !strings.Contains(err.Error(), "would grow") {
					t.Errorf("error %q does not say the record would grow", err)
				}
			case err != nil || !dec.Admitted || seq == 0:
				t.Fatalf("known %s send %d: %+v seq %d, %v", rcp, k+1, dec, seq, err)
			default:
				recorded++
				sends[rcp]++
			}
			if got := st.Memory().HeldBytes; got > held {
				t.Fatalf("known %s send %d: held %d -> %d bytes past the limit", rcp, k+1, held, got)
			}
		}
	}
	if m := st.Memory(); refused == 0 || recorded == 0 || m.Refused != int64(3+refused) || m.RefusedGrowth != int64(refused) {
		t.Fatalf("known recipients at the limit: %d sends recorded, %d refused; %+v, want some of each, counted", recorded, refused, m)
	}
	// A denial grows nothing: it is answered at the limit. (The limit is
	// lifted while the known recipients reach their rule's 3 sends.)
	st.mem.limit = 0
	for rcp, n := range sends {
		key, tag := keyOf(rcp)
		for ; n < 3; n++ {
			if _, _, err := apply(st, ref, key, tag, now+3, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
				t.Fatalf("known %s below the limit: %+v, %v", rcp, dec, err)
			}
		}
	}
	st.mem.limit = limit
	for _, rcp := range known {
		key, tag := keyOf(rcp)
		if seq, _, err := apply(st, ref, key, tag, now+4, window.Item{}, 0, &dec); err != nil || dec.Admitted || seq != 0 {
			t.Fatalf("known %s 4th send at the limit: %+v seq %d, %v; want denied by the rule", rcp, dec, seq, err)
		}
	}
	if got := st.Memory().RefusedGrowth; got != int64(refused) {
		t.Fatalf("refused %d growths after denials, want still %d", got, refused)
	}

	// Replay, backups and merges of new recipients are never refused. They
	// go on past the room the store has left (free slots of the sizes they
	// need, the index's room below its fill limit) until one of them
	// overshoots the limit: each kind at least 100 times.
	other, _ := New(Config{Partitions: 1})
	oref := other.Bind(d)
	added := 0
	for ; added < 300 || st.Memory().Overshoots == 0; added++ {
		if added == 100_000 {
			t.Fatalf("no overshoot after %d replayed or recorded recipients: %+v", added, st.Memory())
		}
		key, tag := keyOf(fmt.Sprintf("+44%09d", added))
		p := st.PartitionOf(storedKey(key))
		switch added % 3 {
		case 0:
			if err := st.Insert(p, ref, key, tag, now, window.Item{}, st.Seq(p)+1, 0, now); err != nil {
				t.Fatalf("Insert past the limit: %v", err)
			}
		case 1:
			if _, _, err := st.Record(p, ref, key, tag, now, window.Item{}, 0, now); err != nil {
				t.Fatalf("Record past the limit: %v", err)
			}
		case 2:
			if _, _, err := apply(other, oref, key, tag, now, window.Item{}, 0, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p := range other.Partitions() {
		img, _ := other.AppendImage(nil, p)
		if _, _, err := st.MergeImage(img, now, bindTo(ref)); err != nil {
			t.Fatalf("MergeImage past the limit: %v", err)
		}
	}
	if s := st.Stats(ref); s.Records != int64(len(known)+added) {
		t.Fatalf("%d records, want %d known + %d replayed, recorded or merged", s.Records, len(known), added)
	}
	if m := st.Memory(); m.Overshoots == 0 || m.Overshoots > int64(added) {
		t.Fatalf("overshoots %d, want some and at most %d", m.Overshoots, added)
	}

	// Once idle records are reclaimed, their room takes new recipients.
	later := now + time.Hour.Milliseconds() + 10
	sweepAll(t, st, ref, later-d.Longest())
	if s := st.Stats(ref); s.Records != 0 {
		t.Fatalf("%d records left after the sweep", s.Records)
	}
	for i := range 50 {
		key, tag := keyOf(fmt.Sprintf("+33%09d", i))
		if _, _, err := apply(st, ref, key, tag, later, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
			t.Fatalf("new recipient %d after the sweep: %+v, %v", i, dec, err)
		}
	}
	if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
		t.Fatalf("running count %d, recount %d", got, want)
	}
}

// TestMemoryLimitReusesFreedRoom: past the limit, a new recipient whose
// record fits room the store holds already (a free slot of its size class
// and room in the index) is admitted, and the held bytes do not grow; room
// freed by reclaimed records is used again.
func TestMemoryLimitReusesFreedRoom(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 3, Window: time.Minute}})
	st, err := New(Config{Partitions: 1, MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	var dec window.Decision
	// Replay creates the domain's space past the limit.
	k0, g0 := keyOf("replayed")
	if err := st.Insert(0, ref, k0, g0, t0, window.Item{}, 1, 0, t0); err != nil {
		t.Fatal(err)
	}
	held := st.Memory().HeldBytes
	if held <= 1 {
		t.Fatalf("held %d bytes after a replayed record", held)
	}
	// Recipients that fit the first chunk and the first table are admitted
	// with no growth; the first that does not is refused.
	var admitted []string
	for i := 0; ; i++ {
		rcp := fmt.Sprint("r", i)
		key, tag := keyOf(rcp)
		at := t0 + int64(i%2)*2*time.Minute.Milliseconds() // every other one a window later
		_, _, err := apply(st, ref, key, tag, at, window.Item{}, 0, &dec)
		if errors.Is(err, ErrMemoryLimit) {
			break
		}
		if err != nil || !dec.Admitted {
			t.Fatalf("recipient %d: %+v, %v", i, dec, err)
		}
		admitted = append(admitted, rcp)
	}
	if got := st.Memory().HeldBytes; got != held || len(admitted) < 8 {
		t.Fatalf("%d recipients admitted into held room, held %d -> %d bytes", len(admitted), held, got)
	}
	// Reclaim the older half: their slots and index entries take as many
	// new recipients, still with no growth.
	reclaimed := sweepAll(t, st, ref, t0+time.Minute.Milliseconds())
	if reclaimed < len(admitted)/2 {
		t.Fatalf("reclaimed %d of %d", reclaimed, len(admitted))
	}
	held = st.Memory().HeldBytes
	now := t0 + 2*time.Minute.Milliseconds()
	for i := range reclaimed {
		key, tag := keyOf(fmt.Sprint("new", i))
		if _, _, err := apply(st, ref, key, tag, now, window.Item{}, 0, &dec); err != nil || !dec.Admitted {
			t.Fatalf("new recipient %d of %d into reclaimed room: %+v, %v", i, reclaimed, dec, err)
		}
	}
	if got := st.Memory().HeldBytes; got != held {
		t.Fatalf("held %d -> %d bytes for records that fit reclaimed room", held, got)
	}
	if m := st.Memory(); m.Overshoots != 1 || m.Refused != 1 {
		t.Fatalf("%+v, want 1 overshoot (the replayed record) and 1 refusal", m)
	}
}

// TestMemoryLimitTakesFreeBlocks: past the limit, a new recipient whose
// size class needs a new chunk is admitted when the store keeps a free block
// (one a sweep gave back) for it: the block is taken, nothing is mapped
// anew, and what the store holds with its free blocks stays at the limit.
// Once the room is gone, the next new recipient is refused.
func TestMemoryLimitTakesFreeBlocks(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 3, Window: time.Minute}})
	st, err := New(Config{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	var dec window.Decision
	admit := func(prefix string, i int, at int64) error {
		key, tag := keyOf(fmt.Sprint(prefix, i))
		_, _, err := apply(st, ref, key, tag, at, window.Item{}, 0, &dec)
		if err == nil && !dec.Admitted {
			t.Fatalf("%s%d: %+v", prefix, i, dec)
		}
		return err
	}
	// 20,000 records of one send fill several full-size chunks of one
	// size class; 4,000 more come a window later (enough that the sweep
	// leaves the index its size: see table.shrink).
	later := t0 + 2*time.Minute.Milliseconds()
	for i := range 20_000 {
		if err := admit("old", i, t0); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4_000 {
		if err := admit("kept", i, later); err != nil {
			t.Fatal(err)
		}
	}
	if st.Memory().MappedBytes == 0 {
		t.Skip("the store maps no blocks on this platform")
	}
	// The first sweep reclaims the old records; the second moves the kept
	// ones out of the tail chunks and gives those back as free blocks.
	for range 2 {
		sweepAll(t, st, ref, t0+time.Minute.Milliseconds())
	}
	free := st.Memory().FreeBytes
	if free < 2*blockBytes {
		t.Fatalf("%d bytes of free blocks after the sweeps, want at least 2 blocks", free)
	}
	m := st.Memory()
	st.mem.limit = m.HeldBytes + free // at the limit: over() holds from here
	fresh := 0
	for ; ; fresh++ {
		err := admit("fresh", fresh, later)
		if errors.Is(err, ErrMemoryLimit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if fresh > 100_000 {
			t.Fatal("no refusal")
		}
	}
	after := st.Memory()
	if got := after.FreeBytes; got > free-blockBytes {
		t.Errorf("free blocks %d -> %d bytes: none taken by %d new recipients", free, got, fresh)
	}
	if after.MappedBytes != m.MappedBytes {
		t.Errorf("mapped %d -> %d bytes for new recipients at the limit", m.MappedBytes, after.MappedBytes)
	}
	if held := after.HeldBytes + after.FreeBytes; held > st.mem.limit {
		t.Errorf("held with free blocks %d bytes, past the limit %d", held, st.mem.limit)
	}
	if after.Refused != 1 || after.Overshoots != 0 {
		t.Errorf("%+v, want 1 refusal and no overshoot", after)
	}
	if got, want := after.HeldBytes, heldNow(st); got != want {
		t.Fatalf("running count %d, recount %d", got, want)
	}
	t.Logf("%d new recipients admitted at the limit; free blocks %d -> %d bytes", fresh, free, after.FreeBytes)
}

// TestMemoryLimitBoundsGrowingRecords fills a store with recipients of one
// send until it refuses a new one, then has them send for 20 rounds with
// one of five contents, 5 s apart, under the default rules, so that their
// records would grow tenfold: the store's held bytes stay where the first
// refusal found them (within 1/64 of the limit: the free lists of the slots
// moved records leave), and every send whose record would grow is refused
// with ErrMemoryLimit, and counted (here all of them: a full store holds no
// free slot). Before records were bounded, the store held 23.7 times its
// limit at the end.
func TestMemoryLimitBoundsGrowingRecords(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	const limit = 256 << 10
	st, err := New(Config{Partitions: 4, MaxBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	var dec window.Decision
	now := t0
	var keys [][2]uint64
	for i := 0; ; i++ {
		key, tag := keyOf(fmt.Sprintf("+86%09d", i))
		_, _, err := apply(st, ref, key, tag, now, window.Item{Content: 1}, 0, &dec)
		if errors.Is(err, ErrMemoryLimit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, [2]uint64{key, uint64(tag)})
	}
	full := st.Memory().HeldBytes
	var admitted, refused, peak int64
	for round := range 20 {
		now += 5000
		for i, k := range keys {
			_, _, err := apply(st, ref, k[0], uint16(k[1]), now, window.Item{Content: uint64(i+round)%5 + 1}, uint64(round*len(keys)+i+1), &dec)
			switch {
			case errors.Is(err, ErrMemoryLimit):
				refused++
			case err != nil:
				t.Fatal(err)
			case dec.Admitted:
				admitted++
			}
			peak = max(peak, st.Memory().HeldBytes+st.Memory().FreeBytes)
		}
	}
	m := st.Memory()
	t.Logf("%d recipients; in the rounds %d sends admitted, %d refused; held %d at the first refusal, peak %d, limit %d (%+v)",
		len(keys), admitted, refused, full, peak, limit, m)
	if bound := full + limit/64; peak > bound {
		t.Fatalf("the store held %d bytes (%.2fx its limit %d) as known recipients sent, want at most %d", peak, float64(peak)/limit, limit, bound)
	}
	if refused == 0 || m.RefusedGrowth != refused {
		t.Fatalf("%d refused, %d refused growths counted; want every refusal counted", refused, m.RefusedGrowth)
	}
	if got, want := m.HeldBytes, heldNow(st); got != want {
		t.Fatalf("running count %d, recount %d", got, want)
	}
}

// TestMemoryLimitBoundsRequestIDs: past the limit, sends that fit their
// record's slot (a fixed-window rule's record keeps its size) are recorded
// with their request ids, and the id table does not grow past the smallest
// size: its rebuilds keep
// the newest ids that fit its size and count the others evicted; the
// newest are still answered as retries.
func TestMemoryLimitBoundsRequestIDs(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Algorithm: window.FixedWindow, Limit: 1_000_000, Window: time.Hour}})
	st, err := New(Config{Partitions: 1, IDCapacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	var dec window.Decision
	var keys [][2]uint64
	for i := range 64 {
		key, tag := keyOf(fmt.Sprint("r", i))
		keys = append(keys, [2]uint64{key, uint64(tag)})
		for range 200 { // past the counts whose records are smaller
			if _, _, err := apply(st, ref, key, tag, t0, window.Item{}, 0, &dec); err != nil {
				t.Fatal(err)
			}
		}
	}
	held := st.Memory().HeldBytes
	st.mem.limit = held // at the limit from here
	const sends = 20_000
	id := uint64(1000)
	for i := range sends {
		k := keys[i%len(keys)]
		id++
		if _, dup, err := apply(st, ref, k[0], uint16(k[1]), t0+int64(i/100), window.Item{}, id, &dec); err != nil || dup || !dec.Recorded {
			t.Fatalf("send %d at the limit: %+v dup %v, %v", i, dec, dup, err)
		}
	}
	// The domain had no id table: it gets the smallest one.
	if got := st.Memory().HeldBytes; got > held+minIDSlots*idSlotBytes {
		t.Fatalf("held %d -> %d bytes at the limit for %d sends with request ids, want at most a %d-slot table more", held, got, sends, minIDSlots)
	}
	s := st.Stats(ref)
	if s.EvictedIDs < sends/2 || s.IDs == 0 {
		t.Fatalf("%d ids held, %d evicted; want most of %d evicted", s.IDs, s.EvictedIDs, sends)
	}
	k := keys[(sends-1)%len(keys)]
	if _, dup, err := apply(st, ref, k[0], uint16(k[1]), t0+sends/100, window.Item{}, id, &dec); err != nil || !dup {
		t.Fatalf("retry of the newest id: dup %v, %v", dup, err)
	}
}

// TestMemoryLimitShrunkRecordStaysInItsSlot: past the limit, a record that
// shrinks (the content logs of its older sends dropped) into a size class
// with no room held stays in its slot, which holds it, rather than take
// memory; below the limit it moves to its class.
func TestMemoryLimitShrunkRecordStaysInItsSlot(t *testing.T) {
	d, _ := window.NewDomain("default", window.DefaultRules())
	// A record of 14 sends of 14 contents, made elsewhere and merged in
	// whole, so that the classes it grew through hold nothing here.
	other, _ := New(Config{Partitions: 1})
	var dec window.Decision
	key, tag := keyOf("shrinks")
	oref := other.Bind(d)
	for i := range 14 {
		if _, _, err := apply(other, oref, key, tag, t0+int64(i)*1000, window.Item{Content: uint64(i + 1)}, 0, &dec); err != nil || !dec.Admitted {
			t.Fatalf("send %d: %+v, %v", i, dec, err)
		}
	}
	st, err := New(Config{Partitions: 1})
	if err != nil {
		t.Fatal(err)
	}
	ref := st.Bind(d)
	img, _ := other.AppendImage(nil, 0)
	if _, _, err := st.MergeImage(img, t0+14_000, bindTo(ref)); err != nil {
		t.Fatal(err)
	}
	class := func() int {
		sp := st.parts[0].space(ref.id, false)
		pos, _, _ := sp.lookup(storedKey(key), tag)
		return sp.index.ref(pos).class()
	}
	full := class()
	held := st.Memory().HeldBytes
	st.mem.limit = held
	// An hour on, no content rule counts the 14 sends' contents.
	now := t0 + time.Hour.Milliseconds()
	if _, _, err := apply(st, ref, key, tag, now, window.Item{Content: 99}, 0, &dec); err != nil || !dec.Admitted || dec.Rules[1].Used != 15 {
		t.Fatalf("a send at the limit: %+v, %v; want admitted, 15 sends in the day", dec, err)
	}
	if m := st.Memory(); m.HeldBytes != held || m.Overshoots != 0 || m.Refused != 0 || class() != full {
		t.Fatalf("at the limit: held %d -> %d, %+v, class %d -> %d; want the record in its slot", held, m.HeldBytes, m, full, class())
	}
	if _, _, err := apply(st, ref, key, tag, now, window.Item{Mode: window.Peek}, 0, &dec); err != nil || dec.Rules[1].Used != 15 {
		t.Fatalf("peek: %+v, %v; want 15 sends in the day", dec, err)
	}
	st.mem.limit = 0
	if _, _, err := apply(st, ref, key, tag, now+1, window.Item{Content: 99}, 0, &dec); err != nil || !dec.Admitted {
		t.Fatalf("a send below the limit: %+v, %v", dec, err)
	}
	if c := class(); c >= full {
		t.Fatalf("below the limit the record stays in class %d, want one smaller than %d", c, full)
	}
	if got, want := st.Memory().HeldBytes, heldNow(st); got != want {
		t.Fatalf("running count %d, recount %d", got, want)
	}
}
