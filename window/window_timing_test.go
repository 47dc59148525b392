package window

import (
	"math"
	"math/rand/v2"
	"testing"
)

// SteadyRecord builds the record of the seed's steady state (see
// SteadyStateSends) at time now, for benchmarks and memory figures.
func steadyRecord(tb testing.TB, d *Domain, rng *rand.Rand, now int64) []byte {
	tb.Helper()
	var s Scratch
	var rec []byte
	var dec Decision
	for _, snd := range SteadyStateSends(rng, now) {
		out, err := d.Apply(&s, rec, 1, snd.At, Item{Content: snd.Content}, &dec)
		if err != nil {
			tb.Fatal(err)
		}
		if out != nil {
			rec = append(rec[:0], out...)
		}
	}
	return rec
}

// BenchmarkApply measures one 4-rule decision on a recipient at the seed's
// steady state (30 sends over 24 h, 3 contents in the last hour), without
// the store around it: decode, decide and, when recording, encode.
func BenchmarkApply(b *testing.B) {
	d, _ := NewDomain("default", DefaultRules())
	rng := rand.New(rand.NewPCG(1, 1))
	now := t0 + 86_400_000
	rec := steadyRecord(b, d, rng, now)
	b.Logf("steady-state record: %d bytes", len(rec))
	for _, bc := range []struct {
		name string
		it   Item
	}{
		{"check-and-record", Item{Content: 77}},
		{"peek", Item{Content: 77, Mode: Peek}},
		{"check-no-content", Item{}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var s Scratch
			var dec Decision
			b.ReportAllocs()
			for b.Loop() {
				// Apply to the same steady record each time, so that
				// every iteration does the same work.
				out, err := d.Apply(&s, rec, 1, now, bc.it, &dec)
				if err != nil || !dec.Admitted {
					b.Fatal(err, dec)
				}
				sinkBytes = out
			}
		})
	}
	b.Run("denied", func(b *testing.B) {
		full := rec
		var s Scratch
		var dec Decision
		for i := range 15 { // fill the 1-minute rule
			out, _ := d.Apply(&s, full, 1, now, Item{Content: uint64(100 + i)}, &dec)
			full = append([]byte(nil), out...)
		}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = d.Apply(&s, full, 1, now, Item{Content: 77}, &dec)
			if dec.Admitted {
				b.Fatal("admitted")
			}
		}
	})
}

var sinkBytes []byte

