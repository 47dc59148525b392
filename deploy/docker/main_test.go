package docker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// skipReason is why TestCluster skipped, or "" if it did not skip (or did
// not run). Set by loudSkip, read by TestMain after the tests.
var skipReason string

// TestMain runs the tests, then announces a skip of the harness in one line,
// "deploy/docker: Docker harness skipped: <reason>", where a plain
// `go test ./...` shows it (see announce).
func TestMain(m *testing.M) {
	code := m.Run()
	if skipReason != "" {
		announce("deploy/docker: Docker harness skipped: " + strings.ReplaceAll(skipReason, "\n", " "))
	}
	os.Exit(code)
}

// announce prints line for whoever runs go test. The go command keeps the
// whole output of a passing test binary, stdout and stderr alike, to itself
// unless -v or -json is given, so without them the line goes to the go
// command's own stderr (parentStderr). Otherwise, or when that cannot be
// opened, it goes to this binary's stderr, shown with -v, with -json, and
// when the package fails.
func announce(line string) {
	if !testing.Verbose() {
		if f := parentStderr(); f != nil {
			_, err := fmt.Fprintln(f, line)
			f.Close()
			if err == nil {
				return
			}
		}
	}
	fmt.Fprintln(os.Stderr, line)
}

// parentStderr opens the stderr of the go command that runs this test
// binary, through /proc (Linux), or returns nil: when the parent is not a
// go command, when its stderr is neither a terminal nor a pipe (a file
// opened again would be written at an offset of its own), or on any error.
func parentStderr() *os.File {
	ppid := os.Getppid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid))
	if err != nil || filepath.Base(exe) != "go" {
		return nil
	}
	path := fmt.Sprintf("/proc/%d/fd/2", ppid)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&(os.ModeCharDevice|os.ModeNamedPipe) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}
