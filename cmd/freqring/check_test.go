package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/client"
)

// TestPrintResultsNamesShadowRules: check names the shadow rule that would
// have denied, on an admitted and on a denied item, and marks shadow rules
// in the table.
func TestPrintResultsNamesShadowRules(t *testing.T) {
	at := time.UnixMilli(1_790_000_000_000)
	rules := []client.RuleState{
		{Name: "recipient-1m", Limit: 15, Window: time.Minute, Used: 16, RetryAfter: 3 * time.Second, Shadow: true},
		{Name: "recipient-24h", Limit: 50, Window: 24 * time.Hour, Used: 16, Remaining: 34},
	}
	var b bytes.Buffer
	printResults(&b, []checkResult{
		resultOf("+1", client.Decision{Admitted: true, Recorded: true, ShadowDeniedBy: "recipient-1m", DecidedAt: at, Node: "n", Rules: rules}),
		resultOf("+2", client.Decision{DeniedBy: "recipient-24h", RetryAfter: time.Second, ShadowDeniedBy: "recipient-1m", DecidedAt: at, Node: "n", Rules: rules}),
	})
	out := b.String()
	for _, want := range []string{
		"+1  ADMITTED (recorded), shadow rule recipient-1m would deny  at ",
		"+2  DENIED by recipient-24h, retry after 1s, shadow rule recipient-1m would deny too  at ",
		"recipient-1m (shadow)     15      1m    16          0           3s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for in, want := range map[string]string{"1m0s": "1m", "24h0m0s": "24h", "10s": "10s", "59s": "59s", "1h30m0s": "1h30m", "1m30s": "1m30s", "20m0s": "20m", "100ms": "100ms"} {
		if got := shortDuration(in); got != want {
			t.Errorf("shortDuration(%q) = %q, want %q", in, got, want)
		}
	}
}

// closedPort is an address on 127.0.0.1 where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestCheckWithoutANode: check against an address where no node listens
// fails at once (not after --timeout, retrying) with one line that says so
// and hints at the cause; against an HTTP/1 port (the admin port) with one
// line that says it is not gRPC and where the gRPC port is. Exit 1.
func TestCheckWithoutANode(t *testing.T) {
	http1 := httptest.NewServer(http.NotFoundHandler())
	defer http1.Close()
	closed := closedPort(t)
	for _, tc := range []struct{ addr, want string }{
		{closed, "freqring check: no node answered at " + closed + " (connection refused): is \"freqring serve\" running? is --addr right?\n"},
		{http1.Listener.Addr().String(), "freqring check: " + http1.Listener.Addr().String() + " answered HTTP/1, not gRPC: is it the admin port? the gRPC port is --listen, 7070 by default\n"},
	} {
		begin := time.Now()
		code, out, errOut := runCmd(context.Background(), "check", "--addr", tc.addr, "--timeout", "10s", "+8613800000000")
		if code != 1 || out != "" || errOut != tc.want {
			t.Errorf("check --addr %s: exit %d\n%s%s\nwant exit 1 and\n%s", tc.addr, code, out, errOut, tc.want)
		}
		if d := time.Since(begin); d >= 10*time.Second {
			t.Errorf("check --addr %s took %v: it waited for --timeout", tc.addr, d)
		}
	}
}

// TestCheckDegradedExits3: when a node gives the ring but the recipient's
// owner cannot be reached (here the node advertises an address where
// nothing listens), the failure policy answers: check prints DEGRADED (and
// the client's warning with the cause) and exits 3, with --fail open (which
// admits) as with --fail closed.
func TestCheckDegradedExits3(t *testing.T) {
	addr, admin := freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--advertise", closedPort(t))
	waitReady(t, &http.Client{Timeout: 5 * time.Second}, "http://"+admin)
	for _, fail := range []string{"open", "closed"} {
		code, out, errOut := runCmd(context.Background(), "check", "--addr", addr, "--timeout", "300ms", "--fail", fail, "+8613800000000")
		if code != 3 || !strings.Contains(out, "DEGRADED: no node answered in time; the failure policy says admitted="+strconv.FormatBool(fail == "open")) ||
			!strings.HasSuffix(errOut, "\nfreqring check: 1 of 1 items DEGRADED: no node decided in time, and the failure policy (--fail "+fail+") answered\n") {
			t.Errorf("--fail %s: exit %d\n%s%s\nwant exit 3, DEGRADED, the client's warning with the cause, and why the exit", fail, code, out, errOut)
		}
	}
	code, out, _ := runCmd(context.Background(), "check", "--addr", addr, "--timeout", "300ms", "--json", "+8613800000000")
	if code != 3 || !strings.Contains(out, `"degraded":true`) {
		t.Errorf("--json: exit %d %s; want exit 3 and degraded", code, out)
	}
	if code, out, errOut := runCmd(context.Background(), "check", "-h"); code != 0 || !strings.Contains(out+errOut, "3 when") {
		t.Errorf("check -h: exit %d; want the exit codes documented:\n%s%s", code, out, errOut)
	}
}
