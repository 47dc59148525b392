package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/internal/testcert"
)

// get fetches url with c and returns the status code and body; code 0 means
// the request failed (nothing listens yet).
func get(c *http.Client, url string) (int, string) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls url/readyz until it answers 200, for at most 20 seconds.
func waitReady(t *testing.T, c *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get(c, url+"/readyz")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz: %d %s after 20s", url, code, body)
		}
		time.Sleep(20 * time.Millisecond) // polling a bounded wait, not a timed assertion
	}
}

// startServe runs serve with args until the test ends; it must exit 0.
func startServe(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	errOut := make(chan string, 1)
	go func() {
		code, _, e := runCmd(ctx, append([]string{"serve", "--log-level", "warn"}, args...)...)
		errOut <- e
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, <-errOut)
		}
	})
}

// TestAdminEndpoints runs serve with an admin listener and pprof, checks
// through it, and reads /livez, /readyz, /metrics and /debug/pprof/.
func TestAdminEndpoints(t *testing.T) {
	addr, admin := freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--admin-pprof")
	url := "http://" + admin
	c := &http.Client{Timeout: 5 * time.Second}
	waitReady(t, c, url)
	if code, out, errOut := runCmd(context.Background(), "check", "--addr", addr, "--content", "hi", "+8613800000000", "+8613800000000", "+8613800000000"); code != 0 {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	if code, body := get(c, url+"/livez"); code != 200 || body != "ok\n" {
		t.Fatalf("/livez: %d %q", code, body)
	}
	code, body := get(c, url+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for _, want := range []string{
		`freqring_decisions_total{domain="default",result="admitted"} 2`,
		`freqring_decisions_total{domain="default",result="denied"} 1`,
		`freqring_rule_denied_total{domain="default",rule="content-59s"} 1`,
		`freqring_serving 1`,
		`freqring_check_items_count 1`,
		`freqring_check_items_sum 3`,
		"\ngo_goroutines ",
		"\nprocess_resident_memory_bytes ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code, body := get(c, url+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ with --admin-pprof: %d", code)
	}
	if code, body := get(c, url+"/?recipient=%2B8613800000000&content=hi"); code != 200 || !strings.Contains(body, `denied by <span id="denied-by">content-59s</span>`) {
		t.Fatalf("the console's recipient page: %d %.300s", code, body)
	}
}

// TestAdminConsoleAuto: --admin-console auto serves the console on a
// loopback admin address only.
func TestAdminConsoleAuto(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9090": true, "[::1]:9090": true, "localhost:9090": true, "127.0.0.2:9090": true,
		"0.0.0.0:9090": false, "10.0.0.7:9090": false, ":9090": false, "[::]:9090": false,
	} {
		auto := "auto"
		f := adminFlags{console: &auto}
		if got, err := f.consoleOn(addr); err != nil || got != want {
			t.Errorf("consoleOn(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
}

// TestAdminConsoleOff: --admin-console off removes the console and keeps
// the rest of the admin listener.
func TestAdminConsoleOff(t *testing.T) {
	addr, admin := freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--admin-console", "off")
	url := "http://" + admin
	c := &http.Client{Timeout: 5 * time.Second}
	waitReady(t, c, url)
	for _, p := range []string{"/", "/live", "/cluster"} {
		if code, _ := get(c, url+p); code != http.StatusNotFound {
			t.Errorf("%s with --admin-console off: %d, want 404", p, code)
		}
	}
	if code, _ := get(c, url+"/metrics"); code != 200 {
		t.Errorf("/metrics with --admin-console off: %d", code)
	}
}

// TestAdminWithoutPprofAndOverTLS: without --admin-pprof there is no
// /debug/pprof/; with --admin-tls the listener speaks TLS with the gRPC
// listener's certificate and refuses plaintext.
func TestAdminWithoutPprofAndOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "freqring test CA")
	cert, key := ca.Issue(t, "node").Write(t, dir, "node")
	addr, admin := freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--admin-tls", "--tls-cert", cert, "--tls-key", key)
	url := "https://" + admin
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	waitReady(t, c, url)
	if code, body := get(c, url+"/metrics"); code != 200 || !regexp.MustCompile(`(?m)^freqring_serving 1$`).MatchString(body) {
		t.Fatalf("/metrics over TLS: %d", code)
	}
	if code, _ := get(c, url+"/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ without --admin-pprof: %d, want 404", code)
	}
	if code, body := get(&http.Client{Timeout: 5 * time.Second}, "http://"+admin+"/metrics"); code == 200 {
		t.Fatalf("plaintext /metrics on a TLS admin listener answered 200: %.80s", body)
	}
}

func TestAdminUsageErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "freqring test CA")
	_, key := ca.Issue(t, "node").Write(t, dir, "node")
	missing := filepath.Join(dir, "missing.crt")
	listen := []string{"--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--admin-listen", "9090"}, 2, `--admin-listen "9090"`},
		{[]string{"--admin-listen", "127.0.0.1:http"}, 2, `--admin-listen "127.0.0.1:http": port "http"`},
		{[]string{"--admin-tls"}, 2, "--admin-tls needs --tls-cert"},
		{[]string{"--admin-console", "maybe"}, 2, `--admin-console "maybe" is not one of auto, on, off`},
		{[]string{"--admin-tls", "--tls-cert", missing, "--tls-key", key}, 1, "--tls-cert " + missing},
	} {
		code, _, errOut := runCmd(context.Background(), append(append([]string{"serve"}, listen...), tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve %q: exit %d, %s; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestClusterAdminListeners: freqring cluster gives each node an admin
// listener of its own, each serving that node's metrics.
func TestClusterAdminListeners(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		var errOut strings.Builder
		code := run(ctx, []string{"cluster", "-n", "2", "--port", "0", "--admin-listen", "127.0.0.1:0"}, pw, &errOut)
		if code != 0 {
			t.Errorf("cluster exited %d: %s", code, errOut.String())
		}
		pw.Close()
		done <- code
	}()
	defer func() { cancel(); io.Copy(io.Discard, pr); <-done }()
	admins := map[string]string{} // node name -> admin address
	line := regexp.MustCompile(`^(\S+)  grpc \S+  gossip \S+  admin (\S+)$`)
	buf := make([]byte, 0, 1024)
	for len(admins) < 2 {
		b := make([]byte, 256)
		k, err := pr.Read(b)
		if err != nil {
			t.Fatalf("cluster output ended after %q: %v", buf, err)
		}
		buf = append(buf, b[:k]...)
		for _, l := range strings.Split(string(buf), "\n") {
			if m := line.FindStringSubmatch(l); m != nil {
				admins[m[1]] = m[2]
			}
		}
	}
	c := &http.Client{Timeout: 5 * time.Second}
	seen := map[string]bool{}
	for name, addr := range admins {
		if seen[addr] {
			t.Fatalf("two nodes share admin address %s", addr)
		}
		seen[addr] = true
		waitReady(t, c, "http://"+addr)
		code, body := get(c, "http://"+addr+"/metrics")
		if code != 200 || !regexp.MustCompile(`(?m)^freqring_ring_members 2$`).MatchString(body) {
			t.Fatalf("%s /metrics at %s: %d, want freqring_ring_members 2", name, addr, code)
		}
	}
}
