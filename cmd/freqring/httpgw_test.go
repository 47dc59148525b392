package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/internal/testcert"
)

// TestServeHTTPGateway runs serve with --http-listen over TLS (the gRPC
// listener's certificate) and --http-legacy-headers: two identical messages
// are admitted, the third is a 429 from content-59s with Retry-After and
// the rate-limit fields; plaintext gets no answer.
func TestServeHTTPGateway(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "freqring test CA")
	cert, key := ca.Issue(t, "node").Write(t, dir, "node")
	addr, admin, gw := freePort(t), freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--http-listen", gw, "--http-legacy-headers", "--tls-cert", cert, "--tls-key", key)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	waitReady(t, &http.Client{Timeout: 5 * time.Second}, "http://"+admin)
	post := func(c *http.Client, scheme string) (*http.Response, string, error) {
		resp, err := c.Post(scheme+"://"+gw+"/v1/check", "application/json", strings.NewReader(`{"recipient":"+8613800000000","content":"hi"}`))
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	for i, want := range []int{200, 200, 429} {
		resp, body, err := post(c, "https")
		if err != nil || resp.StatusCode != want {
			t.Fatalf("send %d: %v %v %s; want %d", i, resp, err, body, want)
		}
		// The system clock runs here: Retry-After is at most the window, 59 s
		// (the gateway tests check its exact value under a test clock).
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if want == 429 && (ra < 1 || ra > 59 || resp.Header.Get("RateLimit") != `"content-59s";r=0;t=`+strconv.Itoa(ra) ||
			resp.Header.Get("X-RateLimit-Limit") != "2" || !strings.Contains(body, `"denied_by":"content-59s"`)) {
			t.Fatalf("429: %v %s", resp.Header, body)
		}
	}
	if resp, body, err := post(&http.Client{Timeout: 5 * time.Second}, "http"); err == nil && resp.StatusCode == 200 {
		t.Fatalf("plaintext on the TLS HTTP listener answered 200: %s", body)
	}
}
