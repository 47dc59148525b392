//go:build linux

package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/testdisk"
	"github.com/freqring/freqring/node"
)

// serveDir serves a single node on dir (WAL segments of 256 KiB, no
// snapshot but on shutdown) and returns it, its address and stop, which
// ends Serve and returns its result (startNode).
func serveDir(t *testing.T, dir string) (*node.Node, string, func() error) {
	t.Helper()
	n, err := node.New(node.Config{DataDir: dir, SegmentBytes: 256 << 10, SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := startNode(t, n)
	return n, addr, stop
}

// waitHealth waits, at most 30 s, until the node at addr's gRPC health for
// service says want.
func waitHealth(t *testing.T, addr, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(dialPlain(t, addr)).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health %q of %s did not turn %v: %v", service, addr, want, err)
		}
		if r.Status == want {
			return
		}
	}
}

// TestDiskFullAcknowledgesNothingItLoses: a node whose data directory fills
// up fails the calls whose sends it cannot log, and takes their sends back:
// a retry with the same request id is decided afresh (never answered
// "admitted, duplicate" for a send the WAL lacks), the node reports not
// ready (gRPC health NOT_SERVING, Serving false) while its liveness stays
// SERVING, and it records nothing until the WAL recovers. Once space is
// freed it recovers without a restart, reports ready again and records the
// retries. After a restart it counts exactly the sends it acknowledged.
func TestDiskFullAcknowledgesNothingItLoses(t *testing.T) {
	disk := testdisk.Small(t, 8<<20)
	data := filepath.Join(disk, "data")
	n, addr, stop := serveDir(t, data)
	lim := pb.NewLimiterClient(dialPlain(t, addr))
	ctx := context.Background()

	filler := filepath.Join(disk, "filler")
	testdisk.Fill(t, filler)
	acked := map[string]bool{} // recipient -> its send acknowledged
	var failed []string        // recipients whose call failed for the WAL
	id := func(rcp string) uint64 {
		var x uint64
		fmt.Sscan(strings.TrimPrefix(rcp, "+86"), &x)
		return x
	}
	check := func(rcps []string) (*pb.CheckResponse, error) {
		req := &pb.CheckRequest{Recipients: rcps}
		for _, r := range rcps {
			req.RequestIds = append(req.RequestIds, id(r))
		}
		return lim.Check(ctx, req)
	}
	for call := 0; len(failed) < 200 && call < 5000; call++ {
		var rcps []string
		for i := range 50 {
			rcps = append(rcps, fmt.Sprintf("+86%09d", call*50+i+1))
		}
		resp, err := check(rcps)
		if err != nil {
			if st := statusOf(err); st.code != codes.Unavailable || !strings.Contains(st.msg, "write-ahead log") {
				t.Fatalf("call %d: %v, want UNAVAILABLE for the write-ahead log", call, err)
			}
			failed = append(failed, rcps...)
			continue
		}
		for j, r := range rcps {
			if itemFailed(resp, j) {
				failed = append(failed, r)
			} else if resp.Admitted[j] && resp.Recorded[j] {
				acked[r] = true
			}
		}
	}
	if len(failed) == 0 {
		t.Fatal("the disk never filled up")
	}
	if n.Serving() || !n.Stats().WALFailed {
		t.Fatalf("serving %v, WAL failed %v on a full disk", n.Serving(), n.Stats().WALFailed)
	}
	waitHealth(t, addr, "", healthpb.HealthCheckResponse_NOT_SERVING)
	waitHealth(t, addr, node.LivenessService, healthpb.HealthCheckResponse_SERVING)
	// Retries of failed sends, with their request ids: none is answered as
	// recorded while the WAL has failed.
	retry := failed[:50]
	if resp, err := check(retry); err == nil {
		for j := range retry {
			if !itemFailed(resp, j) || resp.Admitted[j] || len(resp.Duplicates) > 0 {
				t.Fatalf("retry of %s on a failed WAL: admitted %v, duplicates %v, errors %v", retry[j], resp.Admitted[j], resp.Duplicates, resp.Errors)
			}
		}
	}
	// Peeks are still answered.
	if resp, err := lim.Check(ctx, &pb.CheckRequest{Recipients: retry[:1], Modes: []pb.Mode{pb.Mode_MODE_PEEK}}); err != nil || itemFailed(resp, 0) {
		t.Fatalf("peek on a failed WAL: %v %v", err, resp.GetErrors())
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, addr, "", healthpb.HealthCheckResponse_SERVING)
	if st := n.Stats(); st.WALFailed || st.WAL.Recoveries != 1 || st.WAL.Failures != 1 {
		t.Fatalf("after space returned: WAL failed %v, %d failures, %d recoveries", st.WALFailed, st.WAL.Failures, st.WAL.Recoveries)
	}
	for k := 0; k < len(failed); k += 50 {
		rcps := failed[k:min(k+50, len(failed))]
		resp, err := check(rcps)
		if err != nil {
			t.Fatalf("retry after recovery: %v", err)
		}
		for j, r := range rcps {
			if itemFailed(resp, j) || !resp.Admitted[j] || !resp.Recorded[j] {
				t.Fatalf("retry of %s after recovery: admitted %v recorded %v errors %v", r, resp.Admitted[j], resp.Recorded[j], resp.Errors)
			}
			acked[r] = true
		}
		if len(resp.Duplicates) > 0 {
			t.Fatalf("retries after recovery answered as duplicates %v: their first attempts were taken back", resp.Duplicates)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}

	_, addr2, _ := serveDir(t, data)
	lim2 := pb.NewLimiterClient(dialPlain(t, addr2))
	all := make([]string, 0, len(acked))
	for r := range acked {
		all = append(all, r)
	}
	lost, phantom := 0, 0
	for k := 0; k < len(all); k += 500 {
		rcps := all[k:min(k+500, len(all))]
		resp, err := lim2.Check(ctx, &pb.CheckRequest{Recipients: rcps, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil {
			t.Fatal(err)
		}
		off := 0
		for j := range rcps {
			used := resp.Used[off] // recipient-1m
			off += int(resp.RuleCounts[j])
			switch {
			case used == 0:
				lost++
			case used > 1:
				phantom++
			}
		}
	}
	if lost > 0 || phantom > 0 {
		t.Fatalf("after a restart, of %d acknowledged sends %d are lost and %d counted twice", len(all), lost, phantom)
	}
	t.Logf("%d sends acknowledged, %d failed on the full disk and recorded after recovery, none lost", len(all), len(failed))
}

// itemFailed reports whether item j of resp has an error.
func itemFailed(resp *pb.CheckResponse, j int) bool {
	for _, e := range resp.Errors {
		if int(e.Index) == j {
			return true
		}
	}
	return false
}

type statusInfo struct {
	code codes.Code
	msg  string
}

func statusOf(err error) statusInfo {
	s := status.Convert(err)
	return statusInfo{s.Code(), s.Message()}
}
