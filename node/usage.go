package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/usage"
	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// This file is usage statistics (package usage): what decide counts, the
// Usage RPC, and the statistics file in the data directory.
//
// What is counted, and where: each check-and-record and record-only item,
// once, by the node that decides it (its owner; Forward decides there), at
// the batch's clock reading. Not counted: peeks (they send nothing), items
// answered from the idempotency table (a retry of an item counted once),
// and failed items. An item decided in memory whose answer then fails (the
// WAL append or its backup fails) was decided and is counted.

// usageFile is the statistics file in the data directory, rewritten whole
// (wal.WriteFileAtomic) at each snapshot and on Close.
const usageFile = "usage"

// countUsage counts one decided item.
func (n *Node) countUsage(nowMs int64, x *item, dec *window.Decision) {
	if x.it.Mode == window.Peek {
		return
	}
	e := usage.Event{Domain: x.dv.d.Name(), Key: x.key, Admitted: dec.Admitted, WouldDenyBy: shadowDeniedBy(x.dv, dec)}
	if !dec.Admitted && dec.DeniedBy >= 0 && dec.DeniedBy < len(x.dv.ruleNames) {
		e.DeniedBy = x.dv.ruleNames[dec.DeniedBy]
	}
	n.usage.Count(nowMs, e)
}

// shadowDeniedBy is the name of the shadow rule that would have denied the
// item, "" for none; usage.RuleCount.WouldDeny counts it per rule.
func shadowDeniedBy(dv *domainView, dec *window.Decision) string {
	if i := dec.ShadowDeniedBy; i >= 0 && i < len(dv.ruleNames) {
		return dv.ruleNames[i]
	}
	return ""
}

// Usage answers Limiter.Usage from this node's statistics.
func (n *Node) Usage(_ context.Context, req *pb.UsageRequest) (*pb.UsageResponse, error) {
	if !n.ready.Load() {
		return nil, status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	if int(req.Days) > n.usage.Days() {
		return nil, status.Errorf(codes.InvalidArgument, "days: %d, more than the %d days this node keeps (--stats-days)", req.Days, n.usage.Days())
	}
	zones := n.usage.Zones()
	zone := zones[0]
	switch req.Zone {
	case pb.UsageZone_USAGE_ZONE_UTC:
	case pb.UsageZone_USAGE_ZONE_CONFIGURED:
		zone = zones[len(zones)-1]
	default:
		return nil, status.Errorf(codes.InvalidArgument, "zone: unknown zone %d, want USAGE_ZONE_UTC (0) or USAGE_ZONE_CONFIGURED (1)", int32(req.Zone))
	}
	now := n.nowMs()
	days, err := n.usage.Report(now, usage.Query{Zone: zone, Days: int(req.Days), Domain: req.Domain})
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp := &pb.UsageResponse{Node: n.cfg.Name, Zone: zone, DistinctStdError: usage.StdError,
		RetentionDays: uint32(n.usage.Days()), NowMs: now, Days: make([]*pb.UsageDay, len(days))}
	for i, d := range days {
		u := &pb.UsageDay{Date: d.Date.String(), Domain: d.Domain, Admitted: d.Admitted, Denied: d.Denied,
			RecipientsSketch: d.Recipients.AppendBinary(nil), DistinctRecipients: d.Recipients.Estimate()}
		for _, r := range d.Rules {
			u.Rules = append(u.Rules, &pb.UsageRule{Name: r.Rule, Denied: r.Denied, WouldDeny: r.WouldDeny})
		}
		resp.Days[i] = u
	}
	return resp, nil
}

// loadUsage restores the statistics file of dir, if there is one. A file
// that does not decode does not stop the node: it is logged at error level,
// moved aside to usage.corrupt-TIME (never deleted), and counting starts
// afresh.
func (n *Node) loadUsage(dir string) {
	path := filepath.Join(dir, usageFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var days []usage.DomainDay
	if err == nil {
		days, err = usage.Decode(b)
	}
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%s", path, time.Unix(0, n.cfg.Clock.Now()).UTC().Format("20060102T150405.000Z"))
		if rerr := os.Rename(path, aside); rerr != nil {
			n.log.Error("damaged usage statistics file, and it could not be moved aside: statistics start afresh and will overwrite it", "file", path, "err", err, "rename_err", rerr)
			return
		}
		n.log.Error("damaged usage statistics file moved aside: statistics start afresh", "file", path, "moved_to", aside, "err", err)
		return
	}
	if skipped := n.usage.Restore(n.nowMs(), days); skipped > 0 {
		n.log.Info("usage statistics: days past retention or of a zone no longer kept were dropped", "file", path, "dropped_days", skipped, "kept_days", len(days)-skipped)
	}
}

// saveUsage writes the statistics file of dir.
func (n *Node) saveUsage(dir string) error {
	b, err := usage.Encode(nil, n.usage.All())
	if err != nil {
		return fmt.Errorf("node: usage statistics: %w", err)
	}
	return wal.WriteFileAtomic(dir, usageFile, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// DecodeUsage returns the days of a Usage response as package usage's
// values (sketches decoded), ready for usage.Merge: a cluster's statistics
// are the merge of its members' responses of one zone.
func DecodeUsage(resp *pb.UsageResponse) ([]usage.DomainDay, error) {
	out := make([]usage.DomainDay, len(resp.Days))
	for i, d := range resp.Days {
		date, err := usage.ParseDate(d.Date)
		if err != nil {
			return nil, fmt.Errorf("node %s: days[%d]: %w", resp.Node, i, err)
		}
		sk, used, err := usage.DecodeSketch(d.RecipientsSketch)
		if err == nil && used != len(d.RecipientsSketch) {
			err = fmt.Errorf("%w: %d bytes after the sketch", usage.ErrCorrupt, len(d.RecipientsSketch)-used)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: days[%d] (%s %s): recipients_sketch: %w", resp.Node, i, d.Date, d.Domain, err)
		}
		dd := usage.DomainDay{Zone: resp.Zone, Date: date, Domain: d.Domain, Admitted: d.Admitted, Denied: d.Denied, Recipients: sk}
		for _, r := range d.Rules {
			dd.Rules = append(dd.Rules, usage.RuleCount{Rule: r.Name, Denied: r.Denied, WouldDeny: r.WouldDeny})
		}
		out[i] = dd
	}
	return out, nil
}
