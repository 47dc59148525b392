package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// checkResult is one item's decision as "check --json" prints it.
type checkResult struct {
	Recipient    string       `json:"recipient"`
	Admitted     bool         `json:"admitted"`
	Recorded     bool         `json:"recorded"`
	DeniedBy     string       `json:"denied_by,omitempty"`
	RetryAfterMs int64        `json:"retry_after_ms"`
	DecidedAt    time.Time    `json:"decided_at"`
	Rules        []ruleResult `json:"rules,omitempty"`
	Error        string       `json:"error,omitempty"`
}

type ruleResult struct {
	Name         string `json:"name"`
	Limit        uint32 `json:"limit"`
	Window       string `json:"window"`
	Used         uint32 `json:"used"`
	Remaining    uint32 `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
}

func check(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7070", "node gRPC address")
	domain := fs.String("domain", "default", "domain (rule set)")
	content := fs.String("content", "", "message content (content rules apply only with content)")
	cost := fs.Uint("cost", 1, "sends each message counts as")
	mode := fs.String("mode", "check", "check (check and record), peek (change nothing), or record (record without checking)")
	asJSON := fs.Bool("json", false, "print one JSON object per recipient")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring check [flags] RECIPIENT...\n\nAsks a node whether a message may go to each recipient now, and prints each rule's state.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef("want at least one RECIPIENT")
	}
	modes := map[string]pb.Mode{"check": pb.Mode_MODE_CHECK_AND_RECORD, "peek": pb.Mode_MODE_PEEK, "record": pb.Mode_MODE_RECORD_ONLY}
	m, ok := modes[*mode]
	if !ok {
		return usagef("mode %q is not one of check, peek, record", *mode)
	}
	req := &pb.CheckRequest{
		Recipients: fs.Args(),
		Domains:    []string{*domain},
		Costs:      []uint32{uint32(*cost)},
		Modes:      []pb.Mode{m},
	}
	if *content != "" {
		req.Contents = [][]byte{[]byte(*content)}
	}

	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := pb.NewLimiterClient(conn).Check(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	results := decodeResponse(req, resp)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else {
		printResults(stdout, results)
	}
	for _, r := range results {
		if r.Error != "" {
			return fmt.Errorf("%d of %d items failed", len(resp.Errors), len(results))
		}
	}
	return nil
}

// decodeResponse turns the columns of resp into one result per item.
func decodeResponse(req *pb.CheckRequest, resp *pb.CheckResponse) []checkResult {
	errs := map[uint32]*pb.ItemError{}
	for _, e := range resp.Errors {
		errs[e.Index] = e
	}
	var out []checkResult
	off := 0 // next per-rule entry
	for i, rcp := range req.Recipients {
		r := checkResult{Recipient: rcp, DecidedAt: time.UnixMilli(resp.DecidedAtMs[i]).UTC()}
		if e := errs[uint32(i)]; e != nil {
			r.Error = fmt.Sprintf("%s: %s", codes.Code(e.Code), e.Message)
			out = append(out, r)
			continue
		}
		r.Admitted, r.Recorded, r.RetryAfterMs = resp.Admitted[i], resp.Recorded[i], resp.RetryAfterMs[i]
		name := req.Domains[0]
		if len(req.Domains) > 1 {
			name = req.Domains[i]
		}
		d := resp.Domains[name]
		for j, rule := range d.GetRules() {
			r.Rules = append(r.Rules, ruleResult{
				Name: rule.Name, Limit: rule.Limit, Window: rule.Window,
				Used: resp.Used[off+j], Remaining: resp.Remaining[off+j], RetryAfterMs: resp.RuleRetryAfterMs[off+j],
			})
		}
		off += len(d.GetRules())
		if k := resp.DeniedBy[i]; k >= 0 && int(k) < len(r.Rules) {
			r.DeniedBy = r.Rules[k].Name
		}
		out = append(out, r)
	}
	return out
}

func printResults(w io.Writer, results []checkResult) {
	for i, r := range results {
		if i > 0 {
			fmt.Fprintln(w)
		}
		switch {
		case r.Error != "":
			fmt.Fprintf(w, "%s  FAILED  %s\n", r.Recipient, r.Error)
			continue
		case r.Admitted && r.Recorded:
			fmt.Fprintf(w, "%s  ADMITTED (recorded)  at %s\n", r.Recipient, r.DecidedAt.Format(time.RFC3339Nano))
		case r.Admitted:
			fmt.Fprintf(w, "%s  ADMITTED (not recorded)  at %s\n", r.Recipient, r.DecidedAt.Format(time.RFC3339Nano))
		default:
			fmt.Fprintf(w, "%s  DENIED by %s, retry after %v  at %s\n", r.Recipient, r.DeniedBy,
				time.Duration(r.RetryAfterMs)*time.Millisecond, r.DecidedAt.Format(time.RFC3339Nano))
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rule\tlimit\twindow\tused\tremaining\tretry after\t")
		for _, rr := range r.Rules {
			retry := "-"
			if rr.RetryAfterMs > 0 {
				retry = (time.Duration(rr.RetryAfterMs) * time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t\n", rr.Name, rr.Limit, strings.TrimSuffix(strings.TrimSuffix(rr.Window, "0s"), "0m"), rr.Used, rr.Remaining, retry)
		}
		tw.Flush()
	}
}
