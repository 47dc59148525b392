package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/window"
)

// TestMemoryLimitThroughCheck: at the store's limit, a batch's items for
// recipients with no record fail alone with RESOURCE_EXHAUSTED naming the
// limit, while in the same batch the send of the node's known recipient
// that its rule denies, and peeks, are answered; later the known
// recipient's send that its rules admit, but which its record would have to
// grow for, fails the same way. The refused items change no record, and the
// refusals are counted and logged at most once a second.
func TestMemoryLimitThroughCheck(t *testing.T) {
	clk := &fixedClock{ns: t0 * 1e6}
	var logs bytes.Buffer
	n, err := New(Config{Clock: clk, Name: "test", storeMaxBytes: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()

	// The store starts empty, below its 1-byte limit: the first recipient
	// gets a record, of a send of cost 15 (all recipient-1m allows), and
	// the store is then at the limit.
	const known = "+8613800000000"
	resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{known}, Costs: []uint32{15}})
	if err != nil || len(resp.Errors) != 0 || !resp.Admitted[0] {
		t.Fatalf("first recipient: %v %v", resp, err)
	}
	kkey, _ := KeyOf(known)
	kp := n.store.PartitionOf(kkey)
	// New recipients in other partitions, which hold no record and no room.
	var fresh []string
	for i := 0; len(fresh) < 3; i++ {
		rcp := fmt.Sprintf("+8613900%06d", i)
		if k, _ := KeyOf(rcp); n.store.PartitionOf(k) != kp {
			fresh = append(fresh, rcp)
		}
	}
	before := n.Stats()
	req := &pb.CheckRequest{
		Recipients: []string{fresh[0], known, fresh[1], known, fresh[2]},
		Modes:      []pb.Mode{0, 0, pb.Mode_MODE_RECORD_ONLY, pb.Mode_MODE_PEEK, pb.Mode_MODE_PEEK},
	}
	resp, err = n.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	errs := map[uint32]*pb.ItemError{}
	for _, e := range resp.Errors {
		errs[e.Index] = e
	}
	refused := func(i uint32, e *pb.ItemError, rcp string, admitted, recorded bool) {
		t.Helper()
		if e == nil || codes.Code(e.Code) != codes.ResourceExhausted {
			t.Fatalf("item %d (%s): %v, want RESOURCE_EXHAUSTED", i, rcp, e)
		}
		for _, want := range []string{rcp, "memory limit", "of the 1 it may", "a new recipient, or a record that must grow"} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("item %d: message %q does not say %q", i, e.Message, want)
			}
		}
		if admitted || recorded {
			t.Errorf("item %d refused but admitted %v recorded %v", i, admitted, recorded)
		}
	}
	for _, i := range []uint32{0, 2} {
		refused(i, errs[i], fresh[i/2], resp.Admitted[i], resp.Recorded[i])
	}
	if errs[1] != nil || resp.Admitted[1] || resp.Recorded[1] || resp.DeniedBy[1] != 0 {
		t.Fatalf("item 1 (the known recipient's 16th send in a minute): %v, admitted %v recorded %v denied by %d; want denied by recipient-1m",
			errs[1], resp.Admitted[1], resp.Recorded[1], resp.DeniedBy[1])
	}
	for _, i := range []int{3, 4} {
		if errs[uint32(i)] != nil || resp.Recorded[i] || resp.Admitted[i] != (i == 4) {
			t.Fatalf("item %d (a peek): %v, admitted %v recorded %v; want answered", i, errs[uint32(i)], resp.Admitted[i], resp.Recorded[i])
		}
	}
	after := n.Stats()
	for _, rcp := range fresh {
		k, _ := KeyOf(rcp)
		if p := n.store.PartitionOf(k); after.Partitions[p] != 0 {
			t.Fatalf("partition %d of refused %s holds %d records", p, rcp, after.Partitions[p])
		}
	}
	if m := after.Memory; after.Domains[0].Records != 1 || m.Refused != 2 || m.RefusedGrowth != 0 || after.Failed-before.Failed != 2 {
		t.Fatalf("after the batch: %d records, %d refused (%d growths), %d failed; want 1, 2 (0), 2",
			after.Domains[0].Records, m.Refused, m.RefusedGrowth, after.Failed-before.Failed)
	}
	if after.Memory.MaxBytes != 1 || after.Memory.HeldBytes < 1 {
		t.Fatalf("memory %+v", after.Memory)
	}
	// Logged once for the two refusals at one instant.
	if got := strings.Count(logs.String(), "memory limit reached"); got != 1 {
		t.Fatalf("%d log lines for 2 refusals within a second, want 1:\n%s", got, logs.String())
	}

	// A minute on, recipient-1m admits the known recipient's send, but its
	// record would grow to log the send's content: refused, and logged with
	// the refusal left out before.
	clk.ns += int64(time.Minute)
	img, _ := n.store.AppendImage(nil, kp)
	resp, err = n.Check(ctx, &pb.CheckRequest{Recipients: []string{known}, Contents: [][]byte{[]byte("your code is 1234")}})
	if err != nil || len(resp.Errors) != 1 {
		t.Fatalf("the known recipient a minute later: %v %v", resp, err)
	}
	refused(0, resp.Errors[0], known, resp.Admitted[0], resp.Recorded[0])
	if again, _ := n.store.AppendImage(nil, kp); !bytes.Equal(img, again) {
		t.Fatal("the refused send changed the known recipient's partition")
	}
	if m := n.Stats().Memory; m.Refused != 3 || m.RefusedGrowth != 1 {
		t.Fatalf("%+v, want 3 refused, 1 of them a growth", m)
	}
	if got := strings.Count(logs.String(), "memory limit reached"); got != 2 || !strings.Contains(logs.String(), "refusals_not_logged=1") {
		t.Fatalf("a minute later: %d log lines, want 2, the second with refusals_not_logged=1:\n%s", got, logs.String())
	}

	st, err := n.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryRefusals != 3 || st.StoreLimitBytes != 1 || st.StoreBytes < 1 {
		t.Fatalf("status: memory_refusals %d, store_limit_bytes %d, store_bytes %d; want 3, 1, >0", st.MemoryRefusals, st.StoreLimitBytes, st.StoreBytes)
	}
}

