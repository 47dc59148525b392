package node

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file is the memory limit (Config.MaxMemory): the store's share of
// the process's budget, and the answer to an item the store refused at it.

// MinMaxMemory is the smallest nonzero Config.MaxMemory: below it the
// reserve for everything but the store leaves the store nothing.
const MinMaxMemory = 128 << 20

// memoryReserve is the least of a process's budget that StoreBudget keeps
// for the rest of the node: the binary's resident pages (about 20 MiB of
// freqring serve's, ResidentOutsideGo), the Go runtime, gRPC connections and
// in-flight requests (one Check of MaxRequestBytes decodes to about twice
// that), WAL and snapshot buffers (three and two direct I/O chunks of
// snapshotChunk, 1 MiB at the least budget).
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
// memory is budgeted at maxMemory bytes, of which outside bytes are
// resident outside the Go runtime's memory: what the store mapped outside
// the Go heap (store.MemoryStats.MappedBytes) and ResidentOutsideGo. It is
// what is left of the budget, and never less than a quarter of it, the
// part StoreBudget leaves beside the store.
func GoMemoryLimit(maxMemory, outside int64) int64 {
	return max(maxMemory-outside, maxMemory/4)
}

// ResidentOutsideGo returns the bytes of the process's resident set that
// are neither the Go runtime's memory nor the store's mappings (both
// anonymous memory): its file-backed pages, the binary's code and data for
// the most part, and its shared memory, the WAL's io_uring rings (RssFile
// plus RssShmem of /proc/self/status; 0 where there is none). The Go
// runtime's memory limit does not govern them: at the least budget, 128
// MiB, the binary's resident pages alone are about 20 MiB of it.
func ResidentOutsideGo() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	var n int64
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(line, ":")
		if !ok || name != "RssFile" && name != "RssShmem" {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err == nil {
			n += kb << 10
		}
	}
	return n
}

// refusedAtLimit counts and logs an item the store refused with
// store.ErrMemoryLimit (it would have created a record, or grown one, past
// the limit), and returns its item error: RESOURCE_EXHAUSTED, with the
// limit and what the store holds. Its message is built without fmt: past
// the limit a node may refuse most of what it decides.
func (n *Node) refusedAtLimit(rcp string) *itemError {
	m := n.store.Memory()
	if log, left := n.memLog.allow(n.cfg.Clock.Now(), time.Second); log {
		n.log.Warn("memory limit reached: refusing sends that would create a record or grow one (denials, peeks and sends that fit a record's slot are still decided)",
			"max_memory", n.cfg.MaxMemory, "store_limit", m.MaxBytes, "store_held", m.HeldBytes,
			"refused_total", m.Refused, "refused_growth_total", m.RefusedGrowth, "refusals_not_logged", left, "recipient", quote(rcp))
	}
	msg := make([]byte, 0, 320)
	msg = append(msg, "recipient "...)
	if len(rcp) > 40 {
		msg = append(msg, quote(rcp)...)
	} else {
		msg = strconv.AppendQuote(msg, rcp) // as quote does
	}
	msg = append(msg, ": node "...)
	msg = append(msg, n.cfg.Name...)
	msg = append(msg, " is at its memory limit (max memory "...)
	msg = strconv.AppendInt(msg, n.cfg.MaxMemory, 10)
	msg = append(msg, " bytes; its store holds "...)
	msg = strconv.AppendInt(msg, m.HeldBytes, 10)
	msg = append(msg, " bytes of the "...)
	msg = strconv.AppendInt(msg, m.MaxBytes, 10)
	msg = append(msg, " it may): it records no send that needs more memory (a new recipient, or a record that must grow) until idle records free room; retry later, or add nodes"...)
	return &itemError{code: codes.ResourceExhausted, msg: string(msg)}
}

// inflightItemBytes is what an item of a Limiter call in progress holds,
// bytes, as measured at the memory limit (a heap profile of a node deciding
// 95,000 items at once, most refused, each with its error's message): its
// share of the decoded request, of the batch's working memory and of the
// response.
const inflightItemBytes = 1 << 10

