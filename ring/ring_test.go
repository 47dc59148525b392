package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// members returns n members named node-0 .. node-(n-1).
func members(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Name: fmt.Sprintf("node-%d", i), Addr: fmt.Sprintf("10.0.0.%d:7000", i+1)}
	}
	return ms
}

// keys returns n recipient-like keys.
func keys(n int) [][]byte {
	ks := make([][]byte, n)
	for i := range ks {
		ks[i] = fmt.Appendf(nil, "+86138%08d", i)
	}
	return ks
}

func mustNew(t testing.TB, ms []Member, cfg Config) *Ring {
	t.Helper()
	r, err := New(ms, cfg)
	if err != nil {
		t.Fatalf("New(%d members, %+v): %v", len(ms), cfg, err)
	}
	return r
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" means valid
	}{
		{"zero takes defaults", Config{}, ""},
		{"explicit", Config{PartitionCount: 1, ReplicationFactor: 1, Load: 1}, ""},
		{"max", Config{PartitionCount: MaxPartitionCount, ReplicationFactor: MaxReplicationFactor, Load: MaxLoad}, ""},
		{"negative partitions", Config{PartitionCount: -1}, "PartitionCount -1 out of range [1, 65536]"},
		{"too many partitions", Config{PartitionCount: MaxPartitionCount + 1}, "PartitionCount 65537 out of range [1, 65536]"},
		{"negative replication", Config{ReplicationFactor: -3}, "ReplicationFactor -3 out of range [1, 1024]"},
		{"too much replication", Config{ReplicationFactor: 1025}, "ReplicationFactor 1025 out of range [1, 1024]"},
		{"load below 1", Config{Load: 0.99}, "Load 0.99 out of range [1, 10]"},
		{"load too high", Config{Load: 10.5}, "Load 10.5 out of range [1, 10]"},
		{"load NaN", Config{Load: math.NaN()}, "Load NaN out of range [1, 10]"},
		{"load Inf", Config{Load: math.Inf(1)}, "Load +Inf out of range [1, 10]"},
		{"negative load", Config{Load: -1}, "Load -1 out of range [1, 10]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(members(3), tc.cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("New: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("New: error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNewRejectsBadMembers(t *testing.T) {
	_, err := New([]Member{{Name: "a", Addr: "x:1"}, {Name: "b"}, {Name: "a", Addr: "y:1"}}, Config{})
	if !errors.Is(err, ErrDuplicateMember) || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("duplicate name: error %v, want ErrDuplicateMember naming \"a\"", err)
	}
	_, err = New([]Member{{Name: "a"}, {Name: "", Addr: "10.0.0.9:7000"}}, Config{})
	if err == nil || !strings.Contains(err.Error(), "10.0.0.9:7000") {
		t.Fatalf("empty name: error %v, want one naming the addr", err)
	}
}

func TestEmptyRing(t *testing.T) {
	r := mustNew(t, nil, Config{})
	if r.Epoch() != 0 || r.Len() != 0 || len(r.Members()) != 0 || len(r.Counts()) != 0 {
		t.Fatalf("empty ring: epoch %d, len %d, members %v, counts %v", r.Epoch(), r.Len(), r.Members(), r.Counts())
	}
	if m := r.OwnerString("k"); m != (Member{}) {
		t.Fatalf("empty ring owner = %+v, want zero", m)
	}
	if m, ok := r.ReplicaString("k"); ok || m != (Member{}) {
		t.Fatalf("empty ring replica = %+v, %v, want zero, false", m, ok)
	}
	if p := r.PartitionString("k"); p < 0 || p >= DefaultPartitionCount {
		t.Fatalf("empty ring partition %d out of range", p)
	}
}

func TestSingleMember(t *testing.T) {
	ms := members(1)
	r := mustNew(t, ms, Config{})
	for _, k := range keys(1000) {
		if got := r.Owner(k); got != ms[0] {
			t.Fatalf("Owner(%s) = %+v, want %+v", k, got, ms[0])
		}
		if got, ok := r.Replica(k); ok || got != ms[0] {
			t.Fatalf("Replica(%s) = %+v, %v, want %+v, false", k, got, ok, ms[0])
		}
	}
}

// TestConsistentIgnoresOrder checks the finding the package relies on: the
// library itself places partitions the same whatever order members are added in.
func TestConsistentIgnoresOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := make([]consistent.Member, 10)
	for i := range names {
		names[i] = node(fmt.Sprintf("node-%d", i))
	}
	table := func(ms []consistent.Member) []string {
		c := consistent.New(ms, consistent.Config{Hasher: hasher{}, PartitionCount: 271, ReplicationFactor: 20, Load: 1.25})
		t := make([]string, 271)
		for p := range t {
			t[p] = c.GetPartitionOwner(p).String()
		}
		return t
	}
	want := table(names)
	for i := range 50 {
		shuffled := slices.Clone(names)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := table(shuffled); !slices.Equal(got, want) {
			t.Fatalf("shuffle %d (%v): consistent placed partitions differently", i, shuffled)
		}
	}
	// Members added one by one (Add re-distributes each time) end in the same place.
	c := consistent.New(nil, consistent.Config{Hasher: hasher{}, PartitionCount: 271, ReplicationFactor: 20, Load: 1.25})
	for _, i := range rng.Perm(len(names)) {
		c.Add(names[i])
	}
	for p := range 271 {
		if got := c.GetPartitionOwner(p).String(); got != want[p] {
			t.Fatalf("incremental Add: partition %d owned by %s, want %s", p, got, want[p])
		}
	}
}

