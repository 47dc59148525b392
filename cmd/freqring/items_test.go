package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/node/nodetest"
)

// serveForTest runs "freqring serve" on a free port until the test ends and
// returns its address once it serves.
func serveForTest(t *testing.T) string {
	t.Helper()
	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		code, _, _ := runCmd(ctx, "serve", "--listen", addr, "--admin-listen", "off", "--shards", "4", "--log-level", "warn")
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := nodetest.WaitServing(wctx, addr); err != nil {
		t.Fatalf("serve: %v", err)
	}
	return addr
}

// checkJSON runs check with args and decodes its JSON lines.
func checkJSON(t *testing.T, args ...string) []checkResult {
	t.Helper()
	code, out, errOut := runCmd(context.Background(), append([]string{"check", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("check %q: exit %d\n%s%s", args, code, out, errOut)
	}
	var rs []checkResult
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var r checkResult
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}

// Case 7 of issue 12: "check +861 --mode peek" recorded sends to "+861",
// "--mode" and "peek". Flags after recipients are now parsed; after "--"
// every argument is a recipient.
func TestCheckParsesFlagsAfterRecipients(t *testing.T) {
	addr := serveForTest(t)
	rs := checkJSON(t, "--addr", addr, "+861", "--mode", "peek")
	if len(rs) != 1 || rs[0].Recipient != "+861" || rs[0].Recorded || rs[0].Rules[0].Used != 0 {
		t.Fatalf("check +861 --mode peek: %+v, want one peek of +861", rs)
	}
	// Nothing was recorded for any of the three words.
	rs = checkJSON(t, "--addr", addr, "--mode", "peek", "--", "--mode", "peek", "+861")
	if len(rs) != 3 || rs[0].Recipient != "--mode" || rs[1].Recipient != "peek" {
		t.Fatalf("after --: %+v, want recipients --mode, peek, +861", rs)
	}
	for _, r := range rs {
		if r.Rules[0].Used != 0 {
			t.Errorf("%q: used %d, want 0: a flag was recorded as a recipient", r.Recipient, r.Rules[0].Used)
		}
	}
	// A flag after the recipients that the command does not know is a usage
	// error, not a recipient.
	if code, _, errOut := runCmd(context.Background(), "check", "--addr", addr, "+861", "--nope"); code != 2 || !strings.Contains(errOut, "-nope") {
		t.Fatalf("unknown flag after a recipient: exit %d %s", code, errOut)
	}
	// --cost 0 means 1, as in the client and the API.
	rs = checkJSON(t, "--addr", addr, "--cost", "0", "+862")
	if !rs[0].Recorded || rs[0].Rules[0].Used != 1 {
		t.Fatalf("--cost 0: %+v, want recorded with cost 1", rs[0])
	}
	// status shows admitted and denied: 16 sends to +863, whose limit is 15
	// a minute, make one denial.
	for range 16 {
		checkJSON(t, "--addr", addr, "+863")
	}
	code, out, _ := runCmd(context.Background(), "status", "--addr", addr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	head, row := lines[len(lines)-2], lines[len(lines)-1]
	col := func(name string) string { // tabwriter aligns each column's start
		i := strings.Index(head, name)
		if code != 0 || i < 0 || i >= len(row) {
			t.Fatalf("status: exit %d, no column %s\n%s", code, name, out)
		}
		return strings.Fields(row[i:])[0]
	}
	// Admitted: the 4 peeks, +862, and 15 of +863.
	if col("CHECKS") != "21" || col("ADMITTED") != "20" || col("DENIED") != "1" {
		t.Fatalf("status: checks %s admitted %s denied %s, want 21, 20, 1\n%s", col("CHECKS"), col("ADMITTED"), col("DENIED"), out)
	}
}

func TestVersionAndRulesHelp(t *testing.T) {
	code, out, _ := runCmd(context.Background(), "version")
	if code != 0 || !strings.HasPrefix(out, "freqring ") || !strings.Contains(out, " commit ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: exit %d %q", code, out)
	}
	for _, args := range [][]string{{"rules", "-h"}, {"rules", "--help"}, {"rules", "validate", "-h"}, {"rules", "help"}} {
		code, out, _ := runCmd(context.Background(), args...)
		if code != 0 || !strings.Contains(out, "freqring rules validate FILE") {
			t.Errorf("%q: exit %d %q", args, code, out)
		}
	}
}

func TestConfigFileErrorsNameKeyValueAndForm(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"lsten: x\n":            `unknown key "lsten" (did you mean "listen"?)`,
		"frobnicate: x\n":       `unknown key "frobnicate"; the keys are the flags' names with _ for -: `,
		"shards: many\n":        `key shards: value "many": want an integer, such as `,
		"sync_interval: 5\n":    `key sync_interval: value "5": want a duration with its unit, such as 5ms, 10s or 1m (flag --sync-interval)`,
		"skip_corrupt: maybe\n": `key skip_corrupt: value "maybe": want true or false`,
	} {
		p := filepath.Join(dir, "serve.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		code, _, errOut := runCmd(context.Background(), "serve", "--config", p, "--listen", "127.0.0.1:0")
		if code != 2 || !strings.Contains(errOut, p+": ") || !strings.Contains(errOut, want) {
			t.Errorf("%q: exit %d %q, want exit 2 and %q", body, code, errOut, want)
		}
	}
}

func TestVersionLine(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-11-23T12:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := versionLine(bi), "freqring v1.2.3 commit 0123abcd+dirty (2026-11-23T12:00:00Z) go1.26.0"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
