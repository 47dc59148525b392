package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	statsusage "github.com/freqring/freqring/usage"
)

// statsRecvBytes bounds one member's Usage answer: a sketch is at most
// 16 KiB a domain and day, so 256 MiB holds 35 days of 256 busy domains.
const statsRecvBytes = 256 << 20

// statsRow is one line of `freqring stats --json`.
type statsRow struct {
	Zone     string           `json:"zone"`
	Date     string           `json:"date"`
	Domain   string           `json:"domain"`
	Admitted int64            `json:"admitted"`
	Denied   int64            `json:"denied"`
	DeniedBy map[string]int64 `json:"denied_by"`
	// WouldDeny counts per shadow rule the items it would have denied.
	WouldDeny map[string]int64 `json:"would_deny,omitempty"`
	// Recipients is the estimate of the distinct recipients, and
	// RecipientsStdError its standard error (the same unit).
	Recipients         int64 `json:"distinct_recipients"`
	RecipientsStdError int64 `json:"distinct_recipients_std_error"`
	Members            int   `json:"members"`
}

func stats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7070", "gRPC address of any node: its ring names the members asked")
	days := fs.Int("days", 7, "calendar days to show, ending today")
	domain := fs.String("domain", "", "only this domain (default: all)")
	zone := fs.String("zone", "utc", "calendar of the days: utc, or local (each node's --stats-timezone)")
	asJSON := fs.Bool("json", false, "print one JSON object per day and domain")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline of each call")
	tf := addTLSFlags(fs, false)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring stats [flags]\n\nAsks every member of the ring for its usage statistics (items admitted and denied, per rule,\nand distinct recipients, per day and domain), sums them and prints them. Exits 1, after\nprinting, if a member did not answer: its share is missing from the sums.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *days < 1 || *days > statsusage.MaxDays {
		return usagef("--days %d out of range [1, %d]", *days, statsusage.MaxDays)
	}
	zones := map[string]pb.UsageZone{"utc": pb.UsageZone_USAGE_ZONE_UTC, "local": pb.UsageZone_USAGE_ZONE_CONFIGURED}
	z, ok := zones[*zone]
	if !ok {
		return usagef("--zone %q is not one of utc, local", *zone)
	}
	dial, err := tf.dialOptions(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(statsRecvBytes)))
	rr, err := withLimiter(ctx, *addr, dial, *timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.RingResponse, error) {
		return c.Ring(ctx, &pb.RingRequest{})
	})
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	req := &pb.UsageRequest{Days: uint32(*days), Domain: *domain, Zone: z}
	sum, zoneNames, missing := usageOf(rr.Members, func(m *pb.Member) (*pb.UsageResponse, error) {
		return withLimiter(ctx, m.Addr, dial, *timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.UsageResponse, error) {
			return c.Usage(ctx, req)
		})
	})
	answered := len(rr.Members) - len(missing)
	if *asJSON {
		err = statsJSON(stdout, sum, answered)
	} else {
		err = statsTable(stdout, sum, rr, answered, zoneNames)
	}
	if err != nil {
		return err
	}
	var problems []string
	if len(zoneNames) > 1 {
		problems = append(problems, fmt.Sprintf("members keep days in different zones (%s): set the same --stats-timezone on every node, or use --zone utc", strings.Join(zoneNames, ", ")))
	}
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d members did not answer, their statistics are missing from the sums: %s",
			len(missing), len(rr.Members), strings.Join(missing, "; ")))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// usageOf asks every member for its usage statistics (ask, all at once) and
// sums them in member order, as freqring stats and the console show them:
// the sums, the zones the members keep days in, and the members that did
// not answer, with why.
func usageOf(members []*pb.Member, ask func(*pb.Member) (*pb.UsageResponse, error)) (sum []statsusage.DomainDay, zones, missing []string) {
	type answer struct {
		days []statsusage.DomainDay
		zone string
		err  error
	}
	answers := make([]answer, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			resp, err := ask(m)
			if err == nil {
				answers[i].zone = resp.Zone
				answers[i].days, err = node.DecodeUsage(resp)
			}
			answers[i].err = err
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.err != nil {
			missing = append(missing, fmt.Sprintf("%s (%s): %v", members[i].Name, members[i].Addr, a.err))
			continue
		}
		if !slices.Contains(zones, a.zone) {
			zones = append(zones, a.zone)
		}
		sum = statsusage.Merge(sum, a.days)
	}
	return sum, zones, missing
}

// statsRowOf is a merged day as printed.
func statsRowOf(d *statsusage.DomainDay, members int) statsRow {
	est := d.Recipients.Estimate()
	r := statsRow{Zone: d.Zone, Date: d.Date.String(), Domain: d.Domain, Admitted: d.Admitted, Denied: d.Denied,
		DeniedBy: map[string]int64{}, Recipients: int64(math.Round(est)), RecipientsStdError: int64(math.Ceil(est * statsusage.StdError)), Members: members}
	for _, rc := range d.Rules {
		if rc.Denied > 0 {
			r.DeniedBy[rc.Rule] = rc.Denied
		}
		if rc.WouldDeny > 0 {
			if r.WouldDeny == nil {
				r.WouldDeny = map[string]int64{}
			}
			r.WouldDeny[rc.Rule] = rc.WouldDeny
		}
	}
	return r
}

func statsJSON(w io.Writer, sum []statsusage.DomainDay, members int) error {
	enc := json.NewEncoder(w)
	for i := range sum {
		if err := enc.Encode(statsRowOf(&sum[i], members)); err != nil {
			return err
		}
	}
	return nil
}

func statsTable(w io.Writer, sum []statsusage.DomainDay, rr *pb.RingResponse, answered int, zones []string) error {
	zone := "UTC"
	if len(zones) > 0 {
		zone = strings.Join(zones, ", ")
	}
	fmt.Fprintf(w, "usage statistics of %d of %d members (ring of %s), days in %s; distinct recipients ± one standard error (%.2f%%)\n\n",
		answered, len(rr.Members), rr.Node, zone, 100*statsusage.StdError)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DAY\tDOMAIN\tADMITTED\tDENIED\tDISTINCT RECIPIENTS\t  DENIED BY RULE\t")
	for i := range sum {
		r := statsRowOf(&sum[i], answered)
		var by []string
		for _, rc := range sum[i].Rules {
			if rc.Denied > 0 {
				by = append(by, fmt.Sprintf("%s %d", rc.Rule, rc.Denied))
			}
			if rc.WouldDeny > 0 {
				by = append(by, fmt.Sprintf("%s (shadow) %d", rc.Rule, rc.WouldDeny))
			}
		}
		if len(by) == 0 {
			by = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d ±%d\t  %s\t\n", r.Date, r.Domain, r.Admitted, r.Denied, r.Recipients, r.RecipientsStdError, strings.Join(by, ", "))
	}
	if len(sum) == 0 {
		fmt.Fprintln(tw, "(no items counted in these days)\t\t\t\t\t\t")
	}
	return tw.Flush()
}
