// Command freqring runs and talks to freqring nodes.
//
//	freqring serve [flags]                 run a node
//	freqring check [flags] RECIPIENT...    ask a node whether messages may go out
//	freqring status [flags]                show the ring and each member
//	freqring stats [flags]                 usage statistics per day and domain, summed over the cluster
//	freqring cluster [flags]               run a local cluster in one process
//	freqring bench [flags]                 measure freqring, and the Redis sorted-set design, under load
//	freqring synth [flags]                 write a data directory of N recipients at steady state
//	freqring rules validate FILE           check a rules file
//	freqring rules default                 print the embedded default rules
//	freqring version                       print the module version and commit
//
// Run a command with -h for its flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	_ "time/tzdata" // --stats-timezone loads zones in an image without /usr/share/zoneinfo (FROM scratch)

	"github.com/freqring/freqring/internal/suggest"
)

const usage = `freqring: exact sliding-window frequency limits for message recipients.

Usage:
  freqring serve [flags]                 run a node
  freqring check [flags] RECIPIENT...    ask a node whether messages may go out
  freqring explain [flags] RECIPIENT     why a recipient's next message would be admitted or denied
  freqring status [flags]                show the ring and each member
  freqring stats [flags]                 usage statistics per day and domain, summed over the cluster
  freqring override set|delete|list      change or list overrides on every member
  freqring cluster [flags]               run a local cluster in one process
  freqring bench [flags]                 measure freqring, and the Redis sorted-set design, under load
  freqring synth [flags]                 write a data directory of N recipients at steady state
  freqring rules validate FILE           check a rules file
  freqring rules default                 print the embedded default rules
  freqring version                       print the module version and commit

Run "freqring COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns the process exit code:
// 0 success, 1 failure, 2 usage error, or a command's own (exitError).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "check":
		err = check(ctx, args[1:], stdout, stderr)
	case "explain":
		err = explain(ctx, args[1:], stdout, stderr)
	case "rules":
		err = rulesCmd(args[1:], stdout, stderr)
	case "status":
		err = status(ctx, args[1:], stdout, stderr)
	case "stats":
		err = stats(ctx, args[1:], stdout, stderr)
	case "override":
		err = overrideCmd(ctx, args[1:], stdout, stderr)
	case "cluster":
		err = cluster(ctx, args[1:], stdout, stderr)
	case "bench":
		err = benchCmd(ctx, args[1:], stdout, stderr)
	case "synth":
		err = synth(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		err = version(args[1:], stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "freqring: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "freqring %s: %v\n", args[0], err)
		return 2
	}
	var ee exitError
	if errors.As(err, &ee) {
		fmt.Fprintf(stderr, "freqring %s: %v\n", args[0], err)
		return ee.code
	}
	fmt.Fprintf(stderr, "freqring %s: %v\n", args[0], err)
	return 1
}

// exitError ends a command with an exit code of its own (other than 1,
// failure, and 2, usage), which the command's usage documents.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// usageError is a command line the command cannot run.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// flagSetSeen, when set, is called with every command's flag set before
// it parses: TestFlagReference renders docs/configuration.md from them.
var flagSetSeen func(*flag.FlagSet)

// parseFlags parses args into fs. On -h (-help, --help) it prints fs's
// usage to w and returns flag.ErrHelp (exit 0). A flag it cannot parse is a
// usageError of one line, which names the closest flag when a flag is not
// defined and one is close, and a pointer to -h; the usage is not printed.
func parseFlags(fs *flag.FlagSet, args []string, w io.Writer) error {
	if flagSetSeen != nil {
		flagSetSeen(fs)
	}
	fs.SetOutput(io.Discard) // the flag package prints its error and the usage on any error
	err := fs.Parse(args)
	fs.SetOutput(w)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fmt.Fprintf(w, "Usage: freqring %s [flags]\n\n", fs.Name())
			fs.PrintDefaults()
		}
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if s := suggest.Closest(name, names); s != "" {
			msg += " (did you mean --" + s + "?)"
		}
	}
	return usageError{fmt.Sprintf("%s\nRun \"freqring %s -h\" for its flags.", msg, fs.Name())}
}

// parseInterspersed parses args into fs as parseFlags does, except that
// flags may also follow positional arguments ("check R1 --mode peek R2"):
// it returns the positional arguments in order. "--" ends the flags: every
// argument after it is positional, even one that starts with "-".
func parseInterspersed(fs *flag.FlagSet, args []string, w io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, w); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
