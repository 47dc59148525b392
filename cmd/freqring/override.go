package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/window"
)

// overrideCmd runs "freqring override set|delete|list": it applies to every
// member of the ring that --addr reports, and reports per member.
func overrideCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("want override set|delete|list")
	}
	if isHelp(args[0]) || args[0] == "help" {
		args = []string{"set", "-h"} // set's usage is every subcommand's
	}
	f, rest, err := parseOverrideFlags(args[0], args[1:], stderr)
	if err != nil {
		return err
	}
	dial, err := f.tls.dialOptions(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	tok, err := tokenDialOption(f.tokenPath)
	if err != nil {
		return err
	}
	dial = append(dial, tok...)
	members, err := ringMembers(ctx, f.addr, dial, f.timeout)
	if err != nil {
		return err
	}
	r := &memberReport{w: stdout}
	switch f.sub {
	case "set":
		f.set(ctx, members, dial, rest[0], r)
	case "delete":
		f.delete(ctx, members, dial, rest[0], r)
	case "list":
		f.list(ctx, members, dial, r)
	}
	if r.failed > 0 {
		return fmt.Errorf("override %s: %d of %d members failed", f.sub, r.failed, len(members))
	}
	return nil
}

// overrideFlags holds the flags of one override subcommand, sub, as parsed.
type overrideFlags struct {
	sub       string // set, delete or list
	addr      string
	timeout   time.Duration
	tls       *tlsFlags
	tokenPath string

	// set only
	domain, recipients, prefixes string
	exempt                       bool
	limits                       limitFlags
}

// parseOverrideFlags defines the flags of override sub and parses args
// into them (usage to stderr on -h). It returns the positional arguments:
// the override's NAME for set and delete, none for list.
func parseOverrideFlags(sub string, args []string, stderr io.Writer) (*overrideFlags, []string, error) {
	fs := flag.NewFlagSet("override "+sub, flag.ContinueOnError)
	f := &overrideFlags{sub: sub, limits: limitFlags{}}
	fs.StringVar(&f.addr, "addr", "127.0.0.1:7070", "gRPC address of any node: the command applies to every member of its ring")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of each call")
	f.tls = addTLSFlags(fs, false)
	fs.StringVar(&f.tokenPath, "token-file", "", "file of admin tokens (the nodes' --admin-token-file): its first token is sent with each call as the operator's credentials")
	switch sub {
	case "set":
		fs.StringVar(&f.domain, "domain", "default", "the domain whose keys it overrides")
		fs.StringVar(&f.recipients, "recipients", "", "comma-separated exact keys")
		fs.StringVar(&f.prefixes, "prefixes", "", "comma-separated key prefixes (an exact key beats a prefix, the longest prefix wins)")
		fs.BoolVar(&f.exempt, "exempt", false, "admit the keys without a check (still recorded); not with --limit")
		fs.Var(f.limits, "limit", "RULE=LIMIT, the rule's limit for these keys; repeat for several rules")
	case "delete", "list":
	default:
		return nil, nil, usagef("override %q is not one of set, delete, list", sub)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring override set [flags] NAME | delete [flags] NAME | list [flags]\n\n"+
			"Sets, lifts or lists admin overrides (other limits, or none, for listed keys) on every member of the ring.\n\n")
		fs.PrintDefaults()
	}
	rest, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return nil, nil, err
	}
	wantArgs := 1
	if sub == "list" {
		wantArgs = 0
	}
	if len(rest) != wantArgs {
		return nil, nil, usagef("override %s wants %d argument(s) (NAME), got %q", sub, wantArgs, rest)
	}
	return f, rest, nil
}

// ringMembers returns the members of the ring of the node at addr, or that
// node alone when it is not a cluster member.
func ringMembers(ctx context.Context, addr string, dial []grpc.DialOption, timeout time.Duration) ([]*pb.Member, error) {
	rr, err := withLimiter(ctx, addr, dial, timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.RingResponse, error) {
		return c.Ring(ctx, &pb.RingRequest{})
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	if len(rr.Members) == 0 {
		return []*pb.Member{{Name: rr.Node, Addr: addr}}, nil
	}
	return rr.Members, nil
}

// memberReport prints the outcome of a command on each member, one line
// each, and counts the members that failed. Not safe for concurrent use.
type memberReport struct {
	w      io.Writer
	failed int
}

// line prints m's outcome: err, or the message of format and a.
func (r *memberReport) line(m *pb.Member, err error, format string, a ...any) {
	if err != nil {
		r.failed++
		fmt.Fprintf(r.w, "%s (%s): FAILED: %v\n", m.Name, m.Addr, err)
		return
	}
	fmt.Fprintf(r.w, "%s (%s): %s\n", m.Name, m.Addr, fmt.Sprintf(format, a...))
}

// set sets override name, of one version, on every member.
func (f *overrideFlags) set(ctx context.Context, members []*pb.Member, dial []grpc.DialOption, name string, r *memberReport) {
	o := &pb.Override{Name: name, Domain: f.domain, Recipients: splitList(f.recipients), Prefixes: splitList(f.prefixes),
		Limits: f.limits, Exempt: f.exempt, Version: time.Now().UnixMilli()} // one version on every member
	ctx = metadata.AppendToOutgoingContext(ctx, node.CallerHeader, operatorName())
	for _, m := range members {
		resp, err := withAdmin(ctx, m.Addr, dial, f.timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideSetResponse, error) {
			return c.SetOverride(ctx, &pb.OverrideSetRequest{Override: o})
		})
		r.line(m, err, "set %q, version %d", resp.GetOverride().GetName(), resp.GetOverride().GetVersion())
	}
}

