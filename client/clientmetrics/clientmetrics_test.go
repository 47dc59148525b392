package clientmetrics_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/client/clientmetrics"
	"github.com/freqring/freqring/node/nodetest"
)

// TestClientMetrics runs a real client against a one-node cluster: a batch
// of two good items and two bad ones (an empty recipient, refused by the
// client; an unknown domain, refused by the node), then a single Check, and
// compares the counters the collector exports.
func TestClientMetrics(t *testing.T) {
	ctx := context.Background()
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	c, err := client.New(ctx, client.Config{Seeds: lc.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.CheckBatch(ctx, []client.Item{{Recipient: "a"}, {Recipient: ""}, {Recipient: "b"}, {Recipient: "c", Domain: "nope"}})
	if errs, ok := err.(client.ItemErrors); !ok || len(errs) != 2 {
		t.Fatalf("batch: %v, want 2 item errors", err)
	}
	if _, err := c.Check(ctx, client.Item{Recipient: "a"}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP freqring_client_calls_total Check and CheckBatch calls.
# TYPE freqring_client_calls_total counter
freqring_client_calls_total 2
# HELP freqring_client_items_total Items in Check and CheckBatch calls.
# TYPE freqring_client_items_total counter
freqring_client_items_total 5
# HELP freqring_client_item_errors_total Items that failed as the caller's error (*client.ItemError), by gRPC code name.
# TYPE freqring_client_item_errors_total counter
freqring_client_item_errors_total{code="InvalidArgument"} 2
# HELP freqring_client_degraded_items_total Items answered by the client's FailurePolicy because no node answered.
# TYPE freqring_client_degraded_items_total counter
freqring_client_degraded_items_total 0
`
	col := clientmetrics.NewCollector(c)
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "freqring_client_calls_total", "freqring_client_items_total",
		"freqring_client_item_errors_total", "freqring_client_degraded_items_total"); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if got := testutil.ToFloat64(prometheusSum(col, "freqring_client_rpcs_total")); got != float64(s.RPCs) || got < 2 {
		t.Fatalf("rpcs: exported %v, Stats().RPCs %d", got, s.RPCs)
	}
	if n, err := testutil.GatherAndLint(registry(col)); err != nil || len(n) != 0 {
		t.Fatalf("lint: %v %v", n, err)
	}
}

// prometheusSum returns a gauge holding the sum of the samples of the
// metric name that col collects.
func prometheusSum(col prometheus.Collector, name string) prometheus.Collector {
	reg := registry(col)
	mfs, _ := reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sum"})
	g.Set(sum)
	return g
}

func registry(col prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	return reg
}
