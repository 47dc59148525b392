package window

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkAlgorithms measures one check-and-record decision of a one-rule
// domain of each algorithm on a key whose record is warm: 60% of its limit
// used, spread over the past hour. It reports the record's size as
// bytes/key: a sliding log at 1,000/hour keeps every send of the hour, the
// counters at 10,000/hour (and 1,000,000/hour) a few numbers.
func BenchmarkAlgorithms(b *testing.B) {
	const hour = int64(time.Hour / time.Millisecond)
	for _, bc := range []struct {
		name string
		rule Rule
	}{
		{"sliding-log-1000", Rule{Algorithm: SlidingLog, Limit: 1000}},
		{"sliding-counter-10000", Rule{Algorithm: SlidingCounter, Limit: 10_000}},
		{"sliding-counter-1000000", Rule{Algorithm: SlidingCounter, Limit: 1_000_000}},
		{"fixed-window-10000", Rule{Algorithm: FixedWindow, Limit: 10_000}},
		{"token-bucket-10000", Rule{Algorithm: TokenBucket, Limit: 10_000}},
		{"leaky-bucket-10000", Rule{Algorithm: LeakyBucket, Limit: 10_000}},
		{"gcra-10000", Rule{Algorithm: GCRA, Limit: 10_000}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := bc.rule
			r.Name, r.Scope, r.Window = "hour", ScopeRecipient, time.Hour
			d, err := NewDomain("bench", []Rule{r})
			if err != nil {
				b.Fatal(err)
			}
			// Warm the record: 60% of the limit, in time order over the
			// hour, recorded without checks (cost up to MaxCost each).
			rng := rand.New(rand.NewPCG(1, 1))
			now := t0 + 10*hour
			var s Scratch
			var dec Decision
			var rec []byte
			left := int64(r.Limit) * 6 / 10
			sends := min(left, 1000) // at most 1,000 records: costs carry the rest
			for i := range sends {
				cost := left / (sends - i)
				left -= cost
				at := now - hour + 1 + (i*hour-rng.Int64N(hour/sends/2+1))/sends
				out, err := d.Apply(&s, rec, 1, max(at, now-hour+1), Item{Cost: int(cost), Mode: RecordOnly}, &dec)
				if err != nil {
					b.Fatal(err)
				}
				if out != nil {
					rec = append(rec[:0], out...)
				}
			}
			var peek Decision
			if _, err := d.Apply(&s, rec, 1, now, Item{Mode: Peek}, &peek); err != nil || !peek.Admitted {
				b.Fatalf("warm record does not admit: %v %+v", err, peek.Rules[0])
			}
			b.ReportAllocs()
			for b.Loop() {
				// The same warm record each time: every iteration decodes,
				// decides, records and encodes.
				out, err := d.Apply(&s, rec, 1, now, Item{}, &dec)
				if err != nil || !dec.Recorded {
					b.Fatal(err, dec)
				}
				sinkBytes = out
			}
			b.ReportMetric(float64(len(rec)), "bytes/key")
		})
	}
}
