package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/client"
)

// checkResult is one item's decision as "check --json" prints it.
type checkResult struct {
	Recipient string `json:"recipient"`
	Admitted  bool   `json:"admitted"`
	Recorded  bool   `json:"recorded"`
	Degraded  bool   `json:"degraded,omitempty"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Refund    bool   `json:"refund,omitempty"`
	Refunded  bool   `json:"refunded,omitempty"`
	Node      string `json:"node,omitempty"`
	DeniedBy  string `json:"denied_by,omitempty"`
	// ShadowDeniedBy is the shadow rule that would have denied the item.
	ShadowDeniedBy string       `json:"shadow_denied_by,omitempty"`
	RetryAfterMs   int64        `json:"retry_after_ms"`
	DecidedAt      time.Time    `json:"decided_at"`
	Rules          []ruleResult `json:"rules,omitempty"`
	Error          string       `json:"error,omitempty"`
}

type ruleResult struct {
	Name         string `json:"name"`
	Limit        uint32 `json:"limit"`
	Window       string `json:"window"`
	Used         uint32 `json:"used"`
	Remaining    uint32 `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Shadow       bool   `json:"shadow,omitempty"`
}

// check runs freqring check: it decides one item per recipient and prints
// each rule's state.
func check(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, recipients, err := parseCheckFlags(args, stderr)
	if err != nil {
		return err
	}
	items := make([]client.Item, len(recipients))
	for i, r := range recipients {
		items[i] = client.Item{Domain: f.domain, Recipient: r, Content: []byte(f.content), Cost: f.cost, Mode: f.m, RequestID: f.requestID}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	c, err := f.dialClient(ctx, stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	decs, err := c.CheckBatch(ctx, items)
	var bad client.ItemErrors
	if err != nil && !errors.As(err, &bad) {
		return err
	}
	results := make([]checkResult, len(items))
	for i, d := range decs {
		results[i] = resultOf(items[i].Recipient, d)
		results[i].Refund = f.m == client.Refund
	}
	for _, e := range bad {
		results[e.Index].Error = fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	if err := f.write(stdout, results); err != nil {
		return err
	}
	return f.verdict(results, len(bad))
}

// checkFlags holds the flags of freqring check, as parsed and checked.
type checkFlags struct {
	addr, domain, content, mode, fail string
	cost                              int
	requestID                         uint64
	asJSON                            bool
	timeout                           time.Duration
	tls                               *tlsFlags

	m      client.Mode          // from mode
	policy client.FailurePolicy // from fail
}

// parseCheckFlags defines check's flags, parses args into them (usage to
// stderr on -h) and checks them. It returns the recipients: the positional
// arguments, at least one.
func parseCheckFlags(args []string, stderr io.Writer) (*checkFlags, []string, error) {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	f := &checkFlags{}
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7070", "comma-separated gRPC addresses of nodes; the client learns the ring from them and asks each recipient's owner")
	fs.StringVar(&f.domain, "domain", "default", "domain (rule set)")
	fs.StringVar(&f.content, "content", "", "message content (content rules apply only with content)")
	fs.IntVar(&f.cost, "cost", 1, "sends each message counts as, 1 to 1000; 0 means 1, as in the client and the API")
	fs.StringVar(&f.mode, "mode", "check", "check (check and record), peek (change nothing), record (record without checking), or refund (take back the send --request-id recorded: it was not delivered)")
	fs.Uint64Var(&f.requestID, "request-id", 0, "request id of each item (0: a random one per call); a retry with the same id is not recorded twice, and a refund names its send by it")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object per recipient")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of the call; past it the failure policy answers")
	fs.StringVar(&f.fail, "fail", "open", "failure policy when no node answers in time: open (admit) or closed (deny); either way marked degraded")
	f.tls = addTLSFlags(fs, false)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring check [flags] RECIPIENT... [flags]\n\nAsks the cluster whether a message may go to each recipient now, and prints each rule's state.\nFlags may come before or after the recipients; after \"--\" every argument is a recipient.\n\n"+
			"Exit status: 0 when a node decided every item (admitted or denied); 1 when an item failed or\nno node answered at --addr; 2 for a usage error; 3 when an item is DEGRADED: no node decided\nit within --timeout, and the failure policy (--fail) answered instead.\n\n")
		fs.PrintDefaults()
	}
	recipients, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return nil, nil, err
	}
	if len(recipients) == 0 {
		return nil, nil, usagef("want at least one RECIPIENT")
	}
	return f, recipients, f.validate()
}

