//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/testdisk"
)

// TestReadyzWhileTheWALFails: a serve whose data directory fills up answers
// 503 at /readyz, so that a load balancer moves traffic away, and
// freqring_wal_failed is 1; once space is freed its WAL recovers without a
// restart, /readyz answers 200 again and the recovery is counted.
func TestReadyzWhileTheWALFails(t *testing.T) {
	disk := testdisk.Small(t, 8<<20)
	addr, admin := freePort(t), freePort(t)
	startServe(t, "--listen", addr, "--admin-listen", admin, "--data-dir", filepath.Join(disk, "data"))
	url := "http://" + admin
	c := &http.Client{Timeout: 5 * time.Second}
	waitReady(t, c, url)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lim := pb.NewLimiterClient(conn)

	filler := filepath.Join(disk, "filler")
	testdisk.Fill(t, filler)
	failed := false
	for call := 0; !failed && call < 5000; call++ {
		req := &pb.CheckRequest{}
		for i := range 50 {
			req.Recipients = append(req.Recipients, fmt.Sprintf("+86%09d", call*50+i+1))
		}
		_, err := lim.Check(context.Background(), req)
		if err != nil {
			if grpcstatus.Code(err) != codes.Unavailable {
				t.Fatalf("call %d on a full disk: %v, want UNAVAILABLE", call, err)
			}
			failed = true
		}
	}
	if !failed {
		t.Fatal("the disk never filled up")
	}
	if code, body := get(c, url+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the WAL failed: %d %q, want 503", code, body)
	}
	if code, body := get(c, url+"/livez"); code != http.StatusOK {
		t.Fatalf("/livez with the WAL failed: %d %q, want 200 (restarting does not free space)", code, body)
	}
	metric(t, c, url, `(?m)^freqring_wal_failed 1$`)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, url) // the WAL retries with backoff from 1 s
	metric(t, c, url, `(?m)^freqring_wal_failed 0$`)
	metric(t, c, url, `(?m)^freqring_wal_recoveries_total 1$`)
	if _, err := lim.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"+86000000001"}}); err != nil {
		t.Fatalf("a check after the WAL recovered: %v", err)
	}
}

// metric fails the test unless url/metrics matches pattern.
func metric(t *testing.T, c *http.Client, url, pattern string) {
	t.Helper()
	code, body := get(c, url+"/metrics")
	if code != http.StatusOK || !regexp.MustCompile(pattern).MatchString(body) {
		t.Fatalf("/metrics: %d, want a line matching %s", code, pattern)
	}
}
