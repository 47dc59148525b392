// Package wire reads and writes the columns of freqring.v1's CheckRequest
// and CheckResponse: the one implementation, checking their shape once,
// that the node, the Go client, the HTTP and Envoy gateways and the bench
// share.
//
// A CheckRequest is a batch of items in columns: recipients, and per-item
// columns of 0 entries (every item takes the default), 1 (it applies to
// every item) or one per recipient. A CheckResponse has one entry per item
// in its per-item columns and, per item, rule_counts[i] entries in its
// per-rule columns (used, remaining, rule_retry_after_ms), item-major;
// errors, duplicates and refunded name items by index.
//
// Nothing here allocates per item but Read's offsets (one array per
// response). The functions are safe for concurrent use on distinct
// messages.
package wire

import (
	"fmt"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// The request's columns, by their proto names: the Field of a ShapeError
// and of an item error (pb.ItemError.Field).
const (
	Recipients    = "recipients"
	Domains       = "domains"
	Contents      = "contents"
	ContentHashes = "content_hashes"
	Costs         = "costs"
	Modes         = "modes"
	RequestIDs    = "request_ids"
)

// ShapeError is a malformed request or response: the column at fault and
// what is wrong with it.
type ShapeError struct {
	Field string // a column's proto name
	Msg   string
}

// Error returns "FIELD: MSG".
func (e *ShapeError) Error() string { return e.Field + ": " + e.Msg }

func shapeErr(field, format string, args ...any) *ShapeError {
	return &ShapeError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Column returns entry i of a per-item column of 0, 1 or n entries: def
// when it has none, its only entry when it has one.
func Column[T any](c []T, i int, def T) T {
	switch len(c) {
	case 0:
		return def
	case 1:
		return c[0]
	}
	return c[i]
}

// CheckRequest checks the shape of req: 1 to maxItems recipients, every
// per-item column of 0, 1 or one entry per recipient, no single request id
// for several items, and at most one of contents and content_hashes. The
// error is a *ShapeError naming the column.
func CheckRequest(req *pb.CheckRequest, maxItems int) error {
	n := len(req.Recipients)
	if n == 0 || n > maxItems {
		return shapeErr(Recipients, "%d items, want 1 to %d", n, maxItems)
	}
	for _, c := range []struct {
		name string
		len  int
	}{
		{Domains, len(req.Domains)}, {Contents, len(req.Contents)},
		{ContentHashes, len(req.ContentHashes)}, {Costs, len(req.Costs)},
		{Modes, len(req.Modes)}, {RequestIDs, len(req.RequestIds)},
	} {
		if c.len > 1 && c.len != n {
			return shapeErr(c.name, "%d entries, want 0, 1 or %d (one per recipient)", c.len, n)
		}
	}
	if len(req.RequestIds) == 1 && n > 1 {
		return shapeErr(RequestIDs, "1 entry for %d items, want 0 or %d: a request id names one item", n, n)
	}
	if len(req.Contents) > 0 && len(req.ContentHashes) > 0 {
		return shapeErr(Contents, "contents and content_hashes: set at most one of them")
	}
	return nil
}

// Pick returns the items idx of req as a request of their own, routed by
// ring epoch.
func Pick(req *pb.CheckRequest, idx []int, epoch uint64) *pb.CheckRequest {
	sub := &pb.CheckRequest{RingEpoch: epoch, Recipients: make([]string, len(idx)), NotAfterMs: req.NotAfterMs}
	for j, i := range idx {
		sub.Recipients[j] = req.Recipients[i]
	}
	sub.Domains = pick(req.Domains, idx)
	sub.Contents = pick(req.Contents, idx)
	sub.ContentHashes = pick(req.ContentHashes, idx)
	sub.Costs = pick(req.Costs, idx)
	sub.Modes = pick(req.Modes, idx)
	sub.RequestIds = pick(req.RequestIds, idx)
	return sub
}

// pick returns entries idx of a per-item column; a column of 0 or 1 entries
// applies to every item and is kept as it is.
func pick[T any](c []T, idx []int) []T {
	if len(c) <= 1 {
		return c
	}
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = c[i]
	}
	return out
}
