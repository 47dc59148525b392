package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/freqring/freqring/node"
)

const versionUsage = `Usage: freqring version

Prints the module version, the commit it was built from and the Go version,
then the peer protocol version, which nodes must share to share a ring.
`

// version prints the main module's version, the VCS commit it was built
// from (with "+dirty" for a modified tree) and the Go version, then the
// peer protocol version, which nodes must share to share a ring.
func version(args []string, stdout io.Writer) error {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprint(stdout, versionUsage)
		return flag.ErrHelp
	}
	if len(args) > 0 {
		return usagef("unexpected argument %q\nRun \"freqring version -h\" for its usage.", args[0])
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("no build information in this binary")
	}
	fmt.Fprintln(stdout, versionLine(bi))
	fmt.Fprintf(stdout, "protocol %d\n", node.ProtocolVersion)
	return nil
}

// versionLine formats build information as one line:
// "freqring v1.2.3 commit 0123abcd (2026-11-23T12:00:00Z) go1.26.0".
func versionLine(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(unknown)"
	}
	commit, when, dirty := "unknown", "", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.time":
			when = " (" + s.Value + ")"
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	return fmt.Sprintf("freqring %s commit %s%s%s %s", v, commit, dirty, when, bi.GoVersion)
}
