package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/freqring/freqring/node"
)

// Source is what a Collector reads: a *node.Node.
type Source interface {
	Stats() node.Stats
}

// Collector is a prometheus.Collector that reads a node's Stats once per
// scrape and turns them into freqring_ metrics. It holds no state of its
// own, so that a scrape always shows the node as it is. Safe for concurrent
// use.
type Collector struct {
	src Source
}

// NewCollector returns a Collector reading src.
func NewCollector(src Source) *Collector { return &Collector{src: src} }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

// The metrics a Collector exports. Their names are a public contract (the
// docs/operations.md lists them, a test checks it; deploy/monitoring uses them).
var (
	descServing = desc("freqring_serving",
		"1 while the node decides (recovered and joined, not shutting down), else 0.")
	descChecked = desc("freqring_checked_items_total",
		"Items decided or failed on this node (its own and those peers forwarded to it).")
	descDecisions = desc("freqring_decisions_total",
		"Items decided on this node, by domain and result (admitted or denied); an item answered from the idempotency table counts as admitted.", "domain", "result")
	descRuleDenied = desc("freqring_rule_denied_total",
		"Items denied, by domain and the rule the answer names (denied_by: the denying rule with the longest retry-after); a domain's rules sum to its denied decisions.", "domain", "rule")
	descRuleShadowDenied = desc("freqring_rule_shadow_denied_total",
		"Items a shadow rule would have denied (it never denies), by domain and rule.", "domain", "rule")
	descFailed = desc("freqring_failed_items_total",
		"Items this node answered with an error, by gRPC code name: those failed here and those whose owner did not answer a forward.", "code")
	descDuplicates = desc("freqring_duplicate_items_total",
		"Items answered from the idempotency table (a retried request id): not recorded again.")
	descForwarded = desc("freqring_forwarded_items_total",
		"Items forwarded to their owners (direction out) and items peers forwarded here (in).", "direction")
	descRingEpoch = desc("freqring_ring_epoch",
		"Low 52 bits of the epoch of the ring this node routes by (exact in a float64): equal on members that agree on the ring.")
	descRingMembers = desc("freqring_ring_members",
		"Members in the ring this node routes by.")
	descPartitions = desc("freqring_partitions",
		"Ring partitions this node owns, backs up, and owns but has not acquired yet (moving).", "state")
	descOwnedRecords = desc("freqring_owned_records",
		"Records in the partitions this node owns, all domains.")
	descDomainRecords = desc("freqring_domain_records",
		"Recipients with a record, by domain (owned, backed up and moving partitions).", "domain")
	descDomainHeap = desc("freqring_domain_heap_bytes",
		"Heap held by a domain's index and record slabs, bytes.", "domain")
	descDomainExpired = desc("freqring_domain_expired_records_total",
		"Idle records reclaimed by the sweep, by domain.", "domain")
	descDomainMoved = desc("freqring_domain_moved_records_total",
		"Records the sweep moved to lower slots so as to give sparse slab chunks back, by domain.", "domain")
	descDomainCompacted = desc("freqring_domain_compacted_records_total",
		"Records whose content logs the sweep dropped because no rule could count them any more, by domain.", "domain")
	descDomainUnreadable = desc("freqring_domain_unreadable_records",
		"Records the sweep's current or latest pass could not decode, left as they were (a decision on one fails), by domain.", "domain")
	descDomainCollisions = desc("freqring_domain_collisions_total",
		"Records created beside another recipient's with the same 64-bit key hash, by domain.", "domain")
	descStoreHeld = desc("freqring_store_held_bytes",
		"Memory the store holds, all domains (index, slabs, request ids), on the Go heap or mapped outside it, bytes.")
	descStoreMapped = desc("freqring_store_mapped_bytes",
		"Memory the store mapped outside the Go heap: huge-page slab chunks, in use or kept for reuse, and index tables of 2 MiB or more; pages never touched take none, bytes.")
	descStoreFree = desc("freqring_store_free_bytes",
		"Slab chunks the store gave back and keeps, zeroed, for reuse: part of freqring_store_mapped_bytes, resident, counted toward the limit, bytes.")
	descStoreLimit = desc("freqring_store_limit_bytes",
		"The store's memory limit (StoreBudget of --max-memory), bytes; 0 means no limit.")
	descStoreRefused = desc("freqring_store_refused_items_total",
		"Items refused at the store's memory limit (RESOURCE_EXHAUSTED): for new recipients, and for known ones whose record would have grown.")
	descStoreRefusedGrowth = desc("freqring_store_refused_growth_items_total",
		"Of the items refused at the store's memory limit, those of known recipients whose record would have grown.")
	descStoreOvershoots = desc("freqring_store_overshoots_total",
		"Records that replay, backups, partition moves and refunds created or grew past the store's memory limit: never refused, since losing an admitted send is worse than holding more.")
	descGateWaits = desc("freqring_gate_waits_total",
		"Check calls and stream requests that waited for their turn because the items in progress would have passed their share of --max-memory.")
	descWALAppends = desc("freqring_wal_appends_total",
		"Records appended to the write-ahead log.")
	descWALBytes = desc("freqring_wal_written_bytes_total",
		"Bytes of records written to the write-ahead log, framing included.")
	descWALBatches = desc("freqring_wal_batches_total",
		"Group-commit batches written to the write-ahead log, one write(2) each.")
	descWALFsyncs = desc("freqring_wal_fsyncs_total",
		"Fsyncs of write-ahead log segments and of its directory.")
	descWALRotations = desc("freqring_wal_rotations_total",
		"Write-ahead log segments sealed and followed by a new one.")
	descSnapshots = desc("freqring_snapshots_total",
		"Snapshots written since start.")
	descSnapshotFailures = desc("freqring_snapshot_failures_total",
		"Snapshots that failed, or were not tried for lack of disk space; the previous snapshot and the WAL after it stay.")
	descWALFailed = desc("freqring_wal_failed",
		"1 while the write-ahead log has failed (a write or fsync error): the node records nothing and is not ready until it recovers.")
	descWALFailures = desc("freqring_wal_failures_total",
		"Times a write or fsync error failed the write-ahead log.")
	descWALRecoveries = desc("freqring_wal_recoveries_total",
		"Times a failed write-ahead log recovered without a restart.")
	descRefusedCalls = desc("freqring_refused_calls_total",
		"Calls to the Peer and Admin services refused because the caller was not authenticated as a member or an operator, by service.", "service")
	descReplicated = desc("freqring_replicated_sends_total",
		"Sends acknowledged by their partition's backup.")
	descReplicateCalls = desc("freqring_replicate_calls_total",
		"Replicate calls made to backups (each carries the sends of concurrent batches).")
	descReplicateUnaryCalls = desc("freqring_replicate_unary_calls_total",
		"Replicate calls made as unary calls instead of on a ReplicateStream: the backup has none (an older version), or the peer is in-process.")
	descReplicationFailures = desc("freqring_replication_failures_total",
		"Sends their partition's backup did not confirm.")
	descWithdrawnSends = desc("freqring_withdrawn_sends_total",
		"Sends recorded and taken back because they did not stand (their backup did not confirm them, or their partition was acquired again meanwhile): the item failed, so nothing counts them.")
	descStaleRefusals = desc("freqring_stale_refusals_total",
		"Replicate calls refused as a backup because their owner had not acquired the partition since it was last out of this node's ring (it may have been frozen while others decided), or because this node still owed the partition.")
	descReacquired = desc("freqring_reacquired_partitions_total",
		"Partitions this node closed and acquired again from every member after its backup refused their sends as stale.")
	descLateRequests = desc("freqring_late_requests_total",
		"Check, Forward and Replicate calls refused because the node read them more than a second after their caller's deadline (not_after_ms): the node was stopped or starved, or the call queued.")
	descReopenedFailures = desc("freqring_reopened_failures_total",
		"Items failed, and their sends taken back, because their partition was acquired again (newer history merged) while they were decided from its earlier record.")
	descReplicationLag = desc("freqring_replication_lag_sends",
		"Sends admitted and not yet on their backup (asynchronous replication).")
	descReloads = desc("freqring_reloads_total",
		"Rules reloads, by result: ok (applied) or failed (refused; the old rules stay).", "result")
	descRefunds = desc("freqring_refunds_total",
		"Sends returned by request id (refunds).")
	descExplains = desc("freqring_explains_total",
		"Recipient lookups (Explain: the gRPC API, GET /v1/explain, the console) callers made through this node; each is also logged with its caller.")
	descMarkedDown = desc("freqring_members_marked_down_total",
		"Members this node took out of its ring because their gRPC address refused connections (their process is gone), ahead of gossip's failure detection.")
	descClockOffset = desc("freqring_clock_offset_seconds",
		"This node's clock minus the median of the live members' clocks (its own counted), as last measured over gossip.")
	descClockSkewed = desc("freqring_clock_skewed",
		"1 while this node's clock is beyond --max-clock-skew of most members': it is out of the ring and owns nothing.")
	descGossipBad = desc("freqring_gossip_bad_packets_total",
		"Gossip packets and streams that did not decode or decrypt.")
	descGossipWarnings = desc("freqring_gossip_warnings_total",
		"Warning and error lines of memberlist (the gossip library), bad packets' among them.")
	descGossipWarningsNotLogged = desc("freqring_gossip_warnings_not_logged_total",
		"Warning lines of memberlist left out of the log: at most one of a kind is logged every 10 s.")
)

