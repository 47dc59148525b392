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
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/window"
)

// TestMemoryLimitThroughCheck: at the store's limit, a batch's items for
// recipients with no record fail alone with RESOURCE_EXHAUSTED naming the
// limit; the node's known recipient in the same batch is decided as always
// (admitted and recorded, then denied by its rule), a peek of a new
// recipient is answered, the refused items change no record, and the
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
	// gets a record, and the store is then at the limit.
	const known = "+8613800000000"
	resp, err := n.Check(ctx, &pb.CheckRequest{Recipients: []string{known}})
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
		Modes:      []pb.Mode{0, 0, pb.Mode_MODE_RECORD_ONLY, 0, pb.Mode_MODE_PEEK},
	}
	resp, err = n.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	errs := map[uint32]*pb.ItemError{}
	for _, e := range resp.Errors {
		errs[e.Index] = e
	}
	for _, i := range []uint32{0, 2} {
		e := errs[i]
		if e == nil || codes.Code(e.Code) != codes.ResourceExhausted {
			t.Fatalf("item %d (new recipient): %v, want RESOURCE_EXHAUSTED", i, e)
		}
		for _, want := range []string{fresh[i/2], "memory limit", "of the 1 it may"} {
			if !strings.Contains(e.Message, want) {
				t.Errorf("item %d: message %q does not say %q", i, e.Message, want)
			}
		}
		if resp.Admitted[i] || resp.Recorded[i] {
			t.Errorf("item %d refused but admitted %v recorded %v", i, resp.Admitted[i], resp.Recorded[i])
		}
	}
	for _, i := range []int{1, 3} {
		if errs[uint32(i)] != nil || !resp.Admitted[i] || !resp.Recorded[i] {
			t.Fatalf("item %d (known recipient): %v, admitted %v recorded %v", i, errs[uint32(i)], resp.Admitted[i], resp.Recorded[i])
		}
	}
	if errs[4] != nil || !resp.Admitted[4] || resp.Recorded[4] {
		t.Fatalf("item 4 (peek of a new recipient): %v, admitted %v recorded %v; want answered", errs[4], resp.Admitted[4], resp.Recorded[4])
	}
	after := n.Stats()
	for _, rcp := range fresh {
		k, _ := KeyOf(rcp)
		if p := n.store.PartitionOf(k); after.Partitions[p] != 0 {
			t.Fatalf("partition %d of refused %s holds %d records", p, rcp, after.Partitions[p])
		}
	}
	if after.Domains[0].Records != 1 || after.Memory.Refused != 2 || after.Failed-before.Failed != 2 {
		t.Fatalf("after the batch: %d records, %d refused, %d failed; want 1, 2, 2",
			after.Domains[0].Records, after.Memory.Refused, after.Failed-before.Failed)
	}
	if after.Memory.MaxBytes != 1 || after.Memory.HeldBytes < 1 {
		t.Fatalf("memory %+v", after.Memory)
	}

	// The known recipient is still decided by its rules: 15 a minute.
	resp, err = n.Check(ctx, &pb.CheckRequest{Recipients: repeat(known, 13)})
	if err != nil || len(resp.Errors) != 0 {
		t.Fatalf("known recipient, 13 more: %v %v", resp, err)
	}
	if !resp.Admitted[11] || resp.Admitted[12] || resp.DeniedBy[12] != 0 {
		t.Fatalf("known recipient's 15th and 16th sends: admitted %v, %v (denied by %d); want the 16th denied by recipient-1m",
			resp.Admitted[11], resp.Admitted[12], resp.DeniedBy[12])
	}

	// Logged once for the two refusals at one instant; a second later, the
	// next refusal is logged with the one left out.
	if got := strings.Count(logs.String(), "memory limit reached"); got != 1 {
		t.Fatalf("%d log lines for 2 refusals within a second, want 1:\n%s", got, logs.String())
	}
	clk.ns += int64(time.Second)
	if _, err := n.Check(ctx, &pb.CheckRequest{Recipients: fresh[:1]}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(logs.String(), "memory limit reached"); got != 2 || !strings.Contains(logs.String(), "refusals_not_logged=1") {
		t.Fatalf("a second later: %d log lines, want 2, the second with refusals_not_logged=1:\n%s", got, logs.String())
	}

	st, err := n.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryRefusals != 3 || st.StoreLimitBytes != 1 || st.StoreBytes < 1 {
		t.Fatalf("status: memory_refusals %d, store_limit_bytes %d, store_bytes %d; want 3, 1, >0", st.MemoryRefusals, st.StoreLimitBytes, st.StoreBytes)
	}
}

// repeat returns rcp n times.
func repeat(rcp string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = rcp
	}
	return out
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
