// Package clientmetrics exposes a freqring client's counters to Prometheus.
// It lives apart from package client so that a sender that does not want
// Prometheus links only ring, api and grpc: register a Collector to opt in.
//
//	reg.MustRegister(clientmetrics.NewCollector(c))
//
// Metric names start with freqring_client_ and are a public contract (the
// docs/operations.md lists them). No label holds a recipient or a content.
package clientmetrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/freqring/freqring/client"
)

// Source is what a Collector reads: a *client.Client.
type Source interface {
	Stats() client.Stats
}

// Collector is a prometheus.Collector reading a client's Stats on each
// scrape. Safe for concurrent use.
type Collector struct {
	src Source
}

// NewCollector returns a Collector reading src.
func NewCollector(src Source) *Collector { return &Collector{src: src} }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descCalls = desc("freqring_client_calls_total",
		"Check and CheckBatch calls.")
	descItems = desc("freqring_client_items_total",
		"Items in Check and CheckBatch calls.")
	descRPCs = desc("freqring_client_rpcs_total",
		"Requests sent to nodes, by transport: unary Check RPCs or requests on a CheckStream.", "transport")
	descRetries = desc("freqring_client_retried_items_total",
		"Items sent a second time, after a ring refresh.")
	descDegraded = desc("freqring_client_degraded_items_total",
		"Items answered by the client's FailurePolicy because no node answered.")
	descItemErrors = desc("freqring_client_item_errors_total",
		"Items that failed as the caller's error (*client.ItemError), by gRPC code name.", "code")
	descDuplicates = desc("freqring_client_duplicate_items_total",
		"Items a node answered from its idempotency table.")
	descCoalesced = desc("freqring_client_coalesced_items_total",
		"Items of single Checks that shared a request with another caller's.")
	descRingRefreshes = desc("freqring_client_ring_refreshes_total",
		"Rounds of Ring RPCs after the first ring (for a retry, or on an answer with another epoch).")
	descRingChanges = desc("freqring_client_ring_changes_total",
		"Rings installed, the first one included.")
	allDescs = []*prometheus.Desc{descCalls, descItems, descRPCs, descRetries, descDegraded, descItemErrors, descDuplicates,
		descCoalesced, descRingRefreshes, descRingChanges}
)

// Describe sends the descriptions of every metric Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect reads the client's Stats and sends the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descCalls, s.Calls)
	counter(descItems, s.Items)
	counter(descRPCs, s.RPCs-s.Streamed, "unary")
	counter(descRPCs, s.Streamed, "stream")
	counter(descRetries, s.Retries)
	counter(descDegraded, s.Degraded)
	codes := make([]string, 0, len(s.ItemErrorsByCode))
	for code := range s.ItemErrorsByCode {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	for _, code := range codes {
		counter(descItemErrors, s.ItemErrorsByCode[code], code)
	}
	counter(descDuplicates, s.Duplicates)
	counter(descCoalesced, s.Coalesced)
	counter(descRingRefreshes, s.RingRefreshes)
	counter(descRingChanges, s.RingChanges)
}
