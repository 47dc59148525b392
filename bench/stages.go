package bench

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Stages gathers the wall time of each stage of the calls the nodes of a
// target make while a run measures (the server's side of its latency), for
// the run's report: the nodes of a cluster the bench started report each
// stage's time to a StageHistogram (cmd/freqring wires node.Observer to
// it). Safe for concurrent use.
type Stages struct {
	mu        sync.Mutex // guards hists
	hists     []*StageHistogram
	measuring atomic.Bool
}

// StageHistogram is the distribution of one stage of one kind of call.
// Observe is safe for concurrent use.
type StageHistogram struct {
	call, stage string
	s           *Stages
	mu          sync.Mutex // guards h
	h           *hdrhistogram.Histogram
}

// Add returns the histogram of stage of call (names as node's metrics
// label them), in the report's order: the order of the Add calls.
func (s *Stages) Add(call, stage string) *StageHistogram {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &StageHistogram{call: call, stage: stage, s: s, h: hdrhistogram.New(1, 120_000_000_000, 3)}
	s.hists = append(s.hists, h)
	return h
}

// Observe counts one stage that took d, while the run measures.
func (h *StageHistogram) Observe(d time.Duration) {
	if !h.s.measuring.Load() {
		return
	}
	h.mu.Lock()
	h.h.RecordValue(max(1, d.Nanoseconds())) //nolint:errcheck // clamped to the histogram's top
	h.mu.Unlock()
}

// measure empties the histograms and starts counting, or stops.
func (s *Stages) measure(on bool) {
	if on {
		s.mu.Lock()
		for _, h := range s.hists {
			h.mu.Lock()
			h.h.Reset()
			h.mu.Unlock()
		}
		s.mu.Unlock()
	}
	s.measuring.Store(on)
}

// StageLatency is one stage's distribution over a run's measured part.
type StageLatency struct {
	Call, Stage string
	Count       int64   // stages observed
	Latency     Latency // ms
}

// latencies returns the stages observed at least once, in Add order.
func (s *Stages) latencies() []StageLatency {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []StageLatency
	for _, h := range s.hists {
		h.mu.Lock()
		if n := h.h.TotalCount(); n > 0 {
			q := func(p float64) float64 { return float64(h.h.ValueAtQuantile(p)) / 1e6 }
			out = append(out, StageLatency{Call: h.call, Stage: h.stage, Count: n,
				Latency: Latency{P50: q(50), P90: q(90), P99: q(99), P999: q(99.9), Max: float64(h.h.Max()) / 1e6}})
		}
		h.mu.Unlock()
	}
	return out
}
