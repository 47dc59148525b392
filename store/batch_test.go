package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// TestApplyBatchMatchesApply runs the same random batches through Apply,
// item by item in slice order, on one store and through ApplyBatch on
// another, and checks that every item gets the same decision, sequence
// number, duplicate flag and error, and that the stores hold the same
// records, sequence numbers and counters. The batches repeat recipients
// (and two recipients share a key hash), reuse request ids within and
// across batches, mix peeks, record-only items and invalid costs, span two
// domains and meet closed partitions.
func TestApplyBatchMatchesApply(t *testing.T) {
	def, _ := window.NewDomain("default", window.DefaultRules())
	tight, _ := window.NewDomain("tight", []window.Rule{
		{Name: "r", Scope: window.ScopeRecipient, Limit: 4, Window: 10 * time.Second},
		{Name: "c", Scope: window.ScopeContent, Limit: 1, Window: 5 * time.Second},
	})
	const parts = 5
	one, err := New(Config{Partitions: parts})
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := New(Config{Partitions: parts})
	refs := [2][]Ref{{one.Bind(def), one.Bind(tight)}, {batch.Bind(def), batch.Bind(tight)}}

	type rcp struct {
		key uint64
		tag uint16
	}
	var rcps []rcp
	for i := range 30 {
		k, tg := keyOf(fmt.Sprintf("+86%09d", i))
		rcps = append(rcps, rcp{k, tg})
	}
	rcps = append(rcps, rcp{rcps[0].key, rcps[0].tag ^ 1}, rcp{0, 7}) // a 64-bit collision; key 0

	rng := rand.New(rand.NewPCG(5, 6))
	now := t0
	var seen struct{ dup, reused, closed, invalid, denied, recorded int }
	for b := range 400 {
		now += int64(rng.IntN(2500))
		if rng.IntN(8) == 0 { // close or open a partition in both
			p := rng.IntN(parts)
			if rng.IntN(3) == 0 {
				one.Close(p)
				batch.Close(p)
			} else {
				one.Open(p)
				batch.Open(p)
			}
		}
		n := 1 + rng.IntN(60)
		items := make([]BatchItem, n)
		for j := range items {
			if j > 0 && rng.IntN(10) == 0 { // a retry of an earlier item
				items[j] = items[rng.IntN(j)]
				continue
			}
			r := rcps[rng.IntN(len(rcps))]
			it := window.Item{Content: uint64(rng.IntN(4)), Cost: rng.IntN(3)}
			switch rng.IntN(10) {
			case 0, 1:
				it.Mode = window.Peek
			case 2:
				it.Mode = window.RecordOnly
			}
			if rng.IntN(40) == 0 {
				it.Cost = window.MaxCost + 1
			}
			var id uint64
			if rng.IntN(2) == 0 {
				id = 1 + uint64(rng.IntN(100))
			}
			items[j] = BatchItem{Part: one.PartitionOf(storedKey(r.key)), Ref: refs[1][rng.IntN(2)], Key: r.key, Tag: r.tag, Item: it, ID: id}
		}
		want := make([]BatchItem, n)
		copy(want, items)
		for j := range want {
			x := &want[j]
			x.Ref = refs[0][x.Ref.id]
			x.Seq, x.Dup, x.Err = one.Apply(x.Part, x.Ref, x.Key, x.Tag, now, x.Item, x.ID, &x.Dec)
		}
		batch.ApplyBatch(now, items)
		for j := range items {
			got, w := &items[j], &want[j]
			if fmt.Sprint(got.Err) != fmt.Sprint(w.Err) || got.Seq != w.Seq || got.Dup != w.Dup || (w.Err == nil && got.Dec != w.Dec) {
				t.Fatalf("batch %d item %d (%+v, id %d, partition %d): ApplyBatch gave seq %d dup %v err %v %+v; Apply gave seq %d dup %v err %v %+v",
					b, j, w.Item, w.ID, w.Part, got.Seq, got.Dup, got.Err, got.Dec, w.Seq, w.Dup, w.Err, w.Dec)
			}
		}
		for _, x := range want {
			switch {
			case x.Dup:
				seen.dup++
			case errors.Is(x.Err, ErrIDReused):
				seen.reused++
			case errors.Is(x.Err, ErrClosed):
				seen.closed++
			case errors.Is(x.Err, window.ErrInvalid):
				seen.invalid++
			case x.Err == nil && !x.Dec.Admitted:
				seen.denied++
			case x.Err == nil && x.Dec.Recorded:
				seen.recorded++
			}
		}
		if b%50 == 49 {
			sameStores(t, one, batch, refs)
		}
	}
	sameStores(t, one, batch, refs)
	if seen.dup == 0 || seen.reused == 0 || seen.closed == 0 || seen.invalid == 0 || seen.denied == 0 || seen.recorded == 0 {
		t.Fatalf("the batches missed a case: %+v", seen)
	}
	t.Logf("items: %+v", seen)
}

