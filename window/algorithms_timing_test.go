package window

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

const benchHour = int64(time.Hour / time.Millisecond)

// benchAlgorithms are the one-rule domains of the algorithm benchmarks: a
// sliding log at 1,000 an hour beside every counting algorithm at 10,000
// (and a sliding counter at 1,000,000).
var benchAlgorithms = []struct {
	name string
	rule Rule
}{
	{"sliding-log-1000", Rule{Algorithm: SlidingLog, Limit: 1000}},
	{"sliding-counter-10000", Rule{Algorithm: SlidingCounter, Limit: 10_000}},
	{"sliding-counter-1000000", Rule{Algorithm: SlidingCounter, Limit: 1_000_000}},
	{"fixed-window-10000", Rule{Algorithm: FixedWindow, Limit: 10_000}},
	{"calendar-hour-UTC-10000", Rule{Algorithm: FixedWindow, Limit: 10_000, Calendar: CalendarHour}},
	{"calendar-hour-New_York-10000", Rule{Algorithm: FixedWindow, Limit: 10_000, Calendar: CalendarHour, Zone: "America/New_York"}},
	{"token-bucket-10000", Rule{Algorithm: TokenBucket, Limit: 10_000}},
	{"leaky-bucket-10000", Rule{Algorithm: LeakyBucket, Limit: 10_000}},
	{"gcra-10000", Rule{Algorithm: GCRA, Limit: 10_000}},
}

// warmDomain returns the domain of r as a one-hour rule (a calendar rule
// keeps its calendar) and the record of a
// key with 60% of its limit used: at most 1,000 record-only sends (costs
// carry the rest, up to MaxCost each) in time order over the past hour, the
// newest at now.
func warmDomain(tb testing.TB, r Rule, now int64) (*Domain, []byte) {
	tb.Helper()
	r.Name, r.Scope = "hour", ScopeRecipient
	if r.Calendar == CalendarNone {
		r.Window = time.Hour
	}
	d, err := NewDomain("bench", []Rule{r})
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	var s Scratch
	var dec Decision
	var rec []byte
	left := int64(r.Limit) * 6 / 10
	sends := min(left, 1000)
	for i := range sends {
		cost := left / (sends - i)
		left -= cost
		at := now - benchHour + 1 + (i+1)*(benchHour-1)/sends - rng.Int64N(benchHour/sends/2+1)
		if i == sends-1 {
			at = now
		}
		out, err := d.Apply(&s, rec, 1, at, Item{Cost: int(min(cost, MaxCost)), Mode: RecordOnly}, &dec)
		if err != nil {
			tb.Fatal(err)
		}
		if out != nil {
			rec = slices.Clone(out)
		}
	}
	if _, err := d.Apply(&s, rec, 1, now, Item{Mode: Peek}, &dec); err != nil || !dec.Admitted {
		tb.Fatalf("warm record does not admit: %v %+v", err, dec.Rules[0])
	}
	return d, rec
}

// BenchmarkAlgorithms measures one check-and-record decision of a one-rule
// domain of each algorithm on a warm key (see warmDomain), and reports the
// record's size as bytes/key: a sliding log at 1,000/hour keeps every send
// of the hour, the counters at 10,000/hour (and 1,000,000/hour) a few
// numbers.
func BenchmarkAlgorithms(b *testing.B) {
	for _, bc := range benchAlgorithms {
		b.Run(bc.name, func(b *testing.B) {
			now := t0 + 10*benchHour
			d, rec := warmDomain(b, bc.rule, now)
			var s Scratch
			var dec Decision
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