func TestOwnersIgnoreOrder(t *testing.T) {
	const nkeys = 100_000
	rng := rand.New(rand.NewPCG(3, 4))
	ks := keys(nkeys)
	for _, n := range []int{2, 5, 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ms := members(n)
			ref := mustNew(t, ms, Config{})
			want := make([]Member, nkeys)
			for i, k := range ks {
				want[i] = ref.Owner(k)
			}
			for s := range 50 {
				shuffled := slices.Clone(ms)
				rng.Shuffle(n, func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				r := mustNew(t, shuffled, Config{})
				if r.Epoch() != ref.Epoch() {
					t.Fatalf("shuffle %d: epoch %x, want %x", s, r.Epoch(), ref.Epoch())
				}
				if !slices.Equal(r.owner, ref.owner) || !slices.Equal(r.replica, ref.replica) {
					t.Fatalf("shuffle %d: partition tables differ", s)
				}
				for i, k := range ks {
					if got := r.Owner(k); got != want[i] {
						t.Fatalf("shuffle %d: Owner(%s) = %s, want %s", s, k, got.Name, want[i].Name)
					}
				}
			}
		})
	}
}

func TestDistribution(t *testing.T) {
	const nkeys = 100_000
	ks := keys(nkeys)
	for _, n := range []int{3, 5, 10} {
		r := mustNew(t, members(n), Config{})
		counts := r.Counts()
		lo, hi, sum := math.MaxInt, 0, 0
		for _, c := range counts {
			lo, hi, sum = min(lo, c), max(hi, c), sum+c
		}
		byKey := map[string]int{}
		for _, k := range ks {
			byKey[r.Owner(k).Name]++
		}
		klo, khi := math.MaxInt, 0
		for _, c := range byKey {
			klo, khi = min(klo, c), max(khi, c)
		}
		fair := float64(DefaultPartitionCount) / float64(n)
		t.Logf("%2d members: partitions per member min %d max %d (fair %.1f, max/min %.2f); keys per member min %.1f%% max %.1f%% (fair %.1f%%)",
			n, lo, hi, fair, float64(hi)/float64(lo), 100*float64(klo)/nkeys, 100*float64(khi)/nkeys, 100/float64(n))
		if sum != DefaultPartitionCount || len(counts) != n {
			t.Fatalf("%d members: counts %v sum to %d over %d members", n, counts, sum, len(counts))
		}
		if bound := int(math.Ceil(fair * DefaultLoad)); hi > bound {
			t.Fatalf("%d members: a member owns %d partitions, over the bounded load %d", n, hi, bound)
		}
		if float64(lo) < fair/2 {
			t.Fatalf("%d members: a member owns only %d partitions, under half of fair %.1f", n, lo, fair)
		}
	}
}

