package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

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

// TestServeEnvoyRLS runs serve and calls Envoy's ShouldRateLimit on its gRPC
// listener as Envoy does, on the embedded default rules: two identical
// messages are OK, the third OVER_LIMIT from content-59s; with
// --envoy-rls=false the service is not there.
func TestServeEnvoyRLS(t *testing.T) {
	for _, on := range []bool{true, false} {
		addr, admin := freePort(t), freePort(t)
		startServe(t, "--listen", addr, "--admin-listen", admin, "--envoy-rls="+strconv.FormatBool(on))
		waitReady(t, &http.Client{Timeout: 5 * time.Second}, "http://"+admin)
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		rls := rlsv3.NewRateLimitServiceClient(cc)
		req := &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{
			{Key: "recipient", Value: "+8613800000000"}, {Key: "content", Value: "hi"}}}}}
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := rls.ShouldRateLimit(ctx, req)
			cancel()
			if !on {
				if grpcstatus.Code(err) != codes.Unimplemented {
					t.Fatalf("--envoy-rls=false: %v %v; want UNIMPLEMENTED", resp, err)
				}
				break
			}
			if err != nil || resp.OverallCode != want {
				t.Fatalf("call %d: %v %v; want %v", i, resp, err, want)
			}
			if want == rlsv3.RateLimitResponse_OVER_LIMIT && resp.Statuses[0].CurrentLimit.GetName() != "content-59s" {
				t.Fatalf("call %d: %v; want content-59s to bind", i, resp)
			}
		}
	}
}
