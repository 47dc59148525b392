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

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// explain runs freqring explain: why the next message to a recipient would
// be admitted or denied, rule by rule.
func explain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	f := &checkFlags{fail: "open", mode: "peek"}
	var hash uint64
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7070", "comma-separated gRPC addresses of nodes; the recipient's owner answers")
	fs.StringVar(&f.domain, "domain", "default", "domain (rule set)")
	fs.StringVar(&f.content, "content", "", "content of the next message: content rules then judge it and list its sends; without it they list every content's")
	fs.Uint64Var(&hash, "content-hash", 0, "the content's 64-bit hash instead of --content (as a check's content_hashes)")
	fs.IntVar(&f.cost, "cost", 1, "sends the next message counts as, 1 to 1000")
	fs.BoolVar(&f.asJSON, "json", false, "print the explanation as JSON (the form GET /v1/explain answers)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of the call")
	f.tls = addTLSFlags(fs, false)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring explain [flags] RECIPIENT [flags]\n\nShows, for each rule of the recipient's domain, the sends it counts now (with their times) or its\nstate, used and remaining, the binding rule and when the next message would be admitted.\nIt records nothing; the node logs the lookup.\n\n")
		fs.PrintDefaults()
	}
	rest, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usagef("want one RECIPIENT, got %d", len(rest))
	}
	if f.content != "" && hash != 0 {
		return usagef("--content and --content-hash: give one")
	}
	if f.cost < 0 || f.cost > 1000 {
		return usagef("--cost %d out of range [1, 1000]", f.cost)
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	c, err := f.dialClient(ctx, stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	req := &pb.ExplainRequest{Recipient: rest[0], Domain: f.domain, ContentHash: hash, Cost: uint32(f.cost)}
	if f.content != "" {
		req.Content = []byte(f.content)
	}
	resp, err := c.Explain(ctx, req)
	if err != nil {
		return fmt.Errorf("explain %s: %w", rest[0], err)
	}
	ex := wire.ExplanationOf(resp)
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	}
	printExplanation(stdout, ex)
	return nil
}

// printExplanation writes ex as a verdict line and a table of rules, each
// followed by its sends or state.
func printExplanation(w io.Writer, ex *wire.Explanation) {
	at := func(t time.Time) string { return t.Format("2006-01-02T15:04:05.000Z") }
	fmt.Fprintf(w, "recipient %s, domain %s, owner %s, at %s\n", ex.Recipient, ex.Domain, ex.Node, at(ex.Now))
	if ex.Override != "" {
		fmt.Fprintf(w, "override %s in force (exempt: %v)\n", ex.Override, ex.Exempt)
	}
	switch {
	case ex.Admitted:
		fmt.Fprintln(w, "next message: ADMITTED now")
	case ex.NextAdmitted == nil:
		fmt.Fprintf(w, "next message: DENIED by %s; never admitted at this cost\n", ex.DeniedBy)
	default:
		fmt.Fprintf(w, "next message: DENIED by %s until %s, retry after %v\n", ex.DeniedBy, at(*ex.NextAdmitted),
			time.Duration(ex.NextAdmittedMs-ex.NowMs)*time.Millisecond)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nrule\talgorithm\tlimit\twindow\tused\tremaining\tretry after")
	for _, r := range ex.Rules {
		name := r.Name
		if r.Shadow {
			name += " (shadow)"
		}
		used, remaining, retry := fmt.Sprint(r.Used), fmt.Sprint(r.Remaining), "-"
		if !r.Judged {
			used, remaining = "-", "-"
		}
		switch {
		case r.RetryAfterMs > 0:
			retry = (time.Duration(r.RetryAfterMs) * time.Millisecond).String()
		case r.RetryAfterMs < 0:
			retry = "never"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", name, r.Algorithm, r.Limit, shortDuration(r.Window), used, remaining, retry)
	}
	tw.Flush()
	for _, r := range ex.Rules {
		switch {
		case len(r.State) > 0:
			var parts []string
			for _, v := range r.State {
				parts = append(parts, fmt.Sprintf("%s=%g", v.Name, v.Value))
			}
			fmt.Fprintf(w, "\n%s state: %s\n", r.Name, strings.Join(parts, " "))
		case len(r.Sends) > 0:
			word := "sends"
			if len(r.Sends) == 1 {
				word = "send"
			}
			fmt.Fprintf(w, "\n%s counts %d %s:\n", r.Name, len(r.Sends), word)
			for _, s := range r.Sends {
				fp := ""
				if s.ContentFingerprint != 0 {
					fp = fmt.Sprintf("  content %08x", s.ContentFingerprint)
				}
				fmt.Fprintf(w, "  %s  leaves the window at %s%s\n", at(s.At), at(s.At.Add(time.Duration(r.WindowMs)*time.Millisecond)), fp)
			}
		}
	}
}