// moved returns the fraction of keys whose owner differs between a and b.
func moved(a, b *Ring, ks [][]byte) float64 {
	n := 0
	for _, k := range ks {
		if a.Owner(k).Name != b.Owner(k).Name {
			n++
		}
	}
	return float64(n) / float64(len(ks))
}

func TestMovement(t *testing.T) {
	ks := keys(100_000)
	ms := members(5)
	all := mustNew(t, ms, Config{})
	for i := range ms {
		rest := slices.Delete(slices.Clone(ms), i, i+1)
		without := mustNew(t, rest, Config{})
		f := moved(all, without, ks)
		// Keys that did not belong to the removed member but moved anyway:
		// bounded loads re-balance a little beyond the removed member's share.
		extra := 0
		for _, k := range ks {
			if all.Owner(k).Name != ms[i].Name && all.Owner(k) != without.Owner(k) {
				extra++
			}
		}
		t.Logf("remove %s of 5: %.1f%% of keys move (its share %.1f%%, others' keys moved %.1f%%); adding it back moves the same",
			ms[i].Name, 100*f, 100*float64(all.Counts()[ms[i].Name])/DefaultPartitionCount, 100*float64(extra)/float64(len(ks)))
		if f >= 0.35 {
			t.Fatalf("removing %s moved %.1f%% of keys, want < 35%%", ms[i].Name, 100*f)
		}
		if back := moved(without, all, ks); back != f {
			t.Fatalf("moved %.4f on remove but %.4f on add", f, back)
		}
	}
}

// TestReplicaIsNextOwner checks the definition of Replica: when an owner
// leaves, each of its keys goes to the key's replica.
func TestReplicaIsNextOwner(t *testing.T) {
	ks := keys(20_000)
	for _, n := range []int{2, 3, 5, 10} {
		ms := members(n)
		r := mustNew(t, ms, Config{})
		for i, gone := range ms {
			without := mustNew(t, slices.Delete(slices.Clone(ms), i, i+1), Config{})
			for _, k := range ks {
				rep, ok := r.Replica(k)
				if !ok || rep == r.Owner(k) {
					t.Fatalf("%d members: Replica(%s) = %s, %v; owner %s", n, k, rep.Name, ok, r.Owner(k).Name)
				}
				if r.Owner(k) == gone && without.Owner(k) != rep {
					t.Fatalf("%d members, %s removed: key %s went to %s, replica was %s", n, gone.Name, k, without.Owner(k).Name, rep.Name)
				}
			}
		}
	}
}

func TestEpoch(t *testing.T) {
	ms := members(5)
	base := mustNew(t, ms, Config{})
	if base.Epoch() == 0 {
		t.Fatal("epoch of a non-empty ring is 0")
	}
	if e := mustNew(t, ms, Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}).Epoch(); e != base.Epoch() {
		t.Fatalf("explicit defaults: epoch %x, want %x as for the zero Config", e, base.Epoch())
	}
	renamed := slices.Clone(ms)
	renamed[2].Name = "node-x"
	moved := slices.Clone(ms)
	moved[2].Addr = "10.0.0.99:7000"
	// Length prefixes keep field boundaries: "ab"+"c" is not "a"+"bc".
	split1 := []Member{{Name: "ab", Addr: "c"}}
	split2 := []Member{{Name: "a", Addr: "bc"}}
	seen := map[uint64]string{base.Epoch(): "base"}
	for _, tc := range []struct {
		name string
		ms   []Member
		cfg  Config
	}{
		{"member removed", ms[:4], Config{}},
		{"member added", members(6), Config{}},
		{"member renamed", renamed, Config{}},
		{"address changed", moved, Config{}},
		{"PartitionCount", ms, Config{PartitionCount: 272}},
		{"ReplicationFactor", ms, Config{ReplicationFactor: 21}},
		{"Load", ms, Config{Load: 1.3}},
		{"split 1", split1, Config{}},
		{"split 2", split2, Config{}},
	} {
		e := mustNew(t, tc.ms, tc.cfg).Epoch()
		if prev, ok := seen[e]; ok {
			t.Errorf("%s: epoch %x equals that of %s", tc.name, e, prev)
		}
		seen[e] = tc.name
	}
	// A new address changes the epoch but moves no key.
	if m := mustNew(t, moved, Config{}); !slices.Equal(m.owner, base.owner) {
		t.Error("an address change moved partitions")
	}
}