var allDescs = []*prometheus.Desc{
	descServing, descChecked, descDecisions, descRuleDenied, descRuleShadowDenied, descFailed, descDuplicates,
	descForwarded, descRingEpoch, descRingMembers, descPartitions, descOwnedRecords, descDomainRecords,
	descDomainHeap, descDomainExpired, descDomainMoved, descDomainCompacted, descDomainUnreadable, descDomainCollisions, descStoreHeld, descStoreMapped, descStoreFree, descStoreLimit, descStoreRefused, descStoreRefusedGrowth, descStoreOvershoots, descGateWaits,
	descWALAppends, descWALBytes, descWALBatches, descWALFsyncs, descWALRotations, descSnapshots,
	descSnapshotFailures, descWALFailed, descWALFailures, descWALRecoveries, descRefusedCalls,
	descReplicated, descReplicateCalls, descReplicateUnaryCalls, descReplicationFailures, descWithdrawnSends, descStaleRefusals, descReacquired, descLateRequests, descReopenedFailures, descReplicationLag, descReloads, descRefunds, descExplains, descMarkedDown, descClockOffset, descClockSkewed, descGossipBad,
	descGossipWarnings, descGossipWarningsNotLogged,
}

// Describe sends the descriptions of every metric Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// b2f is 1 for true, 0 for false.
func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// epochMask keeps the bits of a ring epoch that a float64 holds exactly.
const epochMask = 1<<52 - 1