// sameStores fails t unless a and b hold the same records, sequence numbers
// and counters.
func sameStores(t *testing.T, a, b *Store, refs [2][]Ref) {
	t.Helper()
	for p := range a.Partitions() {
		if a.Seq(p) != b.Seq(p) || a.IsOpen(p) != b.IsOpen(p) {
			t.Fatalf("partition %d: seq %d open %v, want seq %d open %v", p, b.Seq(p), b.IsOpen(p), a.Seq(p), a.IsOpen(p))
		}
		recs := map[string][]byte{}
		a.ForEach(p, func(d string, key uint64, rec []byte) bool {
			recs[fmt.Sprint(d, key, window.RecordTag(rec))] = bytes.Clone(rec)
			return true
		})
		n := 0
		b.ForEach(p, func(d string, key uint64, rec []byte) bool {
			n++
			k := fmt.Sprint(d, key, window.RecordTag(rec))
			if !bytes.Equal(recs[k], rec) {
				t.Fatalf("partition %d record %s: %x, want %x", p, k, rec, recs[k])
			}
			return true
		})
		if n != len(recs) {
			t.Fatalf("partition %d: %d records, want %d", p, n, len(recs))
		}
	}
	for i := range refs[0] {
		if sa, sb := a.Stats(refs[0][i]), b.Stats(refs[1][i]); sa.Records != sb.Records || sa.Collisions != sb.Collisions || sa.IDs != sb.IDs {
			t.Fatalf("domain %d: stats %+v, want %+v", i, sb, sa)
		}
	}
}

