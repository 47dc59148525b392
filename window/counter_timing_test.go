package window

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkAlgorithms (algorithms_timing_test.go) measures check-and-record.
// BenchmarkAlgorithmOps measures the other operations on the same warm
// records (one rule per hour, 60% of the limit used, sends spread over the
// hour): a Peek (decode and decide, nothing written), Insert of a replayed
// send 30 minutes old (WAL replay), Merge of two copies of the record, and
// Remove (refund) of the newest send.
func BenchmarkAlgorithmOps(b *testing.B) {
	const hour = int64(time.Hour / time.Millisecond)
	for _, bc := range []struct {
		name string
		rule Rule
	}{
		{"sliding-log-1000", Rule{Algorithm: SlidingLog, Limit: 1000}},
		{"sliding-counter-10000", Rule{Algorithm: SlidingCounter, Limit: 10_000}},
		{"sliding-counter-1M", Rule{Algorithm: SlidingCounter, Limit: 1_000_000}},
		{"fixed-window-10000", Rule{Algorithm: FixedWindow, Limit: 10_000}},
		{"token-bucket-10000", Rule{Algorithm: TokenBucket, Limit: 10_000}},
		{"leaky-bucket-10000", Rule{Algorithm: LeakyBucket, Limit: 10_000}},
		{"gcra-10000", Rule{Algorithm: GCRA, Limit: 10_000}},
	} {
		r := bc.rule
		r.Name, r.Scope, r.Window = "hour", ScopeRecipient, time.Hour
		d, err := NewDomain("bench", []Rule{r})
		if err != nil {
			b.Fatal(err)
		}
		// The warm record: 60% of the limit in at most 1,000 record-only
		// sends (costs carry the rest), in time order over the past hour,
		// the newest at now.
		rng := rand.New(rand.NewPCG(2, 2))
		now := t0 + 10*hour
		var s Scratch
		var dec Decision
		var rec []byte
		left := int64(r.Limit) * 6 / 10
		sends := min(left, 1000)
		for i := range sends {
			cost := left / (sends - i)
			left -= cost
			at := now - hour + 1 + (i+1)*(hour-1)/sends - rng.Int64N(hour/sends/2+1)
			if i == sends-1 {
				at = now
			}
			out, err := d.Apply(&s, rec, 1, at, Item{Cost: int(min(cost, MaxCost)), Mode: RecordOnly}, &dec)
			if err != nil {
				b.Fatal(err)
			}
			if out != nil {
				rec = slices.Clone(out)
			}
		}
		other := slices.Clone(rec)
		for _, op := range []struct {
			name string
			do   func() error
		}{
			{"peek", func() error { _, err := d.Apply(&s, rec, 1, now, Item{Mode: Peek}, &dec); return err }},
			{"insert-30min-old", func() error { _, err := d.Insert(&s, rec, 1, now-hour/2, Item{}); return err }},
			{"merge", func() error { _, err := d.Merge(&s, rec, other); return err }},
			{"remove-newest", func() error { _, _, _, err := d.Remove(&s, rec, 1, now, Item{}); return err }},
		} {
			b.Run(op.name+"/"+bc.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := op.do(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(rec)), "bytes/key")
			})
		}
	}
}
