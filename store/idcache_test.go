package store

import "testing"

func TestIDCacheGenerations(t *testing.T) {
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
	c.put(2, 600, idPrint{}, 600, horizon, capacity) // rotates: 1 moves to prev
	if _, ok := c.get(1, 700, horizon); !ok {
		t.Fatal("id 1 lost by the first rotation")
	}
	c.put(3, 1200, idPrint{}, 1200, horizon, capacity) // rotates again: 1 is gone
	if _, ok := c.get(1, 1200, horizon); ok {
		t.Fatal("id 1 kept past two rotations")
	}
	if e, ok := c.get(2, 1200, horizon); !ok || e.at != 600 {
		t.Fatalf("id 2: %d %v", e.at, ok)
	}
	// Capacity: a burst within one half-horizon rotates early and counts it.
	var d idCache
	for k := range uint64(500) {
		d.put(k+1, 5, idPrint{}, 5, horizon, capacity)
	}
	if d.len() > capacity || d.early == 0 {
		t.Fatalf("after a burst: %d ids held, %d early rotations; want at most %d and some", d.len(), d.early, capacity)
	}
}
