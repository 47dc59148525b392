package window

import (
	"slices"
	"testing"
)

// BenchmarkAlgorithms (algorithms_timing_test.go) measures check-and-record.
// BenchmarkAlgorithmOps measures the other operations on the same warm
// records (warmDomain): a Peek (decode and decide, nothing written), Insert of a replayed
// send 30 minutes old (WAL replay), Merge of two copies of the record, and
// Remove (refund) of the newest send.
func BenchmarkAlgorithmOps(b *testing.B) {
	const hour = benchHour
	for _, bc := range benchAlgorithms {
		now := t0 + 10*hour
		d, rec := warmDomain(b, bc.rule, now)
		var s Scratch
		var dec Decision
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