// TestApplyBatchConcurrent runs batches on overlapping partitions from
// several goroutines beside single Applies (under -race, this checks the
// locking; a deadlock would hang it): no recipient is admitted beyond its
// limit, and each partition's sequence numbers are 1 to its count, once each.
func TestApplyBatchConcurrent(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 5, Window: time.Hour}})
	st, ref := newTestStore(t, d, 7)
	const workers, rounds, recipients = 4, 50, 60
	var mu sync.Mutex
	admitted := map[uint64]int{}
	seqs := map[[2]uint64]int{} // partition, seq -> times handed out
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range rounds {
				items := make([]BatchItem, 1+rng.IntN(40))
				for j := range items {
					key := uint64(1 + rng.IntN(recipients))
					items[j] = BatchItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: 1}
				}
				if w == 0 { // one worker decides item by item
					for j := range items {
						x := &items[j]
						x.Seq, x.Dup, x.Err = st.Apply(x.Part, x.Ref, x.Key, x.Tag, t0, x.Item, 0, &x.Dec)
					}
				} else {
					st.ApplyBatch(t0, items)
				}
				mu.Lock()
				for _, x := range items {
					if x.Err != nil {
						t.Error(x.Err)
					}
					if x.Dec.Admitted {
						admitted[x.Key]++
						seqs[[2]uint64{uint64(x.Part), x.Seq}]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for k, n := range admitted {
		if n > 5 {
			t.Errorf("recipient %d admitted %d times, limit 5", k, n)
		}
	}
	for p := range st.Partitions() {
		for s := uint64(1); s <= st.Seq(p); s++ {
			if seqs[[2]uint64{uint64(p), s}] != 1 {
				t.Errorf("partition %d seq %d handed out %d times", p, s, seqs[[2]uint64{uint64(p), s}])
			}
		}
	}
}

// TestApplyBatchAllocs: a warm ApplyBatch allocates nothing, nor does a
// warm RecordBatch.
func TestApplyBatchAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("-race: sync.Pool drops its items at random")
	}
	d, _ := window.NewDomain("default", window.DefaultRules())
	st, ref := newTestStore(t, d, 0)
	now := t0 + 86_400_000
	fillSteady(t, st, ref, 10_000, steadyTemplates(t, d, 100, now))
	items := make([]BatchItem, 100)
	fresh := func() {
		for j := range items {
			key, tag := benchKey(j * 97)
			items[j] = BatchItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: tag, Item: window.Item{Content: 1, Mode: window.Peek}}
		}
	}
	fresh()
	st.ApplyBatch(now, items)
	if n := testing.AllocsPerRun(100, func() { fresh(); st.ApplyBatch(now, items) }); n != 0 {
		t.Fatalf("ApplyBatch allocates %v times per batch, want 0", n)
	}
	for _, x := range items {
		if x.Err != nil || x.Dec.NumRules != 4 {
			t.Fatalf("item: %+v", x)
		}
	}

	// The same sends again and again, with their request ids: recorded once,
	// then duplicates, so that no record grows into a new slab chunk.
	sends := make([]RecordItem, 100)
	freshSends := func() {
		for j := range sends {
			key, tag := benchKey(j * 89)
			sends[j] = RecordItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: tag, At: now, Item: window.Item{Content: 1}, ID: uint64(j + 1)}
		}
	}
	freshSends()
	st.RecordBatch(now, sends)
	if n := testing.AllocsPerRun(100, func() { freshSends(); st.RecordBatch(now, sends) }); n != 0 {
		t.Fatalf("RecordBatch allocates %v times per batch, want 0", n)
	}
	for _, x := range sends {
		if x.Err != nil || !x.Dup {
			t.Fatalf("send: %+v", x)
		}
	}
}

