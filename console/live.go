package console

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// liveSpan is how far back the Live page looks, in one-second samples.
const liveSpan = 15 * 60

// liveIdle stops the sampler once no Live page has asked for this long.
const liveIdle = 30 * time.Second

// sampler reads the cluster's usage counters once a second while a Live
// page is open (it asked within liveIdle), and keeps the last liveSpan
// samples. It is safe for concurrent use.
type sampler struct {
	b       Backend
	now     func() time.Time
	timeout time.Duration
	wake    chan struct{}
	stop    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	asked   time.Time // the last Live request
	samples []sample  // oldest first, at most liveSpan+1
	err     string    // the last sample's failure, "" if it succeeded
}

// sample is the cluster's counters of today (UTC) at one time.
type sample struct {
	at     time.Time
	counts map[string]int64 // "domain" -> admitted, "domain\x00-" -> denied, "domain\x00rule" -> denied by rule
}

func newSampler(b Backend, now func() time.Time, timeout time.Duration) *sampler {
	s := &sampler{b: b, now: now, timeout: timeout, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	go s.loop()
	return s
}

func (s *sampler) close() { s.once.Do(func() { close(s.stop) }) }

// loop samples every second while the page is watched, and sleeps until
// asked otherwise.
func (s *sampler) loop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.mu.Lock()
		idle := s.now().Sub(s.asked) > liveIdle
		s.mu.Unlock()
		if idle {
			select {
			case <-s.wake:
			case <-s.stop:
				return
			}
		}
		s.take()
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
	}
}

// take reads the counters once.
func (s *sampler) take() {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	u, err := s.b.Usage(ctx, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = err.Error()
		return
	}
	s.err = ""
	if len(u.Missing) > 0 {
		s.err = "members missing from the sums: " + strings.Join(u.Missing, "; ")
	}
	now := s.now()
	today := now.UTC().Format(time.DateOnly)
	c := map[string]int64{}
	for _, d := range u.Days {
		if d.Date != today {
			continue
		}
		c[d.Domain] += d.Admitted
		c[d.Domain+"\x00-"] += d.Denied
		for rule, n := range d.DeniedBy {
			c[d.Domain+"\x00"+rule] += n
		}
	}
	s.samples = append(s.samples, sample{at: now, counts: c})
	if len(s.samples) > liveSpan+1 {
		s.samples = slices.Delete(s.samples, 0, len(s.samples)-liveSpan-1)
	}
}

// ask notes a Live request, waking the sampler if it slept.
func (s *sampler) ask() {
	s.mu.Lock()
	s.asked = s.now()
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// liveSeries is one line of the Live page: per second, from the oldest
// sample on.
type liveSeries struct {
	Domain   string    `json:"domain"`
	Rule     string    `json:"rule,omitempty"` // "": the domain's totals
	Admitted []float64 `json:"admitted,omitempty"`
	Denied   []float64 `json:"denied"`
}

// liveData is /live.json.
type liveData struct {
	StartMs int64        `json:"start_ms"` // time of the first point, unix ms
	StepMs  int64        `json:"step_ms"`
	Series  []liveSeries `json:"series"`
	Error   string       `json:"error,omitempty"`
}

// rates returns the per-second rates between consecutive samples.
func (s *sampler) rates() liveData {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := liveData{StepMs: 1000, Error: s.err, Series: []liveSeries{}}
	if len(s.samples) < 2 {
		return d
	}
	d.StartMs = s.samples[1].at.UnixMilli()
	keys := map[string]bool{}
	for _, sm := range s.samples {
		for k := range sm.counts {
			keys[k] = true
		}
	}
	rate := func(k string) []float64 {
		out := make([]float64, 0, len(s.samples)-1)
		for i := 1; i < len(s.samples); i++ {
			a, b := s.samples[i-1], s.samples[i]
			dt := b.at.Sub(a.at).Seconds()
			v := float64(b.counts[k]-a.counts[k]) / max(dt, 0.001)
			out = append(out, max(v, 0)) // a new day, or a member restarted: counters went back
		}
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		domain, rule, isRule := cutNul(k)
		switch {
		case !isRule:
			d.Series = append(d.Series, liveSeries{Domain: domain, Admitted: rate(k), Denied: rate(k + "\x00-")})
		case rule != "-":
			d.Series = append(d.Series, liveSeries{Domain: domain, Rule: rule, Denied: rate(k)})
		}
	}
	return d
}

func (h *Handler) livePage(w http.ResponseWriter, r *http.Request) {
	h.live.ask()
	h.render(w, r, http.StatusOK, "live", "Live", nil, nil)
}

func (h *Handler) liveJSON(w http.ResponseWriter, r *http.Request) {
	h.live.ask()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(h.live.rates())
}

func cutNul(k string) (domain, rule string, ok bool) {
	for i := range len(k) {
		if k[i] == 0 {
			return k[:i], k[i+1:], true
		}
	}
	return k, "", false
}
