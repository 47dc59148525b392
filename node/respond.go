package node

import (
	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/store"
)

// This file writes a check's response columns.

// answer writes the store's decision of item x as answer j of resp: its
// domain, the decision's columns, one entry per rule, and its place among
// the duplicates or the refunded.
func answer(resp *pb.CheckResponse, j int, x *item, sb *store.BatchItem) {
	dec := &sb.Dec
	switch {
	case sb.Dup:
		resp.Duplicates = append(resp.Duplicates, uint32(j))
	case x.refund:
		resp.Refunded = append(resp.Refunded, uint32(j))
	}
	resp.Domains[x.dv.d.Name()] = x.dv.proto
	resp.Admitted[j] = dec.Admitted
	resp.Recorded[j] = dec.Recorded
	resp.DeniedBy[j] = int32(dec.DeniedBy)
	if dec.ShadowDeniedBy >= 0 && !x.dv.exempt {
		wire.SetShadowDeniedBy(resp, j, int32(dec.ShadowDeniedBy))
	}
	resp.RetryAfterMs[j] = dec.RetryAfter
	resp.DecidedAtMs[j] = dec.At
	for _, r := range dec.Rules[:dec.NumRules] {
		wire.AppendRule(resp, j, uint32(r.Used), uint32(r.Remaining), r.RetryAfter)
	}
}
