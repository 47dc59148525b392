package node

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkSynth measures Synthesize: recipients at the seed's steady state
// written as a snapshot, per recipient.
//
//	go test -run '^$' -bench Synth -benchtime 1x ./node
func BenchmarkSynth(b *testing.B) {
	for _, n := range []int{1_000_000} {
		b.Run(fmt.Sprintf("recipients=%d", n), func(b *testing.B) {
			for b.Loop() {
				st, err := Synthesize(context.Background(), SynthConfig{DataDir: filepath.Join(b.TempDir(), "d"), Recipients: n, Now: t0 + 86_400_000})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(st.Took.Seconds(), "synth-s")
				b.ReportMetric(float64(st.Took.Nanoseconds())/float64(n), "ns/recipient")
				b.ReportMetric(float64(st.Bytes)/float64(n), "disk-B/recipient")
			}
		})
	}
}
