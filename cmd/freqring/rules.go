package main

import (
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

const rulesUsage = `Usage:
  freqring rules validate FILE   check a rules file and print its domains and rules
  freqring rules default         print the embedded default rules (a starting point for a file)
`

func rulesCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("want a subcommand: validate FILE, or default")
	}
	if args[0] == "help" || slices.ContainsFunc(args, isHelp) {
		fmt.Fprint(stdout, rulesUsage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "validate":
		if len(args) != 2 {
			return usagef("usage: freqring rules validate FILE")
		}
		rs, err := rules.Load(args[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: ok\n", args[1])
		for _, name := range rs.Names() {
			fmt.Fprintf(stdout, "  domain %s:\n", name)
			for _, r := range rs.Domain(name).Rules() {
				shadow := ""
				if r.Shadow {
					shadow = "  (shadow: never denies)"
				}
				alg := ""
				switch {
				case r.Algorithm == window.SlidingCounter && r.Buckets == 0:
					alg = fmt.Sprintf("  (sliding-counter, %d buckets)", window.DefaultBuckets)
				case r.Algorithm == window.SlidingCounter:
					alg = fmt.Sprintf("  (sliding-counter, %d buckets)", r.Buckets)
				case r.Borrow > 0:
					alg = fmt.Sprintf("  (%v, borrowing up to %d)", r.Algorithm, r.Borrow)
				case r.Calendar != window.CalendarNone:
					alg = fmt.Sprintf("  (%v)", r.Algorithm)
				case r.Algorithm != window.SlidingLog && r.Capacity > 0:
					alg = fmt.Sprintf("  (%v, capacity %d)", r.Algorithm, r.Capacity)
				case r.Algorithm != window.SlidingLog:
					alg = fmt.Sprintf("  (%v)", r.Algorithm)
				}
				fmt.Fprintf(stdout, "    %-20s %-18s at most %d per %s%s%s\n", r.Name, r.Scope, r.Limit, r.Per(), alg, shadow)
			}
		}
		for _, o := range rs.Overrides() {
			what := "exempt"
			if !o.Exempt {
				what = fmt.Sprintf("limits %v", o.Limits)
			}
			fmt.Fprintf(stdout, "  override %s: domain %s, %d recipients, %d prefixes: %s\n", o.Name, o.Domain, len(o.Recipients), len(o.Prefixes), what)
		}
		return nil
	case "default":
		_, err := stdout.Write(rules.DefaultYAML())
		return err
	}
	return usagef("unknown subcommand %q: want validate FILE, or default", args[0])
}

// isHelp reports whether a is a request for help.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }
