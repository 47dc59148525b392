package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
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
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("override "+sub, flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7070", "gRPC address of any node: the command applies to every member of its ring")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of each call")
	tf := addTLSFlags(fs, false)
	tokenPath := fs.String("token-file", "", "file of admin tokens (the nodes' --admin-token-file): its first token is sent with each call as the operator's credentials")
	var domain, recipients, prefixes *string
	var exempt *bool
	limits := limitFlags{}
	switch sub {
	case "set":
		domain = fs.String("domain", "default", "the domain whose keys it overrides")
		recipients = fs.String("recipients", "", "comma-separated exact keys")
		prefixes = fs.String("prefixes", "", "comma-separated key prefixes (an exact key beats a prefix, the longest prefix wins)")
		exempt = fs.Bool("exempt", false, "admit the keys without a check (still recorded); not with --limit")
		fs.Var(limits, "limit", "RULE=LIMIT, the rule's limit for these keys; repeat for several rules")
	case "delete", "list":
	default:
		return usagef("override %q is not one of set, delete, list", sub)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring override set [flags] NAME | delete [flags] NAME | list [flags]\n\n"+
			"Sets, lifts or lists admin overrides (other limits, or none, for listed keys) on every member of the ring.\n\n")
		fs.PrintDefaults()
	}
	rest, err := parseInterspersed(fs, args, stderr)
	if err != nil {
		return err
	}
	wantArgs := 1
	if sub == "list" {
		wantArgs = 0
	}
	if len(rest) != wantArgs {
		return usagef("override %s wants %d argument(s) (NAME), got %q", sub, wantArgs, rest)
	}
	dial, err := tf.dialOptions(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	tok, err := tokenDialOption(*tokenPath)
	if err != nil {
		return err
	}
	dial = append(dial, tok...)
	rr, err := withLimiter(ctx, *addr, dial, *timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.RingResponse, error) {
		return c.Ring(ctx, &pb.RingRequest{})
	})
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	members := rr.Members
	if len(members) == 0 {
		members = []*pb.Member{{Name: rr.Node, Addr: *addr}}
	}
	var failed int
	report := func(m *pb.Member, err error, format string, a ...any) {
		if err != nil {
			failed++
			fmt.Fprintf(stdout, "%s (%s): FAILED: %v\n", m.Name, m.Addr, err)
			return
		}
		fmt.Fprintf(stdout, "%s (%s): %s\n", m.Name, m.Addr, fmt.Sprintf(format, a...))
	}
	switch sub {
	case "set":
		o := &pb.Override{Name: rest[0], Domain: *domain, Recipients: splitList(*recipients), Prefixes: splitList(*prefixes),
			Limits: limits, Exempt: *exempt, Version: time.Now().UnixMilli()} // one version on every member
		for _, m := range members {
			resp, err := withAdmin(ctx, m.Addr, dial, *timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideSetResponse, error) {
				return c.SetOverride(ctx, &pb.OverrideSetRequest{Override: o})
			})
			report(m, err, "set %q, version %d", resp.GetOverride().GetName(), resp.GetOverride().GetVersion())
		}
	case "delete":
		version := time.Now().UnixMilli() // one version on every member
		for _, m := range members {
			resp, err := withAdmin(ctx, m.Addr, dial, *timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideDeleteResponse, error) {
				return c.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: rest[0], Version: version})
			})
			if err == nil && !resp.Deleted {
				report(m, nil, "no admin override %q", rest[0])
				continue
			}
			report(m, err, "lifted %q", rest[0])
		}
	case "list":
		lists := make(map[string][]*pb.Override, len(members))
		for _, m := range members {
			resp, err := withAdmin(ctx, m.Addr, dial, *timeout, func(ctx context.Context, c pb.AdminClient) (*pb.OverrideListResponse, error) {
				return c.ListOverrides(ctx, &pb.OverrideListRequest{})
			})
			if err != nil {
				report(m, err, "")
				continue
			}
			lists[m.Name] = resp.Overrides
		}
		printOverrides(stdout, members, lists)
	}
	if failed > 0 {
		return fmt.Errorf("override %s: %d of %d members failed", sub, failed, len(members))
	}
	return nil
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
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(o)
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