// Collect reads the node's Stats and sends the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descServing, b2f(s.Serving))
	counter(descChecked, s.Checks)
	for _, d := range s.Domains {
		counter(descDecisions, d.Admitted, d.Name, "admitted")
		counter(descDecisions, d.Denied, d.Name, "denied")
		for _, r := range d.Rules {
			counter(descRuleDenied, r.Denied, d.Name, r.Name)
			counter(descRuleShadowDenied, r.ShadowDenied, d.Name, r.Name)
		}
		gauge(descDomainRecords, float64(d.Records), d.Name)
		gauge(descDomainHeap, float64(d.IndexBytes+d.SlabBytes), d.Name)
		counter(descDomainExpired, d.Expired, d.Name)
		counter(descDomainMoved, d.Moved, d.Name)
		counter(descDomainCompacted, d.Compacted, d.Name)
		gauge(descDomainUnreadable, float64(d.Unreadable), d.Name)
		counter(descDomainCollisions, d.Collisions, d.Name)
	}
	codes := make([]string, 0, len(s.FailedByCode))
	for code := range s.FailedByCode {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	for _, code := range codes {
		counter(descFailed, s.FailedByCode[code], code)
	}
	counter(descDuplicates, s.Duplicates)
	counter(descForwarded, s.ForwardedOut, "out")
	counter(descForwarded, s.ForwardedIn, "in")
	gauge(descRingEpoch, float64(s.Ring.Epoch&epochMask))
	gauge(descRingMembers, float64(s.Ring.Members))
	gauge(descPartitions, float64(s.Ring.Owned), "owned")
	gauge(descPartitions, float64(s.Ring.Backed), "backed")
	gauge(descPartitions, float64(s.Ring.Moving), "moving")
	gauge(descOwnedRecords, float64(s.Ring.OwnedRecords))
	gauge(descStoreHeld, float64(s.Memory.HeldBytes))
	gauge(descStoreMapped, float64(s.Memory.MappedBytes))
	gauge(descStoreFree, float64(s.Memory.FreeBytes))
	gauge(descStoreLimit, float64(s.Memory.MaxBytes))
	counter(descStoreRefused, s.Memory.Refused)
	counter(descStoreRefusedGrowth, s.Memory.RefusedGrowth)
	counter(descStoreOvershoots, s.Memory.Overshoots)
	counter(descGateWaits, s.GateWaits)
	counter(descWALAppends, s.WAL.Appends)
	counter(descWALBytes, s.WAL.Bytes)
	counter(descWALBatches, s.WAL.Batches)
	counter(descWALFsyncs, s.WAL.Fsyncs)
	counter(descWALRotations, s.WAL.Rotations)
	counter(descSnapshots, s.Snapshots)
	counter(descSnapshotFailures, s.SnapshotFailures)
	gauge(descWALFailed, b2f(s.WALFailed))
	counter(descWALFailures, s.WAL.Failures)
	counter(descWALRecoveries, s.WAL.Recoveries)
	counter(descRefusedCalls, s.RefusedPeerCalls, "peer")
	counter(descRefusedCalls, s.RefusedAdminCalls, "admin")
	counter(descReplicated, s.ReplicatedSends)
	counter(descReplicateCalls, s.ReplicateCalls)
	counter(descReplicateUnaryCalls, s.ReplicateUnaryCalls)
	counter(descReplicationFailures, s.ReplicationFailures)
	counter(descWithdrawnSends, s.WithdrawnSends)
	counter(descStaleRefusals, s.StaleRefusals)
	counter(descReacquired, s.Reacquired)
	counter(descLateRequests, s.LateRequests)
	counter(descReopenedFailures, s.ReopenedFailures)
	gauge(descReplicationLag, float64(s.ReplicationLag))
	counter(descReloads, s.Reloads, "ok")
	counter(descReloads, s.ReloadFailures, "failed")
	counter(descRefunds, s.Refunds)
	counter(descExplains, s.Explains)
	counter(descMarkedDown, s.Gossip.MarkedDown)
	gauge(descClockOffset, s.Clock.Offset.Seconds())
	gauge(descClockSkewed, b2f(s.Clock.Skewed))
	counter(descGossipBad, s.Gossip.BadPackets)
	counter(descGossipWarnings, s.Gossip.Warnings)
	counter(descGossipWarningsNotLogged, s.Gossip.WarningsNotLogged)
}