func TestGoMemoryLimit(t *testing.T) {
	for _, c := range []struct{ budget, mapped, want int64 }{
		{12 << 30, 0, 12 << 30},
		{12 << 30, 8 << 30, 4 << 30},
		{12 << 30, 10 << 30, 3 << 30}, // never below a quarter
	} {
		if got := GoMemoryLimit(c.budget, c.mapped); got != c.want {
			t.Errorf("GoMemoryLimit(%d, %d) = %d, want %d", c.budget, c.mapped, got, c.want)
		}
	}
}

// TestResidentOutsideGo: on Linux, the test binary's file-backed pages
// are resident, and counted.
func TestResidentOutsideGo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/status")
	}
	if got := ResidentOutsideGo(); got < 1<<20 || got > 1<<30 {
		t.Fatalf("ResidentOutsideGo() = %d bytes, want the binary's pages: above 1 MiB, below 1 GiB", got)
	}
}

func TestStoreBudget(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct{ max, want int64 }{
		{0, 0},
		{MinMaxMemory, MinMaxMemory - memoryReserve}, // 32 MiB
		{384 * mib, 288 * mib},                       // where the two rules meet
		{2048 * mib, 1536 * mib},
		{12 << 30, 9 << 30},
	} {
		if got := StoreBudget(tc.max); got != tc.want {
			t.Errorf("StoreBudget(%d MiB) = %d MiB, want %d MiB", tc.max/mib, got/mib, tc.want/mib)
		}
	}
	if _, err := New(Config{MaxMemory: 800}); err == nil || !strings.Contains(err.Error(), "MaxMemory 800 bytes is below") {
		t.Fatalf("MaxMemory 800: %v", err)
	}
}

func TestSnapshotChunk(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		max  int64
		want int
	}{
		{0, 0}, // wal's default, 8 MiB
		{MinMaxMemory, mib},
		{511 * mib, mib},
		{512 * mib, 2 * mib},
		{2048 * mib, 8 * mib},
		{12 << 30, 8 * mib},
	} {
		if got := snapshotChunk(tc.max); got != tc.want {
			t.Errorf("snapshotChunk(%d MiB) = %d, want %d", tc.max/mib, got, tc.want)
		}
	}
}

