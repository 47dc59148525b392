package node_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/testcert"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/wal"
)

// BenchmarkGRPCCheck measures decisions/s and call latency of one node on
// 127.0.0.1 under the load of docs/benchmarks.md: batches of 100 items of the default
// rules, recipients uniform over 1M, content from 16 templates, 64
// concurrent callers over 4 connections, load generator in the same process.
//
//	go test -run '^$' -bench 'GRPCCheck$' -benchtime 300000x ./node
func BenchmarkGRPCCheck(b *testing.B) { benchGRPC(b, node.Config{}) }

// BenchmarkGRPCCheckWAL is BenchmarkGRPCCheck without and with the
// write-ahead log under each sync policy, in one run, and under batch with
// fsync(2) in place of io_uring (batch-plain-fsync). Beside decisions/s it
// reports the appends per group commit, fsyncs/s, their mean wall time
// (fsync-µs) and the share of the run the machine's CPUs were idle
// (cpu-idle-%, from /proc/stat): where the closed loop waits on fsyncs.
//
//	go test -run '^$' -bench 'GRPCCheckWAL' -benchtime 100000x ./node
func BenchmarkGRPCCheckWAL(b *testing.B) {
	for _, tc := range []struct {
		name  string
		wal   bool
		sync  wal.SyncPolicy
		plain bool
	}{
		{"off", false, 0, false},
		{"batch", true, wal.SyncBatch, false},
		{"batch-plain-fsync", true, wal.SyncBatch, true},
		{"interval", true, wal.SyncInterval, false},
		{"none", true, wal.SyncNone, false},
	} {
		b.Run("wal="+tc.name, func(b *testing.B) {
			cfg := node.Config{Sync: tc.sync, PlainFsync: tc.plain}
			if tc.wal {
				cfg.DataDir = b.TempDir()
			}
			benchGRPC(b, cfg)
		})
	}
}

// BenchmarkGRPCCheckTLS is BenchmarkGRPCCheck in plaintext, over TLS, and
// over TLS with a verified client certificate (mTLS), in one run; the
// certificates are ECDSA P-256, made in the test. Repeat whole runs (not
// -count, which runs one variant's repeats back to back) so that a shared
// machine's load changes hit all three alike:
//
//	for i in 1 2 3; do go test -run '^$' -bench 'GRPCCheckTLS' -benchtime 100000x ./node; done
func BenchmarkGRPCCheckTLS(b *testing.B) {
	ca := testcert.NewCA(b, "bench CA")
	srv, cli := ca.Issue(b, "node"), ca.Issue(b, "client")
	for _, tc := range []struct {
		name string
		auth tls.ClientAuthType
		cert bool
	}{{"off", 0, false}, {"tls", tls.NoClientCert, false}, {"mtls", tls.RequireAndVerifyClientCert, true}} {
		b.Run("tls="+tc.name, func(b *testing.B) {
			if tc.name == "off" {
				benchGRPC(b, node.Config{})
				return
			}
			cfg := node.Config{TLS: &tls.Config{Certificates: []tls.Certificate{srv.Cert}, ClientCAs: ca.Pool(),
				ClientAuth: tc.auth, MinVersion: tls.VersionTLS12}}
			ctls := &tls.Config{RootCAs: ca.Pool()}
			if tc.cert {
				ctls.Certificates = []tls.Certificate{cli.Cert}
			}
			benchGRPCWith(b, cfg, grpc.WithTransportCredentials(credentials.NewTLS(ctls)))
		})
	}
}

// benchStream sends the benchmarks' batches as requests on one CheckStream
// per caller instead of unary Checks: FREQRING_BENCH_STREAM=1.
var benchStream = os.Getenv("FREQRING_BENCH_STREAM") == "1"

func benchGRPC(b *testing.B, cfg node.Config) {
	benchGRPCWith(b, cfg, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// benchGRPCWith runs the load of BenchmarkGRPCCheck on a node of cfg,
// dialling it with creds.
func benchGRPCWith(b *testing.B, cfg node.Config, creds grpc.DialOption) {
	const (
		batch      = 100
		callers    = 64
		conns      = 4
		recipients = 1_000_000
	)
	n, err := node.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, lis) }()
	defer func() { cancel(); <-served }()
	var clients []pb.LimiterClient
	for range conns {
		conn, err := grpc.NewClient(lis.Addr().String(), creds)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, pb.NewLimiterClient(conn))
	}
	templates := make([]uint64, 16)
	for i := range templates {
		templates[i] = node.ContentHash(fmt.Appendf(nil, "template %d: your code is ####", i))
	}

	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := nodetest.WaitServingWith(wctx, lis.Addr().String(), creds); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(callers / 2) // 64 goroutines on the 2 Ps of this machine
	b.ResetTimer()
	start := time.Now()
	idle0, total0, cpuOK := cpuJiffies()
	var next sync.Mutex
	seed := uint64(0)
	b.RunParallel(func(pb_ *testing.PB) {
		next.Lock()
		seed++
		rng := rand.New(rand.NewPCG(seed, 1))
		cli := clients[seed%conns]
		next.Unlock()
		req := &pb.CheckRequest{Recipients: make([]string, batch), ContentHashes: make([]uint64, batch)}
		var mine []time.Duration
		var stream pb.Limiter_CheckStreamClient
		if benchStream {
			var err error
			if stream, err = cli.CheckStream(ctx); err != nil {
				b.Error(err)
				return
			}
			defer stream.CloseSend()
		}
		for pb_.Next() {
			for i := range batch {
				req.Recipients[i] = fmt.Sprintf("+86%011d", rng.IntN(recipients))
				req.ContentHashes[i] = templates[rng.IntN(len(templates))]
			}
			t := time.Now()
			var resp *pb.CheckResponse
			var err error
			if stream != nil {
				req.StreamId++
				if err = stream.Send(req); err == nil {
					resp, err = stream.Recv()
				}
			} else {
				resp, err = cli.Check(context.Background(), req)
			}
			mine = append(mine, time.Since(t))
			if err != nil || len(resp.Errors) > 0 || resp.Failed != nil {
				b.Error(err, resp.GetErrors(), resp.GetFailed())
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	idle1, total1, cpuOK1 := cpuJiffies()
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	s := n.Stats()
	b.ReportMetric(float64(s.Denied)/float64(s.Checks)*100, "denied-%")
	if s.WAL.Batches > 0 {
		b.ReportMetric(float64(s.WAL.Appends)/float64(s.WAL.Batches), "wal-appends/batch")
	}
	if cpuOK && cpuOK1 && total1 > total0 {
		b.ReportMetric(float64(idle1-idle0)/float64(total1-total0)*100, "cpu-idle-%")
	}
	if s.WAL.Fsyncs > 0 {
		b.ReportMetric(float64(s.WAL.FsyncNanos)/float64(s.WAL.Fsyncs)/1e3, "fsync-µs")
		b.ReportMetric(float64(s.WAL.Fsyncs)/elapsed.Seconds(), "fsyncs/s")
	}
}

// cpuJiffies reads the machine's idle (idle and iowait) and total CPU time
// from /proc/stat's first line, in clock ticks; ok is false where there is
// none. The benchmarks report the idle share of the run: a closed loop
// whose callers wait (for an fsync, say) leaves the CPUs idle.
func cpuJiffies() (idle, total int64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, x := range f[1:9] { // user to steal; guest time is already in user
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total, true
}
