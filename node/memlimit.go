package node

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// This file is the memory limit (Config.MaxMemory): the store's share of
// the process's budget, and the answer to an item the store refused at it.

// MinMaxMemory is the smallest nonzero Config.MaxMemory: below it the
// reserve for everything but the store leaves the store nothing.
const MinMaxMemory = 128 << 20

// memoryReserve is the least of a process's budget that StoreBudget keeps
// for the rest of the node: the Go runtime, gRPC connections and in-flight
// requests (one Check of MaxRequestBytes decodes to about twice that), WAL
// and snapshot buffers.
const memoryReserve = 96 << 20

// StoreBudget returns the heap the store may hold (store.Config.MaxBytes)
// in a process whose Go memory is budgeted at maxMemory bytes (0: no limit,
// and StoreBudget returns 0). The store gets three quarters of the budget,
// and at most maxMemory minus memoryReserve. The quarter left is for what
// grows with the store and is not counted in it: a partition image per
// snapshot or handoff chunk in flight (an acquisition pulls up to 64
// partitions at once), a table resizing (the old and new index of one
// partition live together), the store's uncounted heap (slice headers and
// the allocator's rounding: about 4% of it, measured by
// BenchmarkSteadyStateMemory's held-B against heap-B), and room for the
// garbage collector, which, at a memory limit, collects more often as the
// heap nears it.
func StoreBudget(maxMemory int64) int64 {
	if maxMemory <= 0 {
		return 0
	}
	return max(1, min(maxMemory/4*3, maxMemory-memoryReserve))
}

// GoMemoryLimit returns the Go runtime's memory limit in a process whose
// memory is budgeted at maxMemory bytes, of which the store mapped mapped
// bytes outside the Go heap (store.MemoryStats.MappedBytes): what is left
// of the budget, and never less than a quarter of it, the part StoreBudget
// leaves beside the store.
func GoMemoryLimit(maxMemory, mapped int64) int64 {
	return max(maxMemory-mapped, maxMemory/4)
}

// memoryLog logs refusals at the memory limit, at most one line a second
// with the number left out since the last one. Safe for concurrent use.
type memoryLog struct {
	mu         sync.Mutex // guards last and suppressed
	last       int64      // unix ns of the last line; 0 before the first
	suppressed int64
}

// refusedAtLimit counts and logs an item the store refused with
// store.ErrMemoryLimit, and returns its item error: RESOURCE_EXHAUSTED, with
// the limit and what the store holds.
func (n *Node) refusedAtLimit(rcp string) *itemError {
	m := n.store.Memory()
	now := n.cfg.Clock.Now()
	l := &n.memLog
	l.mu.Lock()
	log := l.last == 0 || now-l.last >= int64(time.Second) || now < l.last
	var left int64
	if log {
		l.last, left, l.suppressed = now, l.suppressed, 0
	} else {
		l.suppressed++
	}
	l.mu.Unlock()
	if log {
		n.log.Warn("memory limit reached: refusing recipients with no record (known ones are still decided)",
			"max_memory", n.cfg.MaxMemory, "store_limit", m.MaxBytes, "store_held", m.HeldBytes,
			"refused_total", m.Refused, "refusals_not_logged", left, "recipient", quote(rcp))
	}
	return &itemError{code: codes.ResourceExhausted, msg: fmt.Sprintf(
		"recipient %s: node %s is at its memory limit (max memory %d bytes; its store holds %d bytes of the %d it may): it decides only for recipients it has a record of; retry later, or add nodes",
		quote(rcp), n.cfg.Name, n.cfg.MaxMemory, m.HeldBytes, m.MaxBytes)}
}
