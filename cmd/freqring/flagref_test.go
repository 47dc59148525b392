package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated flag reference in docs/configuration.md")

// flagCommands are the command lines whose flags the reference lists, in
// its order. Each is run with -h to get its flag set.
var flagCommands = [][]string{
	{"serve"}, {"check"}, {"explain"}, {"status"}, {"stats"},
	{"override", "set"}, {"override", "delete"}, {"override", "list"},
	{"cluster"}, {"bench"}, {"synth"},
}

const (
	flagRefBegin = "<!-- BEGIN FLAG REFERENCE: generated from the commands' flag sets by `go test ./cmd/freqring -run TestFlagReference -update`; do not edit by hand -->"
	flagRefEnd   = "<!-- END FLAG REFERENCE -->"
)

// commandFlags returns the flag set a command line builds, by running it
// with -h and catching the set as it parses.
func commandFlags(t *testing.T, cmd []string) *flag.FlagSet {
	t.Helper()
	var fs *flag.FlagSet
	flagSetSeen = func(f *flag.FlagSet) { fs = f }
	defer func() { flagSetSeen = nil }()
	if code := run(context.Background(), append(append([]string{}, cmd...), "-h"), io.Discard, io.Discard); code != 0 {
		t.Fatalf("freqring %s -h: exit %d", strings.Join(cmd, " "), code)
	}
	if fs == nil {
		t.Fatalf("freqring %s -h parsed no flag set", strings.Join(cmd, " "))
	}
	return fs
}

// renderFlagReference writes one Markdown table per command: every flag,
// its type, default and help text, as the flag set defines them.
func renderFlagReference(t *testing.T) string {
	var b strings.Builder
	b.WriteString(flagRefBegin + "\n")
	for _, cmd := range flagCommands {
		fs := commandFlags(t, cmd)
		fmt.Fprintf(&b, "\n### freqring %s\n\n", strings.Join(cmd, " "))
		b.WriteString("| flag | default | meaning |\n|------|---------|---------|\n")
		fs.VisitAll(func(f *flag.Flag) {
			typ, usage := flag.UnquoteUsage(f)
			name := "`--" + f.Name
			if typ != "" {
				name += " " + typ
			}
			name += "`"
			def := "`" + f.DefValue + "`"
			if f.DefValue == "" {
				def = "—"
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, mdCell(usage))
		})
	}
	b.WriteString("\n" + flagRefEnd)
	return b.String()
}

// mdCell makes text safe in a Markdown table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "<", "&lt;")
	return strings.ReplaceAll(s, "\n", " ")
}

// TestFlagReference checks that docs/configuration.md lists every flag of
// every command as the code defines it; -update rewrites the list.
func TestFlagReference(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "configuration.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(doc, []byte(flagRefBegin))
	j := bytes.Index(doc, []byte(flagRefEnd))
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q section", path, flagRefBegin, flagRefEnd)
	}
	want := renderFlagReference(t)
	got := string(doc[i : j+len(flagRefEnd)])
	if got == want {
		return
	}
	if *update {
		out := append(append(append([]byte{}, doc[:i]...), want...), doc[j+len(flagRefEnd):]...)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the flag reference in %s", path)
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for k := range max(len(gl), len(wl)) {
		var g, w string
		if k < len(gl) {
			g = gl[k]
		}
		if k < len(wl) {
			w = wl[k]
		}
		if g != w {
			t.Fatalf("%s: the flag reference differs from the flag sets from its line %d:\n doc:  %s\n code: %s\nrun: go test ./cmd/freqring -run TestFlagReference -update", path, k+1, g, w)
		}
	}
}
