// Package metrics exposes a freqring node to Prometheus: a Collector that
// reads the node's Stats on each scrape (decisions by domain, rule and
// result; failures by gRPC code; the ring, partitions, records and bytes per
// domain; the WAL, snapshots, replication and the memory account), and an
// Observer, passed to the node as node.Config.Observer, whose histograms
// (buckets, never summaries) time Checks, WAL fsyncs, snapshots and
// recovery.
//
// Metric names are a public contract: every name starts with freqring_ and
// carries its unit (_seconds, _bytes, _total for counters); names are only
// added, never renamed. Labels are bounded sets: domain and rule (from the
// rules file), result, code (a gRPC code name), direction, state. No label
// ever holds a recipient or a content.
//
// Usage, for one node:
//
//	obs := metrics.NewObserver()
//	cfg.Observer = obs
//	n, err := node.New(cfg)
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(obs, metrics.NewCollector(n))
//
// The package imports node and the Prometheus client; node imports neither.
package metrics
