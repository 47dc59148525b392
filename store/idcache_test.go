package store

import (
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
)

func TestIDCacheHorizon(t *testing.T) {
	var c idCache
	const horizon, capacity = 1000, 100
	c.put(1, 0, idPrint{}, 0, horizon, capacity)
	for _, tc := range []struct {
		now  int64
		want bool
	}{{0, true}, {499, true}, {999, true}, {1000, false}} {
		if _, ok := c.get(1, tc.now, horizon); ok != tc.want {
			t.Fatalf("id decided at 0, looked up at %d: found %v, want %v", tc.now, ok, tc.want)
		}
	}
	// Later puts do not cut an id's horizon short (two generations did: an
	// id could be forgotten half a horizon after its decision).
	c.put(2, 600, idPrint{}, 600, horizon, capacity)
	c.put(3, 990, idPrint{}, 990, horizon, capacity)
	if _, ok := c.get(1, 999, horizon); !ok {
		t.Fatal("id 1 forgotten before its horizon")
	}
	c.put(4, 1200, idPrint{}, 1200, horizon, capacity)
	if _, ok := c.get(1, 1200, horizon); ok {
		t.Fatal("id 1 kept past its horizon")
	}
	if e, ok := c.get(2, 1200, horizon); !ok || e.at != 600 {
		t.Fatalf("id 2: %d %v", e.at, ok)
	}
	if c.evicted != 0 {
		t.Fatalf("%d ids evicted below capacity", c.evicted)
	}
}

// TestIDCacheMatchesReference runs random puts, refunds and lookups, with
// time moving at random speeds and bursts above capacity, against a
// reference that remembers every id: the cache must answer every live id
// among the capacity/2 youngest with its entry, never one past its
// horizon, never one it was not given, and hold no more than capacity.
func TestIDCacheMatchesReference(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		horizon := int64(1 + rng.IntN(2000))
		capacity := 1 + rng.IntN(300)
		var c idCache
		type ref struct {
			key uint64
			e   idEntry
		}
		var all []ref // every put, latest entry per key
		now := int64(rng.IntN(1000))
		keys := uint64(1 + rng.IntN(2*capacity+10))
		for step := range 3000 {
			switch r := rng.IntN(10); {
			case r < 6: // a put; now and then an id decided a little before now
				k := rng.Uint64N(keys) // 0 included: folded into 1
				at := now - int64(rng.IntN(3))
				p := idPrint{content: rng.Uint32() | 1, cost: uint16(1 + rng.IntN(3))}
				if _, ok := c.get(k, now, horizon); ok {
					continue // the store puts only ids it does not know, or refunded ones
				}
				c.put(k, at, p, now, horizon, capacity)
				all = slices.DeleteFunc(all, func(x ref) bool { return idSlotKey(x.key) == idSlotKey(k) })
				all = append(all, ref{k, idEntry{at: at, idPrint: p}})
			case r < 7 && len(all) > 0: // a refund of a known id
				x := &all[rng.IntN(len(all))]
				if c.markRefunded(x.key) {
					x.e.refunded = true
				}
			default: // time moves, now and then by more than a horizon
				if rng.IntN(50) == 0 {
					now += horizon + int64(rng.IntN(int(horizon)))
				} else {
					now += int64(rng.IntN(int(horizon)/20 + 2))
				}
			}
			if c.used > capacity || c.used > len(c.slots)*3/4 {
				t.Fatalf("seed %d step %d: %d slots used of %d, capacity %d", seed, step, c.used, len(c.slots), capacity)
			}
			// The live ids, youngest first: the first capacity/2 must be
			// remembered as they were put.
			var live []ref
			for _, x := range all {
				if now-x.e.at < horizon {
					live = append(live, x)
				}
			}
			slices.SortStableFunc(live, func(a, b ref) int { return int(b.e.at - a.e.at) })
			for i, x := range live {
				e, ok := c.get(x.key, now, horizon)
				// Ids decided in one millisecond are equally young: x must
				// be remembered if it and those as young as it fit.
				asYoung := i + 1
				for asYoung < len(live) && live[asYoung].e.at == x.e.at {
					asYoung++
				}
				if asYoung <= capacity/2 && (!ok || e != x.e) {
					t.Fatalf("seed %d step %d: live id %d (%d of %d youngest, capacity %d): got %+v %v, want %+v", seed, step, x.key, i, len(live), capacity, e, ok, x.e)
				}
				if ok && e != x.e {
					t.Fatalf("seed %d step %d: id %d: got %+v, want %+v", seed, step, x.key, e, x.e)
				}
			}
			for k := range keys {
				if !slices.ContainsFunc(live, func(x ref) bool { return idSlotKey(x.key) == idSlotKey(k) }) {
					if e, ok := c.get(k, now, horizon); ok {
						t.Fatalf("seed %d step %d: id %d found (%+v), but it is past its horizon or was never put", seed, step, k, e)
					}
				}
			}
		}
	}
}

func TestIDCacheEvictsTheOldestAndCounts(t *testing.T) {
	var c idCache
	const horizon, capacity = 1_000_000, 100
	for k := range uint64(500) {
		c.put(k+1, int64(k), idPrint{}, int64(k), horizon, capacity)
	}
	if c.len() > capacity || c.evicted == 0 {
		t.Fatalf("after a burst: %d ids held, %d evicted; want at most %d and some", c.len(), c.evicted, capacity)
	}
	if int64(c.len())+c.evicted != 500 {
		t.Fatalf("%d held + %d evicted, want the 500 put", c.len(), c.evicted)
	}
	for k := uint64(500 - capacity/2); k < 500; k++ {
		if _, ok := c.get(k+1, 500, horizon); !ok {
			t.Fatalf("id %d of the %d youngest forgotten", k+1, capacity/2)
		}
	}
	if _, ok := c.get(1, 500, horizon); ok {
		t.Fatal("the oldest id survived a burst of five times the capacity")
	}
}

// TestIDCacheAccountsItsTable checks that the heap account follows the
// table as it grows and shrinks.
func TestIDCacheAccountsItsTable(t *testing.T) {
	var held atomic.Int64
	c := idCache{held: &held}
	const horizon, capacity = 100, 10_000
	for k := range uint64(1000) {
		c.put(k+1, 0, idPrint{}, 0, horizon, capacity)
	}
	if got, want := held.Load(), int64(len(c.slots))*idSlotBytes; got != want || want == 0 {
		t.Fatalf("held %d bytes, the table takes %d", got, want)
	}
	big := len(c.slots)
	// Past the horizon, the next rebuild keeps nothing: the table shrinks.
	for k := range uint64(big) {
		c.put(k+5000, 1000, idPrint{}, 1000, horizon, capacity)
		if len(c.slots) < big {
			break
		}
	}
	if len(c.slots) >= big || held.Load() != int64(len(c.slots))*idSlotBytes {
		t.Fatalf("after expiry: %d slots (were %d), held %d", len(c.slots), big, held.Load())
	}
}
