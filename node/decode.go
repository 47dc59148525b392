package node

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
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
	// st times the call's stages.
	st stageTimer
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
	b.st = stageTimer{}
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
			x.id = wire.Column(req.RequestIds, i, 0)
			if x.refund = wire.Column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD) == pb.Mode_MODE_REFUND; x.refund && x.id == 0 {
				x.err = badItem(wire.RequestIDs, "request_ids[%d]: a refund (modes[%d] MODE_REFUND) names the send it takes back by its request id; it has none", i, i)
			}
		}
	}
	return b
}

// itemError is one failed item: a gRPC code, a message naming the field,
// and the request column at fault (wire's names), "" when its failure is
// not about its input.
type itemError struct {
	code  codes.Code
	msg   string
	field string
}

// badItem is an INVALID_ARGUMENT item error about its column field.
func badItem(field, format string, args ...any) *itemError {
	return &itemError{code: codes.InvalidArgument, msg: fmt.Sprintf(format, args...), field: field}
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
		return nil, it, badItem(wire.Recipients, "recipients[%d]: empty recipient", i)
	}
	if len(rcp) > MaxRecipientBytes {
		return nil, it, badItem(wire.Recipients, "recipients[%d]: %d bytes, more than %d", i, len(rcp), MaxRecipientBytes)
	}
	if !utf8.ValidString(rcp) {
		return nil, it, badItem(wire.Recipients, "recipients[%d]: %s is not valid UTF-8", i, quote(rcp))
	}
	name := wire.Column(req.Domains, i, "")
	if name == "" {
		name = DefaultDomain
	}
	dv := v.domains[name]
	if dv == nil && !utf8.ValidString(name) {
		return nil, it, badItem(wire.Domains, "domains[%d]: %s is not valid UTF-8", i, quote(name))
	}
	if dv == nil {
		return nil, it, badItem(wire.Domains, "domains[%d]: unknown domain %s (this node serves %v)", i, quote(name), v.names)
	}
	dv = dv.forKey(rcp)
	if len(req.Contents) > 0 {
		c := wire.Column(req.Contents, i, nil)
		if len(c) > v.maxContent {
			return nil, it, badItem(wire.Contents, "contents[%d]: %d bytes, more than %d", i, len(c), v.maxContent)
		}
		it.Content = ContentHash(c)
	} else {
		it.Content = wire.Column(req.ContentHashes, i, 0)
	}
	cost := wire.Column(req.Costs, i, 1)
	if cost == 0 {
		cost = 1 // 0 is the proto3 default, as in the client and the CLI
	}
	if cost > window.MaxCost {
		return nil, it, badItem(wire.Costs, "costs[%d]: cost %d out of range [1, %d] (0 means 1)", i, cost, window.MaxCost)
	}
	it.Cost = int(cost)
	mode := wire.Column(req.Modes, i, pb.Mode_MODE_CHECK_AND_RECORD)
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
		return nil, it, badItem(wire.Modes, "modes[%d]: unknown mode %d", i, int32(mode))
	}
	return dv, it, nil
}
