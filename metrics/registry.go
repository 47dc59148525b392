package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a registry holding the Collector of src, the
// Observer obs (nil for none) and the Go runtime and process collectors
// (go_*, process_*): what a node's /metrics serves.
func NewRegistry(src Source, obs *Observer) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if obs != nil {
		reg.MustRegister(obs)
	}
	return reg
}