// TestRecordBatchMatchesRecord runs the same random batches of sends
// through Record and Unrecord, one by one in slice order, on one store and
// through RecordBatch on another, and checks that every send gets the same
// sequence number, duplicate flag and error, and that the stores hold the
// same records, sequence numbers and counters. The sends repeat recipients
// (and two recipients share a key hash), repeat request ids within and
// across batches, take sends back, carry times out of order and past the
// ids' horizon, span two domains and fall in closed partitions, which a
// backup records all the same.
func TestRecordBatchMatchesRecord(t *testing.T) {
	def, _ := window.NewDomain("default", window.DefaultRules())
	tight, _ := window.NewDomain("tight", []window.Rule{
		{Name: "r", Scope: window.ScopeRecipient, Limit: 4, Window: 10 * time.Second},
		{Name: "c", Scope: window.ScopeContent, Limit: 1, Window: 5 * time.Second},
	})
	const parts = 5
	cfg := Config{Partitions: parts, IDHorizon: 20 * time.Second}
	one, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := New(cfg)
	refs := [2][]Ref{{one.Bind(def), one.Bind(tight)}, {batch.Bind(def), batch.Bind(tight)}}

	type rcp struct {
		key uint64
		tag uint16
	}
	var rcps []rcp
	for i := range 30 {
		k, tg := keyOf(fmt.Sprintf("+86%09d", i))
		rcps = append(rcps, rcp{k, tg})
	}
	rcps = append(rcps, rcp{rcps[0].key, rcps[0].tag ^ 1}, rcp{0, 7}) // a 64-bit collision; key 0

	rng := rand.New(rand.NewPCG(7, 8))
	now := t0
	var sent []RecordItem // earlier sends, to repeat and take back
	var seen struct{ dup, refunded, closed, invalid, recorded int }
	for b := range 400 {
		now += int64(rng.IntN(2500))
		if rng.IntN(8) == 0 {
			p := rng.IntN(parts)
			if rng.IntN(3) == 0 {
				one.Close(p)
				batch.Close(p)
			} else {
				one.Open(p)
				batch.Open(p)
			}
		}
		n := 1 + rng.IntN(60)
		items := make([]RecordItem, n)
		for j := range items {
			switch {
			case len(sent) > 0 && rng.IntN(10) == 0: // the same send again
				items[j] = sent[rng.IntN(len(sent))]
				continue
			case len(sent) > 0 && rng.IntN(10) == 0: // an earlier send taken back
				items[j] = sent[rng.IntN(len(sent))]
				items[j].Refund = true
				continue
			}
			r := rcps[rng.IntN(len(rcps))]
			it := window.Item{Content: uint64(rng.IntN(4)), Cost: rng.IntN(3), Mode: window.RecordOnly}
			if rng.IntN(40) == 0 {
				it.Cost = window.MaxCost + 1
			}
			var id uint64
			if rng.IntN(2) == 0 {
				id = 1 + uint64(rng.IntN(100))
			}
			at := now - int64(rng.IntN(30_000)) // some past the ids' horizon
			items[j] = RecordItem{Part: one.PartitionOf(storedKey(r.key)), Ref: refs[1][rng.IntN(2)], Key: r.key, Tag: r.tag, At: at, Item: it, ID: id}
			sent = append(sent, items[j])
		}
		want := make([]RecordItem, n)
		copy(want, items)
		for j := range want {
			x := &want[j]
			x.Ref = refs[0][x.Ref.id]
			if x.Refund {
				var applied bool
				x.Seq, applied, x.Err = one.Unrecord(x.Part, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, 0, now)
				x.Dup = !applied
				continue
			}
			x.Seq, x.Dup, x.Err = one.Record(x.Part, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, now)
		}
		batch.RecordBatch(now, items)
		for j := range items {
			got, w := &items[j], &want[j]
			if fmt.Sprint(got.Err) != fmt.Sprint(w.Err) || got.Seq != w.Seq || got.Dup != w.Dup {
				t.Fatalf("batch %d send %d (%+v at %d, id %d, refund %v, partition %d): RecordBatch gave seq %d dup %v err %v; Record gave seq %d dup %v err %v",
					b, j, w.Item, w.At, w.ID, w.Refund, w.Part, got.Seq, got.Dup, got.Err, w.Seq, w.Dup, w.Err)
			}
		}
		for _, x := range want {
			switch {
			case x.Err != nil && errors.Is(x.Err, window.ErrInvalid):
				seen.invalid++
			case x.Err != nil:
				t.Fatalf("send %+v: %v", x, x.Err)
			case x.Dup:
				seen.dup++
			case x.Refund:
				seen.refunded++
			case !one.IsOpen(x.Part):
				seen.closed++
			default:
				seen.recorded++
			}
		}
		if b%50 == 49 {
			sameStores(t, one, batch, refs)
		}
	}
	sameStores(t, one, batch, refs)
	if seen.dup == 0 || seen.refunded == 0 || seen.closed == 0 || seen.invalid == 0 || seen.recorded == 0 {
		t.Fatalf("the batches missed a case: %+v", seen)
	}
	t.Logf("sends: %+v", seen)
}

