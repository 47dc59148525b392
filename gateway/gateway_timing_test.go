package gateway_test

import (
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
)

// BenchmarkHTTPCheck measures single-item decisions over keep-alive HTTP/1.1
// through a real node behind an httptest server on 127.0.0.1: 64 goroutines,
// each its own connection, checking and recording one message to each of up
// to 1,000,000 recipients in turn (a 200, or a 429 once a recipient reaches a
// limit). It reports decisions/s and the p99 latency of one request.
//
//	go test -run '^$' -bench BenchmarkHTTPCheck -benchtime 5s ./gateway
func BenchmarkHTTPCheck(b *testing.B) {
	f := newFixture(b, false)
	const goroutines = 64
	f.srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = goroutines
	url := f.srv.URL + "/v1/check"
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		c := f.srv.Client()
		var mine []time.Duration
		for pb.Next() {
			body := `{"recipient":"+86` + strconv.FormatInt(next.Add(1)%1_000_000, 10) + `","content":"hi"}`
			t := time.Now()
			resp, err := c.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mine = append(mine, time.Since(t))
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
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
