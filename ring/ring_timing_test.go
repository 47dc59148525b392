package ring

import (
	"fmt"
	"testing"

	"github.com/buraksezer/consistent"
)

var sinkMember Member

func BenchmarkOwner(b *testing.B) {
	for _, n := range []int{3, 10, 100} {
		r := mustNew(b, members(n), Config{})
		ks := keys(1024)
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(ks[0])))
			i := 0
			for b.Loop() {
				sinkMember = r.Owner(ks[i&1023])
				i++
			}
		})
	}
}

func BenchmarkOwnerString(b *testing.B) {
	r := mustNew(b, members(10), Config{})
	ks := make([]string, 1024)
	for i, k := range keys(1024) {
		ks[i] = string(k)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(ks[0])))
	i := 0
	for b.Loop() {
		sinkMember = r.OwnerString(ks[i&1023])
		i++
	}
}

func BenchmarkOwnerParallel(b *testing.B) {
	r := mustNew(b, members(10), Config{})
	ks := keys(1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(ks[0])))
	b.RunParallel(func(pb *testing.PB) {
		var m Member
		i := 0
		for pb.Next() {
			m = r.Owner(ks[i&1023])
			i++
		}
		_ = m
	})
}

func BenchmarkReplica(b *testing.B) {
	r := mustNew(b, members(10), Config{})
	ks := keys(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		sinkMember, _ = r.Replica(ks[i&1023])
		i++
	}
}

// BenchmarkConsistentLocateKey is the library's own lookup, for comparison:
// a read lock and a map lookup behind an interface.
func BenchmarkConsistentLocateKey(b *testing.B) {
	ms := make([]consistent.Member, 10)
	for i := range ms {
		ms[i] = node(fmt.Sprintf("node-%d", i))
	}
	c := consistent.New(ms, consistent.Config{Hasher: hasher{}, PartitionCount: 271, ReplicationFactor: 20, Load: 1.25})
	ks := keys(1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(ks[0])))
	var m consistent.Member
	i := 0
	for b.Loop() {
		m = c.LocateKey(ks[i&1023])
		i++
	}
	_ = m
}

// BenchmarkNew measures a full build (placement plus replica table), which
// every node and client pays on each membership change.
func BenchmarkNew(b *testing.B) {
	for _, n := range []int{3, 10, 100, 300} {
		ms := members(n)
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(ms, Config{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