// validate checks --mode, --request-id and --fail, and sets m and policy.
func (f *checkFlags) validate() error {
	modes := map[string]client.Mode{"check": client.CheckAndRecord, "peek": client.Peek, "record": client.RecordOnly, "refund": client.Refund}
	m, ok := modes[f.mode]
	if !ok {
		return usagef("mode %q is not one of check, peek, record, refund", f.mode)
	}
	if m == client.Refund && f.requestID == 0 {
		return usagef("--mode refund needs --request-id: the id the send was recorded with")
	}
	f.m = m
	f.policy = client.FailOpen
	switch f.fail {
	case "open":
	case "closed":
		f.policy = client.FailClosed
	default:
		return usagef("--fail %q is not one of open, closed", f.fail)
	}
	return nil
}

// dialClient returns a client of the nodes at --addr, once one of them has
// answered (reachSeeds), logging warnings to stderr.
func (f *checkFlags) dialClient(ctx context.Context, stderr io.Writer) (*client.Client, error) {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dial, err := f.tls.dialOptions(logger)
	if err != nil {
		return nil, err
	}
	seeds := strings.Split(f.addr, ",")
	if err := reachSeeds(ctx, seeds, dial, !f.tls.enabled()); err != nil {
		return nil, err // at once: New would retry the seeds until --timeout
	}
	c, err := client.New(ctx, client.Config{Seeds: seeds, Timeout: f.timeout, FailurePolicy: f.policy, Logger: logger, DialOptions: dial})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.addr, err)
	}
	return c, nil
}

