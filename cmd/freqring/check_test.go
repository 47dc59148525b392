package main

import (
	"bytes"
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