// BenchmarkBuildSteadyState compares the two ways of writing a record of
// the seed's steady state from its 30 sends: Build in one pass, and one
// Apply per send (decode, decide, encode each time).
//
//	go test -run '^$' -bench BuildSteadyState ./window
func BenchmarkBuildSteadyState(b *testing.B) {
	d, _ := NewDomain("default", DefaultRules())
	sends := SteadyStateSends(rand.New(rand.NewPCG(1, 1)), t0+86_400_000)
	b.Run("build", func(b *testing.B) {
		b.ReportAllocs()
		var s Scratch
		for b.Loop() {
			if _, err := d.Build(&s, 1, sends); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("apply-each", func(b *testing.B) {
		b.ReportAllocs()
		var s Scratch
		var dec Decision
		var rec []byte
		for b.Loop() {
			rec = rec[:0]
			for _, snd := range sends {
				out, err := d.Apply(&s, rec, 1, snd.At, Item{Content: snd.Content, Mode: RecordOnly}, &dec)
				if err != nil {
					b.Fatal(err)
				}
				rec = append(rec[:0], out...)
			}
		}
	})
}

// BenchmarkRecordBytes reports the mean record size, over 1,000 draws, of a
// recipient at the seed's steady state and of one with 3 sends in the last
// hour, each with its own content.
//
//	go test -run '^$' -bench RecordBytes -benchtime 1x ./window
func BenchmarkRecordBytes(b *testing.B) {
	d, _ := NewDomain("default", DefaultRules())
	now := t0 + 86_400_000
	for b.Loop() {
		rng := rand.New(rand.NewPCG(1, 1))
		var steady, three int
		for range 1000 {
			steady += len(steadyRecord(b, d, rng, now))
			var s Scratch
			var dec Decision
			var rec []byte
			start := now - 3_600_000 + rng.Int64N(1_800_000)
			for i := range 3 {
				out, err := d.Apply(&s, rec, 1, start+rng.Int64N(600_000)+int64(i)*600_000, Item{Content: uint64(i + 1)}, &dec)
				if err != nil {
					b.Fatal(err)
				}
				rec = append(rec[:0], out...)
			}
			three += len(rec)
		}
		b.ReportMetric(float64(steady)/1000, "steady-B/record")
		b.ReportMetric(float64(three)/1000, "3-sends-B/record")
	}
}

// BenchmarkCodec splits BenchmarkApply's check-and-record into the codec's
// parts, on the same steady-state record: decode, prune at the record's
// newest send (nothing to drop) and encode.
//
//	go test -run '^$' -bench Codec ./window
func BenchmarkCodec(b *testing.B) {
	d, _ := NewDomain("default", DefaultRules())
	now := t0 + 86_400_000
	rec := steadyRecord(b, d, rand.New(rand.NewPCG(1, 1)), now)
	var st state
	if err := st.decode(rec); err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		var s state
		for b.Loop() {
			if err := s.decode(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("prune", func(b *testing.B) {
		for b.Loop() {
			d.prune(&st, st.newest)
		}
	})
	b.Run("encode", func(b *testing.B) {
		var out []byte
		for b.Loop() {
			out = st.encode(out[:0])
		}
		if string(out) != string(rec) {
			b.Fatal("the record did not encode to its own bytes")
		}
	})
}

// BenchmarkSteadyStateBits measures where a steady-state record's bytes go
// against the floor for its send times, over 10,000 recipients of
// SteadyStateSends (it times nothing; b.N does not matter). It reports per
// record: record-B, its whole size; times-B, what its recipient log takes
// (the newest time, the log's count, age bit, width and its 29 fixed-width
// gaps); rice-B, the same times with the gaps in a Rice code of the best
// parameter for each record (plus 6 bits to say which), the shortest
// per-record gap code one could decode as fast; floor-B, log2 of the number
// of ways to place 30 distinct ms times in a day, what any exact coding of
// the times must spend on average (issue 13's floor).
//
//	go test -run '^$' -bench SteadyStateBits -benchtime 1x ./window
func BenchmarkSteadyStateBits(b *testing.B) {
	d, _ := NewDomain("default", DefaultRules())
	now := t0 + 86_400_000
	rng := rand.New(rand.NewPCG(1, 1))
	const n, day = 10_000, 86_400_000
	var recBits, timesBits, riceBits float64
	var st state
	for range n {
		rec := steadyRecord(b, d, rng, now)
		if err := st.decode(rec); err != nil {
			b.Fatal(err)
		}
		recBits += float64(8 * len(rec))
		g := st.recip
		var or int64
		for i := 1; i < len(g); i++ {
			or |= g[i] - g[i-1]
		}
		head := float64(timeBits + countBits + 1 + widthBits) // newest, count, age bit, width
		timesBits += head + float64((len(g)-1)*int(widthOf(or)))
		best := math.Inf(1)
		for k := range maxValueBits {
			var bitsK float64
			for i := 1; i < len(g); i++ {
				bitsK += float64(k + 1 + int((g[i]-g[i-1])>>k)) // quotient in unary, k low bits
			}
			best = min(best, bitsK)
		}
		riceBits += head + best
	}
	lg := func(x float64) float64 { v, _ := math.Lgamma(x); return v }
	floor := (lg(day+1) - lg(30+1) - lg(day-30+1)) / math.Ln2 // log2 C(day, 30)
	for b.Loop() {
	}
	b.ReportMetric(recBits/n/8, "record-B")
	b.ReportMetric(timesBits/n/8, "times-B")
	b.ReportMetric(riceBits/n/8, "rice-B")
	b.ReportMetric(floor/8, "floor-B")
}
