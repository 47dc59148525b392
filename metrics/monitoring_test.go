package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/freqring/freqring/internal/freeport"
	"github.com/freqring/freqring/metrics"
)

// monitoringDir holds the dashboard and the alert rules.
const monitoringDir = "../deploy/monitoring"

// scrapedNode serves over HTTP the metrics of a node (with a WAL, so that
// fsyncs are observed) that has run knownSequence, as a node's /metrics
// does, and returns its URL.
func scrapedNode(t *testing.T) string {
	t.Helper()
	obs := metrics.NewObserver()
	n, clk := newNode(t, obs)
	knownSequence(t, n, clk)
	srv := httptest.NewServer(promhttp.HandlerFor(metrics.NewRegistry(n, obs), promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// scrape returns the exposition at url.
func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

// exposedNames returns the metric family names (# TYPE lines) of an
// exposition.
func exposedNames(expo []byte) map[string]bool {
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllSubmatch(expo, -1) {
		names[string(m[1])] = true
	}
	return names
}

// mentionedNames returns the freqring_ identifiers in text, with the
// _bucket, _sum and _count suffixes of histogram series stripped.
func mentionedNames(text []byte) []string {
	set := map[string]bool{}
	for _, m := range regexp.MustCompile(`freqring_[a-zA-Z0-9_]+`).FindAll(text, -1) {
		name := string(m)
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suf)
		}
		set[name] = true
	}
	var out []string
	for name := range set {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// TestMonitoringNamesExist: every metric the dashboard and the alert rules
// name is in a real scrape of a node that has done checks.
func TestMonitoringNamesExist(t *testing.T) {
	exposed := exposedNames(scrape(t, scrapedNode(t)))
	for _, file := range []string{"dashboard.json", "alerts.yaml", "alerts_test.yaml"} {
		b, err := os.ReadFile(filepath.Join(monitoringDir, file))
		if err != nil {
			t.Fatal(err)
		}
		if file == "dashboard.json" && !json.Valid(b) {
			t.Fatalf("%s is not valid JSON", file)
		}
		names := mentionedNames(b)
		if len(names) < 3 {
			t.Fatalf("%s names only %v", file, names)
		}
		for _, name := range names {
			if !exposed[name] {
				t.Errorf("%s names %s, which a node does not export", file, name)
			}
		}
	}
}

// binary returns the path of a Prometheus binary, skipping the test when it
// is missing, or failing it if CI_REQUIRE_PROMETHEUS=1 (.ci/run installs
// Debian's prometheus package and sets it).
func binary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI_REQUIRE_PROMETHEUS") == "1" {
			t.Fatalf("%s not found and CI_REQUIRE_PROMETHEUS=1: %v", name, err)
		}
		t.Skipf("%s not found (apt-get install prometheus); skipping", name)
	}
	return p
}

// TestPromtoolChecksMetrics lints a real exposition with promtool check metrics.
func TestPromtoolChecksMetrics(t *testing.T) {
	promtool := binary(t, "promtool")
	expo := scrape(t, scrapedNode(t))
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(expo)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestPromtoolChecksRules checks the alert rules and runs their unit tests.
func TestPromtoolChecksRules(t *testing.T) {
	promtool := binary(t, "promtool")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}, {"check", "config", "prometheus.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = monitoringDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// freeAddr returns a loopback address with a port free a moment ago, below
// the ephemeral range (package freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := freeport.TCP()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// TestPrometheusScrapesNode starts a real Prometheus that scrapes a node
// every second, waits for it to be ready, and polls its query API until the
// target is up and a freqring metric has the node's value.
func TestPrometheusScrapesNode(t *testing.T) {
	bin := binary(t, "prometheus")
	target, err := url.Parse(scrapedNode(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %s\nscrape_configs:\n  - job_name: freqring\n    static_configs:\n      - targets: [%q]\n",
		filepath.Join(mustAbs(t, monitoringDir), "alerts.yaml"), target.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	var log bytes.Buffer
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yaml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := "http://" + addr
	poll := func(what string, ok func() (bool, string)) {
		t.Helper()
		for {
			good, last := ok()
			if good {
				return
			}
			select {
			case err := <-exited:
				t.Fatalf("prometheus exited (%v) while waiting for %s; last: %s\n%s", err, what, last, log.String())
			case <-ctx.Done():
				t.Fatalf("no %s within 60s; last: %s\n%s", what, last, log.String())
			case <-time.After(100 * time.Millisecond): // a bounded poll, not a timed assertion
			}
		}
	}
	get := func(path string) (int, []byte) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	poll("/-/ready", func() (bool, string) {
		code, b := get("/-/ready")
		return code == 200, string(b)
	})
	query := func(q string) (bool, string) {
		code, b := get("/api/v1/query?query=" + url.QueryEscape(q))
		var r struct {
			Status string
			Data   struct {
				Result []struct {
					Value []any
				}
			}
		}
		if code != 200 || json.Unmarshal(b, &r) != nil || len(r.Data.Result) != 1 || len(r.Data.Result[0].Value) != 2 {
			return false, string(b)
		}
		return true, fmt.Sprint(r.Data.Result[0].Value[1])
	}
	value := func(q, want string) func() (bool, string) {
		return func() (bool, string) {
			ok, v := query(q)
			return ok && v == want, v
		}
	}
	poll(`up == 1`, value(`up{job="freqring"}`, "1"))
	poll(`freqring_decisions_total`, value(`freqring_decisions_total{job="freqring",domain="a",result="admitted"}`, "3"))
	poll(`freqring_serving`, value(`freqring_serving{job="freqring"}`, "1"))
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
