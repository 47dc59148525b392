package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/freqring/freqring/bench"
)

// TestSynthThenServe runs the real commands: synth, serve on its directory,
// status --wait until SERVING, then a peek at a synthesized recipient.
func TestSynthThenServe(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	code, out, errOut := runCmd(context.Background(), "synth", "--data-dir", dir, "--recipients", "500", "--workers", "2")
	if code != 0 || !strings.Contains(out, "synth: 500 recipients in domains default: 500 records") || !strings.Contains(out, "bytes_per_recipient=") {
		t.Fatalf("synth: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = runCmd(context.Background(), "synth", "--data-dir", dir, "--recipients", "500")
	if code != 1 || !strings.Contains(errOut, dir+" holds") {
		t.Fatalf("second synth: exit %d, %s", code, errOut)
	}

	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		code, _, _ := runCmd(ctx, "serve", "--listen", addr, "--admin-listen", "off", "--data-dir", dir, "--log-level", "warn")
		done <- code
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	}()
	if code, out, errOut := runCmd(context.Background(), "status", "--addr", addr, "--wait", "1m"); code != 0 || !strings.Contains(out, "1 members") {
		t.Fatalf("status --wait: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCmd(context.Background(), "check", "--addr", addr, "--json", "--mode", "peek", bench.RecipientName(123))
	var r checkResult
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		t.Fatalf("peek: exit %d %v\n%s%s", code, err, out, errOut)
	}
	// Its oldest send is 3 hours inside the 24 h window: the test's pace
	// does not matter.
	if r.Rules[1].Used != 30 {
		t.Fatalf("recipient %s: recipient-24h used %d, want the steady state's 30", bench.RecipientName(123), r.Rules[1].Used)
	}
}

func TestSynthUsage(t *testing.T) {
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"synth", "--recipients", "10"}, 2, "--data-dir is required"},
		{[]string{"synth", "--data-dir", full}, 2, "--recipients 0 out of range"},
		{[]string{"synth", "--data-dir", full, "--recipients", "10", "--workers", "-1"}, 2, "--workers -1 out of range"},
		{[]string{"synth", "--data-dir", full, "--recipients", "10"}, 1, full + " holds x"},
	} {
		if code, _, errOut := runCmd(context.Background(), tc.args...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, %s; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}
