package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/freeport"
	"github.com/freqring/freqring/rules"
)

func runCmd(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

func TestRulesCommands(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, rules.DefaultYAML(), 0o644)
	os.WriteFile(bad, []byte("domains:\n  - name: x\n    rules:\n      - {name: r, scope: recipient, limit: 0, window: 1s}\n"), 0o644)

	if code, out, _ := runCmd(context.Background(), "rules", "validate", good); code != 0 || !strings.Contains(out, "content-59m") {
		t.Fatalf("validate good: exit %d, %s", code, out)
	}
	code, _, errOut := runCmd(context.Background(), "rules", "validate", bad)
	if code != 1 || !strings.Contains(errOut, bad+`:4: domain "x" rule "r": limit 0 out of range`) {
		t.Fatalf("validate bad: exit %d, %s", code, errOut)
	}
	calendar := filepath.Join(dir, "calendar.yaml")
	os.WriteFile(calendar, []byte("domains:\n  - name: mkt\n    rules:\n      - {name: daily, algorithm: fixed-window, limit: 3, calendar: day, zone: Asia/Shanghai}\n      - {name: monthly, algorithm: fixed-window, limit: 20, borrow: 5, calendar: month}\n"), 0o644)
	code, out, _ := runCmd(context.Background(), "rules", "validate", calendar)
	if code != 0 || !strings.Contains(out, "at most 3 per calendar day in Asia/Shanghai  (fixed-window)") ||
		!strings.Contains(out, "at most 20 per calendar month in UTC  (fixed-window, borrowing up to 5)") {
		t.Fatalf("validate calendar rules: exit %d, %s", code, out)
	}
	if code, out, _ := runCmd(context.Background(), "rules", "default"); code != 0 || !bytes.Equal([]byte(out), rules.DefaultYAML()) {
		t.Fatalf("default: exit %d", code)
	}
	// A bad rules file stops serve before it listens, with the file:line reason.
	code, _, errOut = runCmd(context.Background(), "serve", "--rules", bad, "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, bad+":4:") {
		t.Fatalf("serve with bad rules: exit %d, %s", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"check"}, {"check", "--mode", "x", "r"}, {"serve", "extra"}, {"rules"}, {"rules", "validate"}, {"serve", "--log-level", "loud"}} {
		if code, _, _ := runCmd(context.Background(), args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code, _, _ := runCmd(context.Background(), "serve", "-h"); code != 0 {
		t.Errorf("serve -h: exit %d", code)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	port, err := freeport.TCP()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// TestServeAndCheck runs the real commands: serve from a config file, then
// check twice against it, in text and JSON.
func TestServeAndCheck(t *testing.T) {
	addr := freePort(t)
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	os.WriteFile(cfg, []byte("listen: "+addr+"\nadmin_listen: 127.0.0.1:0\nshards: 4\nlog_level: warn\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { code, _, _ := runCmd(ctx, "serve", "--config", cfg); done <- code }()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	}()

	var code int
	var out, errOut string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if code, out, errOut = runCmd(context.Background(), "check", "--addr", addr, "--content", "hello", "--timeout", "1s", "+8613800000000"); code == 0 {
			break
		}
	}
	if code != 0 || !strings.Contains(out, "ADMITTED (recorded)") || !strings.Contains(out, "recipient-24h") {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	runCmd(context.Background(), "check", "--addr", addr, "--content", "hello", "+8613800000000")
	code, out, _ = runCmd(context.Background(), "check", "--addr", addr, "--json", "--content", "hello", "+8613800000000")
	var r checkResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		t.Fatalf("json: exit %d %v\n%s", code, err, out)
	}
	if r.Admitted || r.DeniedBy != "content-59s" || r.RetryAfterMs <= 0 || r.Rules[2].Used != 2 {
		t.Fatalf("third identical message: %+v", r)
	}
	if code, out, _ := runCmd(context.Background(), "check", "--addr", addr, "--domain", "nope", "x"); code != 1 || !strings.Contains(out, `unknown domain "nope"`) {
		t.Fatalf("unknown domain: exit %d %s", code, out)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "serve.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	newFlags := func() (*flag.FlagSet, *string, *int, *time.Duration, *string) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		return fs, fs.String("listen", "a", ""), fs.Int("shards", 1, ""), fs.Duration("sync-interval", time.Second, ""), fs.String("join", "", "")
	}
	fs, listen, shards, syncIv, join := newFlags()
	fs.Parse([]string{"--listen", "from-flag"})
	p := write("listen: from-file\nshards: 64\nsync_interval: 5ms\njoin: [a:1, b:2]\n")
	if err := applyConfigFile(fs, p); err != nil {
		t.Fatal(err)
	}
	if *listen != "from-flag" || *shards != 64 || *syncIv != 5*time.Millisecond || *join != "a:1,b:2" {
		t.Fatalf("listen %q shards %d sync_interval %v join %q", *listen, *shards, *syncIv, *join)
	}
	for body, want := range map[string]string{
		"lsten: x\n":         `unknown key "lsten"`,
		"shards: many\n":     `key shards: value "many": want an integer`,
		"sync_interval: 5\n": `key sync_interval: value "5": want a duration`,
	} {
		fs, _, _, _, _ := newFlags()
		if err := applyConfigFile(fs, write(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", body, err, want)
		}
	}
}

// TestServeReloadsTheRulesFile: serve re-reads --rules when the file
// changes, and keeps its rules, counting a failed reload, when it is bad.
func TestServeReloadsTheRulesFile(t *testing.T) {
	addr := freePort(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	// write replaces the file whole (a rename), so that a read never sees
	// it half written: each version is read as one.
	write := func(limit string) {
		y := "domains:\n  - name: default\n    rules:\n      - {name: r, scope: recipient, limit: " + limit + ", window: 1h}\n"
		if err := os.WriteFile(path+".tmp", []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := runCmd(ctx, "serve", "--listen", addr, "--admin-listen", "off", "--rules", path, "--rules-watch-interval", "20ms", "--log-level", "error")
		done <- code
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lc := pb.NewLimiterClient(conn)
	// waitFor polls the node until ok holds of its rules and status.
	waitFor := func(what string, ok func(*pb.RulesResponse, *pb.StatusResponse) bool) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			rr, err1 := lc.Rules(cctx, &pb.RulesRequest{}, grpc.WaitForReady(true))
			st, err2 := lc.Status(cctx, &pb.StatusRequest{})
			ccancel()
			if err1 == nil && err2 == nil && ok(rr, st) {
				return
			}
			last = fmt.Sprint(rr, st, err1, err2)
		}
		t.Fatalf("not %s within 10 s: %s", what, last)
	}
	limit := func(rr *pb.RulesResponse) uint32 { return rr.Domains[0].Rules[0].Limit }
	waitFor("serving limit 1", func(rr *pb.RulesResponse, st *pb.StatusResponse) bool { return st.Serving && limit(rr) == 1 })
	write("5")
	waitFor("limit 5", func(rr *pb.RulesResponse, st *pb.StatusResponse) bool { return limit(rr) == 5 && st.RulesReloads == 1 })
	write("-1")
	waitFor("a failed reload", func(rr *pb.RulesResponse, st *pb.StatusResponse) bool { return st.RulesReloadFailures == 1 })
	waitFor("still limit 5", func(rr *pb.RulesResponse, st *pb.StatusResponse) bool { return limit(rr) == 5 && st.RulesReloads == 1 })
	write("7")
	waitFor("limit 7", func(rr *pb.RulesResponse, st *pb.StatusResponse) bool { return limit(rr) == 7 && st.RulesReloads == 2 })
}

// TestEveryCommandHelps: every command and subcommand prints its usage on
// -h (and -help, --help) and exits 0, without connecting anywhere or
// starting anything.
func TestEveryCommandHelps(t *testing.T) {
	for _, cmd := range []struct {
		args  []string
		usage string // in the usage printed
	}{
		{nil, "freqring serve [flags]"},
		{[]string{"serve"}, "Usage: freqring serve"},
		{[]string{"check"}, "Usage: freqring check"},
		{[]string{"status"}, "Usage: freqring status"},
		{[]string{"stats"}, "Usage: freqring stats"},
		{[]string{"override"}, "Usage: freqring override set"},
		{[]string{"override", "set"}, "Usage: freqring override set"},
		{[]string{"override", "delete"}, "Usage: freqring override set"},
		{[]string{"override", "list"}, "Usage: freqring override set"},
		{[]string{"cluster"}, "Usage: freqring cluster"},
		{[]string{"bench"}, "Usage: freqring bench"},
		{[]string{"synth"}, "Usage: freqring synth"},
		{[]string{"rules"}, "freqring rules validate FILE"},
		{[]string{"rules", "validate"}, "freqring rules validate FILE"},
		{[]string{"rules", "default"}, "freqring rules default"},
		{[]string{"version"}, "Usage: freqring version"},
	} {
		for _, h := range []string{"-h", "-help", "--help"} {
			args := append(slices.Clone(cmd.args), h)
			code, out, errOut := runCmd(context.Background(), args...)
			if code != 0 || !strings.Contains(out+errOut, cmd.usage) || strings.Contains(out+errOut, "not defined") {
				t.Errorf("freqring %s: exit %d, want 0 with usage %q\n%s%s", strings.Join(args, " "), code, cmd.usage, out, errOut)
			}
		}
	}
}

// TestFlagTypoSuggests: a flag that is not defined is one line naming it
// and the closest flag, if one is close, and a pointer to -h; exit 2, and
// no usage. The same for a config file's key.
func TestFlagTypoSuggests(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--lisen", "x"}, "freqring serve: flag provided but not defined: -lisen (did you mean --listen?)\nRun \"freqring serve -h\" for its flags.\n"},
		{[]string{"serve", "-data_dir=/x"}, "freqring serve: flag provided but not defined: -data_dir (did you mean --data-dir?)\nRun \"freqring serve -h\" for its flags.\n"},
		{[]string{"check", "r", "--adr", "x"}, "freqring check: flag provided but not defined: -adr (did you mean --addr?)\nRun \"freqring check -h\" for its flags.\n"},
		{[]string{"override", "set", "--exmpt", "v"}, "freqring override: flag provided but not defined: -exmpt (did you mean --exempt?)\nRun \"freqring override set -h\" for its flags.\n"},
		{[]string{"status", "--frobnicate"}, "freqring status: flag provided but not defined: -frobnicate\nRun \"freqring status -h\" for its flags.\n"},
		{[]string{"serve", "--shards", "many"}, "freqring serve: invalid value \"many\" for flag -shards: parse error\nRun \"freqring serve -h\" for its flags.\n"},
	} {
		code, out, errOut := runCmd(context.Background(), tc.args...)
		if code != 2 || out != "" || errOut != tc.want {
			t.Errorf("freqring %s: exit %d\n%s%s\nwant exit 2 and\n%s", strings.Join(tc.args, " "), code, out, errOut, tc.want)
		}
	}
	cfg := filepath.Join(t.TempDir(), "serve.yaml")
	for body, want := range map[string]string{
		"lsten: x\n":        `serve.yaml: unknown key "lsten" (did you mean "listen"?)`,
		"datadir: /x\n":     `serve.yaml: unknown key "datadir" (did you mean "data_dir"?)`,
		"frobnicate: 1\n":   `serve.yaml: unknown key "frobnicate"; the keys are the flags' names with _ for -: `,
		"sync_intrval: 5\n": `serve.yaml: unknown key "sync_intrval" (did you mean "sync_interval"?)`,
	} {
		os.WriteFile(cfg, []byte(body), 0o644)
		code, _, errOut := runCmd(context.Background(), "serve", "--config", cfg)
		if code != 2 || !strings.Contains(errOut, want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("config %q: exit %d %s; want exit 2 and one line containing %s", body, code, errOut, want)
		}
	}
}
