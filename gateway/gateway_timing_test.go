package gateway_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// benchGoroutines is the number of callers in flight in each front end's
// benchmark.
const benchGoroutines = 64

// BenchmarkFrontEnds measures one node's three front ends in one run, each
// with 64 goroutines sending single items, check and record, one message to
// each of up to 1,000,000 recipients in turn (admitted, or denied once a
// recipient reaches a limit), client and node in this process on 127.0.0.1:
//
//   - grpc: Limiter.Check over one HTTP/2 connection, as the Go client sends;
//   - http: POST /v1/check over keep-alive HTTP/1.1, a connection per
//     goroutine;
//   - rls: Envoy's ShouldRateLimit with one descriptor over one HTTP/2
//     connection, as Envoy's filter sends.
//
// Each reports decisions/s and the p99 latency of one call.
//
//	go test -run '^$' -bench BenchmarkFrontEnds -benchtime 5s -count 3 ./gateway
func BenchmarkFrontEnds(b *testing.B) {
	b.Run("grpc", func(b *testing.B) {
		f := newRLSFixture(b, testRules)
		measure(b, func(i int64) error {
			resp, err := f.limiter.Check(context.Background(), &pb.CheckRequest{Recipients: []string{benchRecipient(i)}, Contents: [][]byte{[]byte("hi")}})
			if err == nil && len(resp.Errors) > 0 {
				err = status.Error(codes.Code(resp.Errors[0].Code), resp.Errors[0].Message)
			}
			return err
		})
	})
	b.Run("http", func(b *testing.B) {
		f := newFixture(b, false)
		f.srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = benchGoroutines
		url := f.srv.URL + "/v1/check"
		c := f.srv.Client()
		measure(b, func(i int64) error {
			resp, err := c.Post(url, "application/json", strings.NewReader(`{"recipient":"`+benchRecipient(i)+`","content":"hi"}`))
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				return status.Errorf(codes.Unknown, "status %d", resp.StatusCode)
			}
			return nil
		})
	})
	b.Run("rls", func(b *testing.B) {
		f := newRLSFixture(b, testRules)
		measure(b, func(i int64) error {
			resp, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "recipient", Value: benchRecipient(i)}, {Key: "content", Value: "hi"}},
			}}})
			if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
				err = status.Error(codes.Unknown, "overall_code UNKNOWN")
			}
			return err
		})
	})
}

// benchRecipient is the recipient of call i: up to 1,000,000 in turn.
func benchRecipient(i int64) string { return "+86" + strconv.FormatInt(i%1_000_000, 10) }

// measure runs call from benchGoroutines goroutines until b.N calls are
// done and reports decisions/s and the p99 latency of one call, µs.
func measure(b *testing.B, call func(i int64) error) {
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism((benchGoroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t := time.Now()
			if err := call(next.Add(1)); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