// inflightItems returns how many items the Limiter calls of a node budgeted
// at maxMemory bytes may decide at once: an eighth of the budget's worth
// of inflightItemBytes, and at least MaxBatch (one request of the most
// items); 0, no bound, without a budget. At 128 MiB that is 16,384 items,
// some 30 ms of deciding on two cores.
func inflightItems(maxMemory int64) int64 {
	if maxMemory <= 0 {
		return 0
	}
	return max(MaxBatch, maxMemory/8/inflightItemBytes)
}

// itemGate bounds the items that Limiter calls (Check, CheckStream) decide
// at once, so that a node with more calls than it can decide queues them
// rather than holding all of them, decoded and answered, in memory: calls
// wait their turn in arrival order, and a CheckStream reads no more
// requests meanwhile (HTTP/2 flow control then holds its sender back).
// Forwarded batches and backups' sends do not wait: they come from peers'
// calls that hold their own gate, and making them wait could deadlock two
// nodes forwarding to each other. A nil *itemGate admits everything. Safe
// for concurrent use.
type itemGate struct {
	capacity int64
	mu       sync.Mutex    // guards free and waiters
	free     int64         // items not held
	waiters  []*gateWaiter // in arrival order
	waits    atomic.Int64  // calls that waited
}

// gateWaiter is a call waiting for n items of an itemGate; ready is closed
// when they are its.
type gateWaiter struct {
	n     int64
	ready chan struct{}
}

// newItemGate returns a gate of capacity items; nil for 0.
func newItemGate(capacity int64) *itemGate {
	if capacity <= 0 {
		return nil
	}
	return &itemGate{capacity: capacity, free: capacity}
}

// acquire waits until n items (at least 1, at most the capacity) are free
// and takes them, and returns the function that gives them back; it fails,
// taking nothing, when ctx ends (the context's status) or stopping is
// closed (UNAVAILABLE) first.
func (g *itemGate) acquire(ctx context.Context, stopping <-chan struct{}, n int) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	w := min(max(int64(n), 1), g.capacity)
	g.mu.Lock()
	if len(g.waiters) == 0 && g.free >= w {
		g.free -= w
		g.mu.Unlock()
		return func() { g.release(w) }, nil
	}
	gw := &gateWaiter{n: w, ready: make(chan struct{})}
	g.waiters = append(g.waiters, gw)
	g.mu.Unlock()
	g.waits.Add(1)
	select {
	case <-gw.ready:
		return func() { g.release(w) }, nil
	case <-ctx.Done():
		err = status.FromContextError(ctx.Err()).Err()
	case <-stopping:
		err = errStreamStopping
	}
	g.mu.Lock()
	select {
	case <-gw.ready: // granted meanwhile: give it back
		g.mu.Unlock()
		g.release(w)
		return nil, err
	default:
	}
	i := slices.Index(g.waiters, gw)
	g.waiters = slices.Delete(g.waiters, i, i+1)
	if i == 0 {
		g.grant() // the next may fit now that the head is gone
	}
	g.mu.Unlock()
	return nil, err
}

// release gives back n items and grants the waiters they let through.
func (g *itemGate) release(n int64) {
	g.mu.Lock()
	g.free += n
	if g.free > g.capacity {
		g.mu.Unlock()
		panic("BUG: node: itemGate released more items than it holds")
	}
	g.grant()
	g.mu.Unlock()
}

// waited returns the calls that waited for their items; 0 for a nil gate.
func (g *itemGate) waited() int64 {
	if g == nil {
		return 0
	}
	return g.waits.Load()
}

// grant hands free items to the waiters at the head of the queue, in
// order, while they fit. g.mu is held.
func (g *itemGate) grant() {
	for len(g.waiters) > 0 && g.waiters[0].n <= g.free {
		w := g.waiters[0]
		g.free -= w.n
		close(w.ready)
		g.waiters[0] = nil
		g.waiters = g.waiters[1:]
	}
}