// TestRecordBatchConcurrent records batches on overlapping partitions from
// several goroutines beside single Records (under -race, this checks the
// locking; a deadlock would hang it): every send is recorded once, and each
// partition's sequence numbers are 1 to its count, once each.
func TestRecordBatchConcurrent(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 1000, Window: time.Hour}})
	st, ref := newTestStore(t, d, 7)
	const workers, rounds, recipients = 4, 50, 60
	var mu sync.Mutex
	seqs := map[[2]uint64]int{} // partition, seq -> times handed out
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 10))
			for r := range rounds {
				items := make([]RecordItem, 1+rng.IntN(40))
				for j := range items {
					key := uint64(1 + rng.IntN(recipients))
					// Ids unique to the worker, round and send: none is a duplicate.
					id := uint64(w)<<40 | uint64(r)<<20 | uint64(j) + 1
					items[j] = RecordItem{Part: st.PartitionOf(key), Ref: ref, Key: key, Tag: 1, At: t0 - int64(rng.IntN(1000)), ID: id}
				}
				if w == 0 { // one worker records send by send
					for j := range items {
						x := &items[j]
						x.Seq, x.Dup, x.Err = st.Record(x.Part, x.Ref, x.Key, x.Tag, x.At, x.Item, x.ID, t0)
					}
				} else {
					st.RecordBatch(t0, items)
				}
				mu.Lock()
				for _, x := range items {
					if x.Err != nil || x.Dup {
						t.Errorf("send %+v: dup %v, err %v", x, x.Dup, x.Err)
					}
					seqs[[2]uint64{uint64(x.Part), x.Seq}]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for p := range st.Partitions() {
		total += int(st.Seq(p))
		for s := uint64(1); s <= st.Seq(p); s++ {
			if seqs[[2]uint64{uint64(p), s}] != 1 {
				t.Errorf("partition %d seq %d handed out %d times", p, s, seqs[[2]uint64{uint64(p), s}])
			}
		}
	}
	if total != len(seqs) {
		t.Errorf("partitions numbered %d sends, %d handed out", total, len(seqs))
	}
}

// TestLockedGroupsReleasesOnBreak: a loop over lockedGroups that stops
// early leaves no partition locked, the locks taken ahead included.
func TestLockedGroupsReleasesOnBreak(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 5, Window: time.Hour}})
	st, ref := newTestStore(t, d, 16)
	var sc batchScratch
	keys := make([]uint64, 200)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	sc.plan(len(keys), func(i int) (int, Ref, uint64, uint64) { return st.PartitionOf(keys[i]), ref, keys[i], 0 })
	if len(sc.groups) < 2*batchAhead+2 {
		t.Fatalf("%d groups, want more than %d", len(sc.groups), 2*batchAhead+1)
	}
	for range st.lockedGroups(&sc) {
		break
	}
	for p := range st.Partitions() {
		if !st.parts[p].mu.TryLock() {
			t.Fatalf("partition %d is still locked", p)
		}
		st.parts[p].mu.Unlock()
	}
}

