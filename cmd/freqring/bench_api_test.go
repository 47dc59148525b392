package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchAPIWorkload runs `freqring bench --workload api` against a
// cluster it starts, for a bounded number of calls, with each algorithm.
func TestBenchAPIWorkload(t *testing.T) {
	for _, alg := range []string{"fixed-window", "sliding-counter", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			var out, errb strings.Builder
			err := benchCmd(context.Background(), []string{"--workload", "api", "--algorithm", alg, "--start-cluster", "2",
				"--target", "freqring", "--apps", "2", "--ips", "5", "--users", "10", "--interfaces", "2",
				"--concurrency", "4", "--batch", "10", "--warmup", "-1s", "--duration", "30s", "--max-ops", "500", "--quiet",
				"--json", filepath.Join(t.TempDir(), "r.json")}, &out, &errb)
			if err != nil {
				t.Fatalf("%v\n%s\n%s", err, out.String(), errb.String())
			}
			for _, want := range []string{"api workload:", "rules (" + alg + ")", "(app, ip):", "0 over-admitted of", "checks/s"} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestBenchAPIUsage(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte("domains:\n  - name: default\n    rules:\n      - {name: r, scope: recipient, limit: 1, window: 1s}\n"), 0o644)
	borrowing := filepath.Join(t.TempDir(), "borrow.yaml")
	os.WriteFile(borrowing, []byte("domains:\n  - name: api-ip\n    rules:\n      - {name: i, algorithm: fixed-window, limit: 10, window: 1h, borrow: 5}\n"+
		"  - name: api-user\n    rules:\n      - {name: u, algorithm: fixed-window, limit: 5, window: 1h}\n"), 0o644)
	for _, args := range [][]string{
		{"--workload", "api", "--rules", borrowing, "--target", "redis"},
		{"--workload", "nope"},
		{"--workload", "api", "--algorithm", "sliding-log"},
		{"--workload", "api", "--algorithm", "gcra", "--target", "redis"},
		{"--workload", "api", "--target", "redis-per-rule"},
		{"--workload", "api", "--rate", "100"},
		{"--workload", "api", "--rules", rules},
	} {
		var out strings.Builder
		err := benchCmd(context.Background(), args, &out, &out)
		if !errors.As(err, new(usageError)) {
			t.Fatalf("%v: %v, want a usage error", args, err)
		}
	}
}
