package node

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/window"
)

// This file is stage 1 of a check (check.go): each item of a batch is
// decoded, validated and hashed once.

// item is one decoded item of a batch.
type item struct {
	dv   *domainView
	it   window.Item
	key  uint64 // xxhash64 of the recipient
	tag  uint16 // CRC-32C of the recipient
	part int    // ring partition of key
	id   uint64 // request id, 0 for none
	// refund makes the item a refund of the send id recorded (MODE_REFUND).
	refund bool
	err    *itemError
	// where and owner are the item's verdict (judge): who answers it, and
	// the owner of its partition under the call's ring.
	where where
	owner ring.Member
}

// batch is a decoded request: its items in request order. Batches are
// pooled; put returns one.
type batch struct {
	req   *pb.CheckRequest
	items []item
	moved []int // items that failed because their partition closed after routing (store.ErrClosed)
	// decided holds the store's part of one chunk of decide: the items it
	// hands to store.ApplyBatch, with their results; slot[j] is answer j's
	// entry in decided, or -1 for an answer that did not reach the store.
	decided []store.BatchItem
	slot    []int32
	// sends lists what decide recorded, for the WAL and the backups
	// (record.go).
	sends []send
}

var batches = sync.Pool{New: func() any { return new(batch) }}

func (b *batch) put() {
	b.req = nil
	clear(b.items)
	b.items = b.items[:0]
	b.moved = b.moved[:0]
	clear(b.decided)
	b.decided = b.decided[:0]
	clear(b.sends) // they hold domain names
	b.sends = b.sends[:0]
	batches.Put(b)
}

// decode decodes, validates and hashes every item of req under v and r. An
// item that fails validation carries its error; the others are ready to
// route and decide.
func decode(req *pb.CheckRequest, v *view, r *ring.Ring) *batch {
	b := batches.Get().(*batch)
	b.req = req
	cnt := len(req.Recipients)
	if cap(b.items) < cnt {
		b.items = make([]item, cnt)
	}
	b.items = b.items[:cnt]
	for i := range cnt {
		x := &b.items[i]
		x.dv, x.it, x.err = v.item(req, i)
		if x.err == nil {
			x.key, x.tag = KeyOf(req.Recipients[i])
			x.part = r.PartitionHash(x.key)
			x.id = column(req.RequestIds, i, 0)
			if x.refund = column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD) == pb.Mode_MODE_REFUND; x.refund && x.id == 0 {
				x.err = badItem("request_ids[%d]: a refund (modes[%d] MODE_REFUND) names the send it takes back by its request id; it has none", i, i)
			}
		}
	}
	return b
}

// column returns entry i of a per-item column of 0, 1 or n entries.
func column[T any](c []T, i int, def T) T {
	switch len(c) {
	case 0:
		return def
	case 1:
		return c[0]
	}
	return c[i]
}

// checkShape validates a request's columns: it fails whole if they are not
// well formed.
func checkShape(req *pb.CheckRequest) error {
	n := len(req.Recipients)
	if n == 0 || n > MaxBatch {
		return status.Errorf(codes.InvalidArgument, "recipients: %d items, want 1 to %d", n, MaxBatch)
	}
	for _, c := range []struct {
		name string
		len  int
	}{
		{"domains", len(req.Domains)}, {"contents", len(req.Contents)},
		{"content_hashes", len(req.ContentHashes)}, {"costs", len(req.Costs)},
		{"modes", len(req.Modes)}, {"request_ids", len(req.RequestIds)},
	} {
		if c.len > 1 && c.len != n {
			return status.Errorf(codes.InvalidArgument, "%s: %d entries, want 0, 1 or %d (one per recipient)", c.name, c.len, n)
		}
	}
	if len(req.RequestIds) == 1 && n > 1 {
		return status.Errorf(codes.InvalidArgument, "request_ids: 1 entry for %d items, want 0 or %d: a request id names one item", n, n)
	}
	if len(req.Contents) > 0 && len(req.ContentHashes) > 0 {
		return status.Error(codes.InvalidArgument, "contents and content_hashes: set at most one of them")
	}
	return nil
}

// itemError is one failed item: a gRPC code and a message naming the field.
type itemError struct {
	code codes.Code
	msg  string
}

func badItem(format string, args ...any) *itemError {
	return &itemError{codes.InvalidArgument, fmt.Sprintf(format, args...)}
}

// quote shows a recipient in an error, cut to 40 bytes.
func quote(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// item decodes and validates item i of req.
func (v *view) item(req *pb.CheckRequest, i int) (*domainView, window.Item, *itemError) {
	var it window.Item
	rcp := req.Recipients[i]
	if rcp == "" {
		return nil, it, badItem("recipients[%d]: empty recipient", i)
	}
	if len(rcp) > MaxRecipientBytes {
		return nil, it, badItem("recipients[%d]: %d bytes, more than %d", i, len(rcp), MaxRecipientBytes)
	}
	if !utf8.ValidString(rcp) {
		return nil, it, badItem("recipients[%d]: %s is not valid UTF-8", i, quote(rcp))
	}
	name := column(req.Domains, i, "")
	if name == "" {
		name = DefaultDomain
	}
	dv := v.domains[name]
	if dv == nil && !utf8.ValidString(name) {
		return nil, it, badItem("domains[%d]: %s is not valid UTF-8", i, quote(name))
	}
	if dv == nil {
		return nil, it, badItem("domains[%d]: unknown domain %s (this node serves %v)", i, quote(name), v.names)
	}
	dv = dv.forKey(rcp)
	if len(req.Contents) > 0 {
		c := column(req.Contents, i, nil)
		if len(c) > v.maxContent {
			return nil, it, badItem("contents[%d]: %d bytes, more than %d", i, len(c), v.maxContent)
		}
		it.Content = ContentHash(c)
	} else {
		it.Content = column(req.ContentHashes, i, 0)
	}
	cost := column(req.Costs, i, 1)
	if cost == 0 {
		cost = 1 // 0 is the proto3 default, as in the client and the CLI
	}
	if cost > window.MaxCost {
		return nil, it, badItem("costs[%d]: cost %d out of range [1, %d] (0 means 1)", i, cost, window.MaxCost)
	}
	it.Cost = int(cost)
	mode := column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD)
	switch mode {
	case pb.Mode_MODE_CHECK_AND_RECORD:
		it.Mode = window.CheckAndRecord
	case pb.Mode_MODE_PEEK:
		it.Mode = window.Peek
	case pb.Mode_MODE_RECORD_ONLY:
		it.Mode = window.RecordOnly
	case pb.Mode_MODE_REFUND:
		it.Mode = window.CheckAndRecord // unused: decode marks the item a refund
	default:
		return nil, it, badItem("modes[%d]: unknown mode %d", i, int32(mode))
	}
	return dv, it, nil
}