// write prints the results to w: one JSON object each with --json, else
// the table of printResults.
func (f *checkFlags) write(w io.Writer, results []checkResult) error {
	if !f.asJSON {
		printResults(w, results)
		return nil
	}
	enc := json.NewEncoder(w)
	for _, r := range results {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// verdict returns check's error, if any, from its results, of which failed
// items failed: an error when an item failed, else exitDegraded when the
// failure policy answered for one.
func (f *checkFlags) verdict(results []checkResult, failed int) error {
	if failed > 0 {
		return fmt.Errorf("%d of %d items failed", failed, len(results))
	}
	degraded := 0
	for _, r := range results {
		if r.Degraded {
			degraded++
		}
	}
	if degraded > 0 {
		return exitError{exitDegraded, fmt.Sprintf("%d of %d items DEGRADED: no node decided in time, and the failure policy (--fail %s) answered", degraded, len(results), f.fail)}
	}
	return nil
}

// exitDegraded is check's exit code when the failure policy answered.
const exitDegraded = 3

// reachSeeds asks every seed for the ring once, at once, and returns nil
// as soon as one answers. Else it returns an error of one line a seed that
// says why none answered, with a hint: nothing listens there, or it speaks
// HTTP/1 (the admin port; probed when plaintext), or it did not answer in
// time.
func reachSeeds(ctx context.Context, seeds []string, dial []grpc.DialOption, plaintext bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the others need not finish
	errs := make(chan error, len(seeds))
	for _, s := range seeds {
		go func() {
			_, err := withLimiter(ctx, s, dial, time.Until(deadlineOf(ctx)), func(ctx context.Context, c pb.LimiterClient) (*pb.RingResponse, error) {
				return c.Ring(ctx, &pb.RingRequest{})
			})
			if err != nil {
				err = seedError(ctx, s, err, plaintext)
			}
			errs <- err
		}()
	}
	var all []error
	for range seeds {
		err := <-errs
		if err == nil {
			return nil
		}
		all = append(all, err)
	}
	return errors.Join(all...)
}

// deadlineOf is ctx's deadline, or a minute from now without one.
func deadlineOf(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(time.Minute)
}

// seedError explains in one line why the seed at addr did not answer the
// Ring RPC with err.
func seedError(ctx context.Context, addr string, err error, plaintext bool) error {
	st := grpcstatus.Convert(err)
	if st.Code() != codes.Unavailable && st.Code() != codes.DeadlineExceeded {
		return fmt.Errorf("%s: %v: %s", addr, st.Code(), st.Message()) // a node answered, with an error
	}
	var d net.Dialer
	conn, derr := d.DialContext(ctx, "tcp", addr)
	if derr != nil {
		var se *os.SyscallError
		if errors.As(derr, &se) {
			derr = se.Err // "connection refused"
		}
		return fmt.Errorf("no node answered at %s (%v): is \"freqring serve\" running? is --addr right?", addr, derr)
	}
	defer conn.Close()
	if plaintext && speaksHTTP1(ctx, conn) {
		return fmt.Errorf("%s answered HTTP/1, not gRPC: is it the admin port? the gRPC port is --listen, 7070 by default", addr)
	}
	if st.Code() == codes.DeadlineExceeded {
		return fmt.Errorf("no node answered at %s in time: is it a freqring node's gRPC port (--listen)? is --addr right?", addr)
	}
	return fmt.Errorf("no node answered at %s (%s): is it a freqring node's gRPC port (--listen)? is --addr right?", addr, st.Message())
}

// speaksHTTP1 sends conn the HTTP/2 client preface that gRPC starts with
// and reports whether the answer begins as an HTTP/1 response does.
func speaksHTTP1(ctx context.Context, conn net.Conn) bool {
	conn.SetDeadline(deadlineOf(ctx))
	if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		return false
	}
	b := make([]byte, 7)
	_, err := io.ReadFull(conn, b)
	return err == nil && string(b) == "HTTP/1."
}

// resultOf converts a client decision for printing.
func resultOf(recipient string, d client.Decision) checkResult {
	r := checkResult{Recipient: recipient, Admitted: d.Admitted, Recorded: d.Recorded, Degraded: d.Degraded,
		DeniedBy: d.DeniedBy, ShadowDeniedBy: d.ShadowDeniedBy, RetryAfterMs: d.RetryAfter.Milliseconds(), DecidedAt: d.DecidedAt.UTC(), Node: d.Node, Duplicate: d.Duplicate, Refunded: d.Refunded}
	for _, rs := range d.Rules {
		r.Rules = append(r.Rules, ruleResult{Name: rs.Name, Limit: uint32(rs.Limit), Window: rs.Window.String(),
			Used: uint32(rs.Used), Remaining: uint32(rs.Remaining), RetryAfterMs: rs.RetryAfter.Milliseconds(), Shadow: rs.Shadow})
	}
	return r
}

func printResults(w io.Writer, results []checkResult) {
	for i, r := range results {
		if i > 0 {
			fmt.Fprintln(w)
		}
		at := r.DecidedAt.Format(time.RFC3339Nano)
		switch {
		case r.Error != "":
			fmt.Fprintf(w, "%s  FAILED  %s\n", r.Recipient, r.Error)
			continue
		case r.Degraded:
			fmt.Fprintf(w, "%s  DEGRADED: no node answered in time; the failure policy says admitted=%v\n", r.Recipient, r.Admitted)
			continue
		case r.Refund && r.Refunded:
			fmt.Fprintf(w, "%s  REFUNDED: the send of %s no longer counts  by %s\n", r.Recipient, at, r.Node)
		case r.Refund:
			fmt.Fprintf(w, "%s  NOT REFUNDED AGAIN: the send of %s was refunded earlier  by %s\n", r.Recipient, at, r.Node)
		case r.Duplicate:
			fmt.Fprintf(w, "%s  ADMITTED (recorded earlier: a repeat of the same request)%s  at %s  by %s\n", r.Recipient, shadowNote(r, ""), at, r.Node)
		case r.Admitted && r.Recorded:
			fmt.Fprintf(w, "%s  ADMITTED (recorded)%s  at %s  by %s\n", r.Recipient, shadowNote(r, ""), at, r.Node)
		case r.Admitted:
			fmt.Fprintf(w, "%s  ADMITTED (not recorded)%s  at %s  by %s\n", r.Recipient, shadowNote(r, ""), at, r.Node)
		default:
			fmt.Fprintf(w, "%s  DENIED by %s, retry after %v%s  at %s  by %s\n", r.Recipient, r.DeniedBy,
				time.Duration(r.RetryAfterMs)*time.Millisecond, shadowNote(r, " too"), at, r.Node)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rule\tlimit\twindow\tused\tremaining\tretry after\t")
		for _, rr := range r.Rules {
			retry := "-"
			if rr.RetryAfterMs > 0 {
				retry = (time.Duration(rr.RetryAfterMs) * time.Millisecond).String()
			} else if rr.RetryAfterMs < 0 {
				retry = "never"
			}
			name := rr.Name
			if rr.Shadow {
				name += " (shadow)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t\n", name, rr.Limit, shortDuration(rr.Window), rr.Used, rr.Remaining, retry)
		}
		tw.Flush()
	}
}

// shadowNote is ", shadow rule R would deny" (with suffix) when a shadow
// rule would have denied the item, else "".
func shadowNote(r checkResult, suffix string) string {
	if r.ShadowDeniedBy == "" {
		return ""
	}
	return fmt.Sprintf(", shadow rule %s would deny%s", r.ShadowDeniedBy, suffix)
}

// shortDuration drops a Go duration's zero tails: 1m0s -> 1m, 24h0m0s -> 24h.
func shortDuration(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