// operatorName names the user of freqring override for the overrides it
// sets (their set_by): "freqring override USER@HOST".
func operatorName() string {
	host, _ := os.Hostname()
	user := os.Getenv("USER")
	if user == "" {
		user = "?"
	}
	return "freqring override " + user + "@" + host
}

// delete lifts override name on every member, with one version.
func (f *overrideFlags) delete(ctx context.Context, members []*pb.Member, dial []grpc.DialOption, name string, r *memberReport) {
	version := time.Now().UnixMilli() // one version on every member
	for _, m := range members {
		resp, err := withAdmin(ctx, m.Addr, dial, f.timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideDeleteResponse, error) {
			return c.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: name, Version: version})
		})
		if err == nil && !resp.Deleted {
			r.line(m, nil, "no admin override %q", name)
			continue
		}
		r.line(m, err, "lifted %q", name)
	}
}

// list prints the overrides of every member (see printOverrides).
func (f *overrideFlags) list(ctx context.Context, members []*pb.Member, dial []grpc.DialOption, r *memberReport) {
	lists := make(map[string][]*pb.Override, len(members))
	for _, m := range members {
		resp, err := withAdmin(ctx, m.Addr, dial, f.timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideListResponse, error) {
			return c.ListOverrides(ctx, &pb.OverrideListRequest{})
		})
		if err != nil {
			r.line(m, err, "")
			continue
		}
		lists[m.Name] = resp.Overrides
	}
	printOverrides(r.w, members, lists)
}

// printOverrides prints every override any member has, once, with the
// members that lack it or hold another version of it.
func printOverrides(w io.Writer, members []*pb.Member, lists map[string][]*pb.Override) {
	type seen struct {
		o      *pb.Override
		byNode map[string]string // member -> canonical bytes of its copy
	}
	all := map[string]*seen{}
	var names []string
	for _, m := range members {
		for _, o := range lists[m.Name] {
			key := o.Source + "/" + o.Name
			s := all[key]
			if s == nil {
				s = &seen{o: o, byNode: map[string]string{}}
				all[key] = s
				names = append(names, key)
			}
			c := proto.Clone(o).(*pb.Override)
			c.SetBy = "" // who set it is not what is in force
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
			s.byNode[m.Name] = string(b)
		}
	}
	slices.Sort(names)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tDOMAIN\tKEYS\tLIMITS\tVERSION\tMEMBERS")
	for _, key := range names {
		s := all[key]
		o := s.o
		lim := "exempt"
		if !o.Exempt {
			var parts []string
			for _, r := range slices.Sorted(mapKeys(o.Limits)) {
				parts = append(parts, fmt.Sprintf("%s=%d", r, o.Limits[r]))
			}
			lim = strings.Join(parts, ",")
		}
		keys := fmt.Sprintf("%d recipients, %d prefixes", len(o.Recipients), len(o.Prefixes))
		// The most common copy is the reference; the others disagree.
		count := map[string]int{}
		for _, b := range s.byNode {
			count[b]++
		}
		ref, best := "", 0
		for b, c := range count {
			if c > best || c == best && b < ref {
				ref, best = b, c
			}
		}
		var missing, differ []string
		for _, m := range members {
			if _, answered := lists[m.Name]; !answered {
				continue // unreachable: reported above
			}
			b, ok := s.byNode[m.Name]
			switch {
			case !ok:
				missing = append(missing, m.Name)
			case b != ref:
				differ = append(differ, m.Name)
			}
		}
		state := "all agree"
		if len(missing)+len(differ) > 0 {
			state = "DISAGREE:"
			if len(missing) > 0 {
				state += " missing on " + strings.Join(missing, ",")
			}
			if len(differ) > 0 {
				state += " other version on " + strings.Join(differ, ",")
			}
		}
		var refO pb.Override
		if proto.Unmarshal([]byte(ref), &refO) == nil {
			o = &refO
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", o.Name, o.Source, o.Domain, keys, lim, o.Version, state)
	}
	tw.Flush()
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// limitFlags collects --limit RULE=LIMIT.
type limitFlags map[string]uint32

func (l limitFlags) String() string { return fmt.Sprint(map[string]uint32(l)) }

func (l limitFlags) Set(v string) error {
	rule, n, ok := strings.Cut(v, "=")
	if !ok || rule == "" {
		return errors.New("want RULE=LIMIT, such as recipient-1m=100")
	}
	x, err := strconv.ParseUint(n, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) || err == nil && x > window.MaxCounterLimit:
		// Out of range for every rule: the node names the bound of the
		// rule's algorithm for the rest.
		return fmt.Errorf("limit %s of rule %q out of range [1, %d] (the most a counting rule takes; a sliding-log rule takes up to %d)", n, rule, window.MaxCounterLimit, window.MaxLimit)
	case err != nil:
		return fmt.Errorf("limit %q of rule %q is not a whole number", n, rule)
	}
	l[rule] = uint32(x)
	return nil
}

// withAdmin makes one Admin call to the node at addr.
func withAdmin[T any](ctx context.Context, addr string, dial []grpc.DialOption, timeout time.Duration, call func(context.Context, pb.AdminClient) (T, error)) (T, error) {
	return withConn(ctx, addr, dial, timeout, pb.NewAdminClient, call)
}
