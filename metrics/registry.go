package metrics

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// gcCPU selects, beside the Go collector's defaults, the runtime's
// estimates of CPU time, in seconds: spent by the garbage collector
// (go_cpu_classes_gc_total_cpu_seconds_total), idle
// (go_cpu_classes_idle_cpu_seconds_total) and available, GOMAXPROCS times
// the wall time (go_cpu_classes_total_cpu_seconds_total). The GC's share
// of the CPU the process used is rate(gc) / (rate(total) - rate(idle)); the
// runtime updates them at each GC.
var gcCPU = collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/(gc/total|idle|total):cpu-seconds$`)}

// NewRegistry returns a registry holding the Collector of src, the
// Observer obs (nil for none) and the Go runtime and process collectors
// (go_*, process_*): what a node's /metrics serves.
func NewRegistry(src Source, obs *Observer) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src), collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPU)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if obs != nil {
		reg.MustRegister(obs)
	}
	return reg
}