// TestSnapshotBuffersAtMaxMemory: with MaxMemory at its least (128 MiB), a
// snapshot of a store whose file is 20 MiB and more (300,000 recipients at
// the seed's steady state) allocates a few MiB for its write and its
// verification: 1 MiB direct I/O chunks (snapshotChunk) and one partition
// image at a time. With 8 MiB chunks the two took 40 MiB.
func TestSnapshotBuffersAtMaxMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 300,000 recipients")
	}
	d, _ := window.NewDomain("default", window.DefaultRules())
	now := t0 + 86_400_000
	clk := &testClock{}
	clk.set(now)
	a := openNode(t, Config{Clock: clk, MaxMemory: MinMaxMemory, DataDir: t.TempDir(),
		SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
	defer a.Close()
	rng := rand.New(rand.NewPCG(42, 1000))
	var templates [][]byte
	for range 100 {
		rec, err := window.SteadyStateRecord(d, rng, now)
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, rec)
	}
	dv := a.view.Load().domains[DefaultDomain]
	for i := range 300_000 {
		key := rng.Uint64() | 1
		rec := append([]byte(nil), templates[i%len(templates)]...)
		binary.LittleEndian.PutUint16(rec, uint16(key>>20))
		if _, err := a.store.MergeRecord(a.store.PartitionOf(key), dv.ref, key, rec, now); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	if err := a.snapshot(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&ms)
	alloc := ms.TotalAlloc - before
	file := dirBytes(filepath.Join(a.cfg.DataDir)) // the snapshot, the WAL's empty segment and small files
	if file < 20<<20 {
		t.Fatalf("data directory of %d bytes, want a snapshot of 20 MiB or more", file)
	}
	if alloc > 8<<20 {
		t.Fatalf("a snapshot of %d bytes allocated %d bytes at MaxMemory %d, want at most 8 MiB", file, alloc, MinMaxMemory)
	}
	t.Logf("a snapshot of %d bytes allocated %d bytes", file, alloc)
}

// TestRecoveryPastTheLimitIsLogged: replay never refuses, so a node that
// restarts with a lower limit than its history needs recovers all of it,
// says so, and refuses new recipients.
func TestRecoveryPastTheLimitIsLogged(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	a := openNode(t, Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
	if _, err := a.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+8613800000001", "+8613800000002"}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	b := openNode(t, Config{Clock: clk, DataDir: dir, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1,
		storeMaxBytes: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer b.Close()
	if s := b.Stats(); s.Domains[0].Records != 2 || !strings.Contains(logs.String(), "the recovered store holds more than its memory limit") {
		t.Fatalf("recovered %d records; log:\n%s", s.Domains[0].Records, logs.String())
	}
	resp, err := b.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+8613900000003"}})
	if err != nil || len(resp.Errors) != 1 || codes.Code(resp.Errors[0].Code) != codes.ResourceExhausted {
		t.Fatalf("a new recipient after recovery: %v %v, want RESOURCE_EXHAUSTED", resp, err)
	}
}

func TestInflightItems(t *testing.T) {
	for _, tc := range []struct{ max, want int64 }{
		{0, 0},
		{MinMaxMemory, 16_384},
		{12 << 30, 1_572_864},
		{MinMaxMemory / 2, MaxBatch}, // never below one request of the most items
	} {
		if got := inflightItems(tc.max); got != tc.want {
			t.Errorf("inflightItems(%d) = %d, want %d", tc.max, got, tc.want)
		}
	}
}

// TestItemGate: calls take items in arrival order, a call waits while an
// earlier one does (even if its items are free), a call that gives up or
// whose node stops takes nothing and lets the next through, and a call is
// never asked for more than the capacity or less than one item.
func TestItemGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		stopping := make(chan struct{})
		g := newItemGate(10)
		took := make(chan string, 10)
		take := func(ctx context.Context, name string, n int) func() {
			release, err := g.acquire(ctx, stopping, n)
			if err != nil {
				took <- name + ": " + status.Code(err).String()
				return nil
			}
			took <- name
			return release
		}
		got := func() []string {
			synctest.Wait()
			var out []string
			for len(took) > 0 {
				out = append(out, <-took)
			}
			slices.Sort(out) // calls let through together report in any order
			return out
		}
		relA := take(ctx, "a", 6)
		var relB, relC func()
		go func() { relB = take(ctx, "b", 6) }()
		synctest.Wait()
		go func() { relC = take(ctx, "c", 1) }() // 4 are free, but b came first
		if g := got(); !slices.Equal(g, []string{"a"}) {
			t.Fatalf("took %v, want a only", g)
		}
		relA()
		if g := got(); !slices.Equal(g, []string{"b", "c"}) {
			t.Fatalf("after a: took %v, want b and c", g)
		}
		// d asks for more than the capacity: it waits for all of it; e,
		// behind it, gives up, and f, behind e, gets its turn after d.
		var relD, relF func()
		go func() { relD = take(ctx, "d", 1_000) }()
		synctest.Wait()
		ectx, cancel := context.WithCancel(ctx)
		go func() { take(ectx, "e", 1) }()
		synctest.Wait()
		go func() { relF = take(ctx, "f", 0) }()
		synctest.Wait()
		cancel()
		if g := got(); !slices.Equal(g, []string{"e: Canceled"}) {
			t.Fatalf("took %v, want e canceled", g)
		}
		relB()
		relC()
		if g := got(); !slices.Equal(g, []string{"d"}) {
			t.Fatalf("took %v, want d", g)
		}
		relD()
		if g := got(); !slices.Equal(g, []string{"f"}) {
			t.Fatalf("took %v, want f", g)
		}
		go func() { take(ctx, "g", 10) }() // 9 are free
		synctest.Wait()
		close(stopping)
		if g := got(); !slices.Equal(g, []string{"g: Unavailable"}) {
			t.Fatalf("took %v, want g unavailable once the node stops", g)
		}
		relF()
		if g.free != g.capacity || len(g.waiters) != 0 || g.waits.Load() != 6 {
			t.Fatalf("free %d of %d, %d waiting, %d waits; want all free, none waiting, 6 waits", g.free, g.capacity, len(g.waiters), g.waits.Load())
		}
		var none *itemGate
		if release, err := none.acquire(ctx, stopping, 1<<30); err != nil {
			t.Fatal(err)
		} else {
			release()
		}
	})
}
