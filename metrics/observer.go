package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/freqring/freqring/node"
)

// Observer is a node.Observer backed by Prometheus histograms, and the
// prometheus.Collector of those histograms. Pass it as node.Config.Observer
// and register it. Each observation is a few atomic adds; safe for
// concurrent use. One Observer serves one node.
type Observer struct {
	checkSeconds    prometheus.Histogram
	checkItems      prometheus.Histogram
	fsyncSeconds    prometheus.Histogram
	snapshotSeconds prometheus.Histogram
	recoverySeconds prometheus.Histogram
}

var _ node.Observer = (*Observer)(nil)

// Bucket bounds of the histograms.
var (
	// CheckBuckets, seconds: 50µs to about 1.6s.
	CheckBuckets = prometheus.ExponentialBuckets(50e-6, 2, 16)
	// ItemBuckets, items per call: 1 to 16384 (a call has at most 10,000).
	ItemBuckets = prometheus.ExponentialBuckets(1, 4, 8)
	// FsyncBuckets, seconds: 100µs to about 0.8s.
	FsyncBuckets = prometheus.ExponentialBuckets(100e-6, 2, 14)
	// SnapshotBuckets, seconds: 10ms to about 5.5 minutes (recovery too).
	SnapshotBuckets = prometheus.ExponentialBuckets(0.01, 2, 16)
)

// NewObserver returns an Observer with empty histograms.
func NewObserver() *Observer {
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	return &Observer{
		checkSeconds: h("freqring_check_duration_seconds",
			"Wall time of a Check call (or one request of a CheckStream) from its arrival to its answer, forwarding and the WAL included.", CheckBuckets),
		checkItems: h("freqring_check_items",
			"Items per Check call (or CheckStream request).", ItemBuckets),
		fsyncSeconds: h("freqring_wal_fsync_duration_seconds",
			"Wall time of one fsync of a WAL segment or its directory.", FsyncBuckets),
		snapshotSeconds: h("freqring_snapshot_duration_seconds",
			"Wall time to write and verify one snapshot.", SnapshotBuckets),
		recoverySeconds: h("freqring_recovery_duration_seconds",
			"Wall time of recovery at start: loading the snapshot and replaying the WAL.", SnapshotBuckets),
	}
}

// CheckDone observes one Check call of items items that took d.
func (o *Observer) CheckDone(items int, d time.Duration) {
	o.checkSeconds.Observe(d.Seconds())
	o.checkItems.Observe(float64(items))
}

// Fsync observes one WAL fsync.
func (o *Observer) Fsync(d time.Duration) { o.fsyncSeconds.Observe(d.Seconds()) }

// Snapshot observes one snapshot.
func (o *Observer) Snapshot(d time.Duration) { o.snapshotSeconds.Observe(d.Seconds()) }

// Recovery observes the recovery at start.
func (o *Observer) Recovery(d time.Duration) { o.recoverySeconds.Observe(d.Seconds()) }

func (o *Observer) histograms() []prometheus.Histogram {
	return []prometheus.Histogram{o.checkSeconds, o.checkItems, o.fsyncSeconds, o.snapshotSeconds, o.recoverySeconds}
}

// Describe sends the histograms' descriptions.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, h := range o.histograms() {
		h.Describe(ch)
	}
}

// Collect sends the histograms.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, h := range o.histograms() {
		h.Collect(ch)
	}
}
