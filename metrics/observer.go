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
	stageSeconds    *prometheus.HistogramVec
	stages          [][]prometheus.Observer // by node.Call, then node.Stage; nil for a stage the call lacks
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
	// StageBuckets, seconds: 5µs to about 2.6s.
	StageBuckets = prometheus.ExponentialBuckets(5e-6, 2, 20)
)

// NewObserver returns an Observer with empty histograms.
func NewObserver() *Observer {
	h := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	}
	o := &Observer{
		stageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "freqring_stage_duration_seconds",
			Help:    "Wall time of one stage of a call: call is check (at the node it reached), forward (at the owner a check was forwarded to) or replicate (at a backup); stage is queue, decode, judge, forward, store, wal_queue, wal_write, wal_fsync, backup, persist (the WAL and backups waited for together), apply or respond. docs/operations.md says what each one covers.",
			Buckets: StageBuckets}, []string{"call", "stage"}),
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
	for _, c := range node.Calls() {
		obs := make([]prometheus.Observer, node.NumStages) // by stage
		for _, s := range node.StagesOf(c) {
			obs[s] = o.stageSeconds.WithLabelValues(c.String(), s.String())
		}
		o.stages = append(o.stages, obs)
	}
	return o
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

// Stage observes one stage of a call; a stage the call does not report
// (node.StagesOf) is dropped.
func (o *Observer) Stage(c node.Call, s node.Stage, d time.Duration) {
	if int(c) < len(o.stages) && int(s) < node.NumStages {
		if h := o.stages[c][s]; h != nil {
			h.Observe(d.Seconds())
		}
	}
}

func (o *Observer) histograms() []prometheus.Histogram {
	return []prometheus.Histogram{o.checkSeconds, o.checkItems, o.fsyncSeconds, o.snapshotSeconds, o.recoverySeconds}
}

// Describe sends the histograms' descriptions.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, h := range o.histograms() {
		h.Describe(ch)
	}
	o.stageSeconds.Describe(ch)
}

// Collect sends the histograms.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, h := range o.histograms() {
		h.Collect(ch)
	}
	o.stageSeconds.Collect(ch)
}