// TestRecordBatchReplaceFollowsOwner: a backup holds a send under request
// id 9 at t0; its owner took that attempt back and decided the retry at
// t0+8s. With Replace, the backup takes back the send at t0 and records the
// one at t0+8s, so that at t0+12s it still counts it in a 10 s window;
// without, it skips the retry as a duplicate and counts nothing then.
func TestRecordBatchReplaceFollowsOwner(t *testing.T) {
	d, _ := window.NewDomain("d", []window.Rule{{Name: "r", Scope: window.ScopeRecipient, Limit: 2, Window: 10 * time.Second}})
	for _, replace := range []bool{true, false} {
		st, err := New(Config{Partitions: 3, IDHorizon: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ref := st.Bind(d)
		key, tag := keyOf("+8613700000001")
		p := st.PartitionOf(storedKey(key))
		send := func(at int64) RecordItem {
			items := []RecordItem{{Part: p, Ref: ref, Key: key, Tag: tag, At: at, Item: window.Item{Content: 1}, ID: 9, Replace: replace}}
			st.RecordBatch(at, items)
			if items[0].Err != nil {
				t.Fatal(items[0].Err)
			}
			return items[0]
		}
		send(t0)
		second := send(t0 + 8000)
		var dec window.Decision
		if _, _, err := apply(st, ref, key, tag, t0+12000, window.Item{Mode: window.Peek, Content: 1}, 0, &dec); err != nil {
			t.Fatal(err)
		}
		used := dec.Rules[0].Used
		switch {
		case replace && (second.Dup || second.Replaced != t0 || second.ReplacedSeq == 0 || used != 1):
			t.Fatalf("with Replace: the retry %+v, counted %d at t0+12s; want recorded, the send at t0 replaced, 1 counted", second, used)
		case !replace && (!second.Dup || used != 0):
			t.Fatalf("without Replace: the retry %+v, counted %d at t0+12s; want a duplicate, 0 counted", second, used)
		}
		// The same send again (the owner resends a duplicate's first
		// send) replaces nothing.
		if again := send(t0 + 8000); again.Replaced != 0 || !again.Dup {
			t.Fatalf("replace %v: the same send again: %+v", replace, again)
		}
	}
}

// TestInsertBatchMatchesInsert replays one random WAL (sends of several
// recipients, contents and costs, with request ids and refunds of earlier
// sends) into two stores, one send at a time (Insert, Unrecord) and in
// batches of random sizes (InsertBatch): every record, every partition's
// sequence number and every recipient's decision must agree.
func TestInsertBatchMatchesInsert(t *testing.T) {
	def, _ := window.NewDomain("default", window.DefaultRules())
	const parts = 7
	one, _ := New(Config{Partitions: parts})
	batch, _ := New(Config{Partitions: parts})
	refOne, refBatch := one.Bind(def), batch.Bind(def)
	rng := rand.New(rand.NewPCG(11, 12))
	now := t0
	var wal []InsertItem
	seq := map[int]uint64{}
	for range 3000 {
		now += int64(rng.IntN(3000))
		key, tag := keyOf(fmt.Sprintf("+86%09d", rng.IntN(200)))
		p := int(key % parts)
		seq[p]++
		x := InsertItem{Part: p, Key: key, Tag: tag, At: now, Item: window.Item{Content: uint64(1 + rng.IntN(3)), Cost: 1 + rng.IntN(2)}, Seq: seq[p]}
		if rng.IntN(3) == 0 {
			x.ID = uint64(1 + rng.IntN(1_000_000))
		}
		if len(wal) > 0 && rng.IntN(10) == 0 { // a refund of an earlier send
			y := wal[rng.IntN(len(wal))]
			if !y.Refund {
				seq[y.Part]++
				x = y
				x.Refund, x.Seq = true, seq[y.Part]
			}
		}
		wal = append(wal, x)
	}
	for _, x := range wal {
		var err error
		if x.Refund {
			_, _, err = one.Unrecord(x.Part, refOne, x.Key, x.Tag, x.At, x.Item, x.ID, x.Seq, now)
		} else {
			err = one.Insert(x.Part, refOne, x.Key, x.Tag, x.At, x.Item, x.Seq, x.ID, now)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < len(wal); {
		n := min(len(wal)-i, 1+rng.IntN(300))
		chunk := slices.Clone(wal[i : i+n])
		for j := range chunk {
			chunk[j].Ref = refBatch
		}
		batch.InsertBatch(now, chunk)
		for _, x := range chunk {
			if x.Err != nil {
				t.Fatal(x.Err)
			}
		}
		i += n
	}
	for p := range parts {
		if one.Seq(p) != batch.Seq(p) {
			t.Fatalf("partition %d: seq %d one by one, %d in batches", p, one.Seq(p), batch.Seq(p))
		}
		recs := map[uint64]string{}
		one.ForEach(p, func(_ string, key uint64, rec []byte) bool { recs[key] = string(rec); return true })
		n := 0
		batch.ForEach(p, func(_ string, key uint64, rec []byte) bool {
			n++
			if recs[key] != string(rec) {
				t.Errorf("partition %d key %x: records differ", p, key)
			}
			return true
		})
		if n != len(recs) {
			t.Fatalf("partition %d: %d records one by one, %d in batches", p, len(recs), n)
		}
	}
}
