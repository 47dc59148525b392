package window

import (
	"math/rand/v2"
)

// Send is one recorded send of a workload: its time (unix ms) and content
// hash (0 for none).
type Send struct {
	At      int64
	Content uint64
}

// SteadyStateSends returns, in time order, the sends of one recipient at the
// seed's steady state as of now (unix ms): 3 billion messages a day over 100
// million recipients is 30 sends a day each. 27 sends fall uniformly at random
// in (now-24h, now-1h] and 3 in (now-1h, now], each of the 3 with its own
// content, so the record holds 30 recipient timestamps and 3 live content
// logs. The memory and speed figures of docs/benchmarks.md use this state.
func SteadyStateSends(rng *rand.Rand, now int64) []Send {
	return AppendSteadyStateSends(make([]Send, 0, 30), rng, now)
}

// AppendSteadyStateSends appends SteadyStateSends(rng, now) to dst, drawing
// the same numbers from rng, and returns it.
func AppendSteadyStateSends(dst []Send, rng *rand.Rand, now int64) []Send {
	const hour, day = 3_600_000, 86_400_000
	start := len(dst)
	for range 27 {
		dst = append(dst, Send{At: now - hour - rng.Int64N(day-hour), Content: rng.Uint64() | 1})
	}
	for i := range 3 {
		dst = append(dst, Send{At: now - rng.Int64N(hour), Content: uint64(i+1) * 0x9e3779b97f4a7c15})
	}
	// Insertion sort: for 30 sends, several times faster than slices.SortFunc.
	s := dst[start:]
	for i := 1; i < len(s); i++ {
		x, j := s[i], i
		for ; j > 0 && s[j-1].At > x.At; j-- {
			s[j] = s[j-1]
		}
		s[j] = x
	}
	return dst
}

// SteadyStateRecord returns the record of d holding SteadyStateSends(rng,
// now), with tag 0, built through Apply.
func SteadyStateRecord(d *Domain, rng *rand.Rand, now int64) ([]byte, error) {
	var s Scratch
	var dec Decision
	var rec []byte
	for _, snd := range SteadyStateSends(rng, now) {
		r, err := d.Apply(&s, rec, 0, snd.At, Item{Content: snd.Content}, &dec)
		if err != nil {
			return nil, err
		}
		if r != nil {
			rec = append(rec[:0], r...)
		}
	}
	return rec, nil
}
