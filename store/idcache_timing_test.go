package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkIDCache measures what request ids cost a recorded item: a lookup
// of a new id and its put, in one of 271 partitions' caches drawn at
// random, with time moving so that each cache holds about live ids within
// the horizon (the 1M-id capacity split over 271 partitions is 3,869: live
// 5,000 is a cache at capacity).
//
//	go test -run '^$' -bench IDCache ./store
func BenchmarkIDCache(b *testing.B) {
	const parts, horizon, capacity = 271, 60_000, 1 << 20 / 271
	for _, live := range []int{80, 800, 5000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			caches := make([]idCache, parts)
			rng := rand.New(rand.NewPCG(1, 2))
			step := float64(horizon) / float64(live*parts) // ms per put
			put := func(i int) {
				now := int64(float64(i) * step)
				c := &caches[rng.IntN(parts)]
				k := rng.Uint64()
				if _, ok := c.get(k, now, horizon); !ok {
					c.put(k, now, idPrint{content: 1, cost: 1}, now, horizon, capacity)
				}
			}
			warm := 2 * live * parts // two horizons
			for i := range warm {
				put(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := warm; b.Loop(); i++ {
				put(i)
			}
		})
	}
}