func TestOwnerAllocs(t *testing.T) {
	r := mustNew(t, members(10), Config{})
	k := []byte("+8613800138000")
	ks := string(k)
	var sink Member
	for name, f := range map[string]func(){
		"Owner":       func() { sink = r.Owner(k) },
		"OwnerString": func() { sink = r.OwnerString(ks) },
		"Replica":     func() { sink, _ = r.Replica(k) },
		"PartitionHash": func() {
			sink = r.PartitionOwner(r.PartitionHash(HashString(ks)))
		},
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, n)
		}
	}
	_ = sink
}

func TestPartitionOwnerOutOfRange(t *testing.T) {
	r := mustNew(t, members(3), Config{PartitionCount: 7})
	for _, p := range []int{-1, 7, math.MaxInt} {
		if m := r.PartitionOwner(p); m != (Member{}) {
			t.Errorf("PartitionOwner(%d) = %+v, want zero", p, m)
		}
		if m, ok := r.PartitionReplica(p); ok || m != (Member{}) {
			t.Errorf("PartitionReplica(%d) = %+v, %v, want zero, false", p, m, ok)
		}
	}
}

func TestAccessors(t *testing.T) {
	ms := members(4)
	slices.Reverse(ms)
	r := mustNew(t, ms, Config{PartitionCount: 31})
	got := r.Members()
	if !slices.IsSortedFunc(got, func(a, b Member) int { return strings.Compare(a.Name, b.Name) }) || len(got) != 4 || r.Len() != 4 {
		t.Fatalf("Members() = %v, want 4 sorted by name", got)
	}
	got[0].Name = "changed"
	if r.Members()[0].Name == "changed" {
		t.Fatal("Members() returned the ring's own slice")
	}
	if c := r.Config(); c != (Config{PartitionCount: 31, ReplicationFactor: DefaultReplicationFactor, Load: DefaultLoad}) {
		t.Fatalf("Config() = %+v, want defaults filled in", c)
	}
	k := []byte("+8613800138000")
	if r.Partition(k) != r.PartitionString(string(k)) || r.Partition(k) != r.PartitionHash(Hash(k)) ||
		r.Partition(k) != int(xxhash.Sum64(k)%31) {
		t.Fatal("Partition, PartitionString and PartitionHash disagree")
	}
	if r.Owner(k) != r.OwnerString(string(k)) || r.Owner(k) != r.PartitionOwner(r.Partition(k)) {
		t.Fatal("Owner, OwnerString and PartitionOwner disagree")
	}
}

// placementGolden fingerprints the owner and replica tables of members(5)
// under the default Config. If this test fails, an upgrade of consistent or
// xxhash changed placement: bump placementVersion (so old and new binaries
// never share an epoch) and update the constant.
const placementGolden = 0xed1191b24db8071f

func TestPlacementGolden(t *testing.T) {
	r := mustNew(t, members(5), Config{})
	var b []byte
	for p := range r.owner {
		b = binary.LittleEndian.AppendUint32(b, uint32(r.owner[p]))
		b = binary.LittleEndian.AppendUint32(b, uint32(r.replica[p]))
	}
	if got := xxhash.Sum64(b); got != placementGolden {
		t.Fatalf("placement fingerprint %#x, want %#x: placement changed; bump placementVersion", got, uint64(placementGolden))
	}
}
