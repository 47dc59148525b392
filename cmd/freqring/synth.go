package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

func synth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("synth", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory to write (absent or empty); then run: freqring serve --data-dir DIR")
	recipients := fs.Int("recipients", 0, "recipients to write: +86 followed by the 11 digits of 13000000000+i, i in [0, N), the recipients of `freqring bench --recipients N`")
	seed := fs.Uint64("seed", 1, "seed of the sends")
	rulesPath := fs.String("rules", "", "rules file the node will serve (default: the embedded default rules); every domain with a recipient rule gets every recipient")
	now := fs.Int64("now", 0, "snapshot time, unix ms (default: now); the node skips records older than their longest window at its own clock")
	workers := fs.Int("workers", 0, "partitions built in parallel (default: GOMAXPROCS)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring synth --data-dir DIR --recipients N [flags]\n\n"+
			"Writes into an empty data directory a snapshot of N recipients at the steady state\n"+
			"(30 sends over the last 24 hours, 3 contents in the last hour), in the node's own format,\n"+
			"so that `freqring serve --data-dir DIR` starts with them.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *dataDir == "":
		return usagef("--data-dir is required")
	case *recipients < 1 || *recipients > node.MaxSynthRecipients:
		return usagef("--recipients %d out of range [1, %d]", *recipients, node.MaxSynthRecipients)
	case *now < 0:
		return usagef("--now %d is negative", *now)
	case *workers < 0 || *workers > 1024:
		return usagef("--workers %d out of range [0, 1024]", *workers)
	}
	rs := rules.Default()
	if *rulesPath != "" {
		var err error
		if rs, err = rules.Load(*rulesPath); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	st, err := node.Synthesize(ctx, node.SynthConfig{DataDir: *dataDir, Recipients: *recipients, Seed: *seed, Rules: rs, Now: *now, Workers: *workers})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "synth: %d recipients in domains %s: %d records, %s\n", st.Recipients, strings.Join(st.Domains, ","), st.Records, st.File)
	fmt.Fprintf(stdout, "synth_seconds=%.2f index_seconds=%.2f snapshot_bytes=%d bytes_per_recipient=%.1f recipients_per_second=%.0f\n",
		st.Took.Seconds(), st.Index.Seconds(), st.Bytes, float64(st.Bytes)/float64(st.Recipients), float64(st.Recipients)/st.Took.Seconds())
	return nil
}
