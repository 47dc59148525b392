package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestStatsSumsCluster checks items through a 3-node cluster over gRPC and
// requires `freqring stats --json` to print their sums per domain.
func TestStatsSumsCluster(t *testing.T) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var admitted, denied int64
	recipients := map[string]bool{}
	for i := range 60 {
		req := &pb.CheckRequest{ContentHashes: []uint64{9}}
		for k := range 10 {
			rcp := fmt.Sprintf("+86139%08d", (i*10+k)%97)
			req.Recipients = append(req.Recipients, rcp)
			recipients[rcp] = true
		}
		resp, err := c.Members()[i%3].Node.Check(ctx, req)
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("check: %v %v", err, resp.GetErrors())
		}
		for _, a := range resp.Admitted {
			if a {
				admitted++
			} else {
				denied++
			}
		}
	}
	code, out, errOut := runCmd(ctx, "stats", "--addr", c.Addrs()[0], "--json")
	if code != 0 {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	var rows []statsRow
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r statsRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		rows = append(rows, r)
	}
	if len(rows) != 1 { // one domain, one day (the test does not start at 23:59:59 UTC... almost always)
		t.Skipf("%d rows: the test ran across midnight", len(rows))
	}
	r := rows[0]
	if r.Domain != "default" || r.Admitted != admitted || r.Denied != denied || r.Members != 3 ||
		math.Abs(float64(r.Recipients-int64(len(recipients)))) > float64(3*r.RecipientsStdError+1) || r.DeniedBy["content-59s"] == 0 {
		t.Fatalf("stats %+v; checked %d admitted, %d denied, %d recipients", r, admitted, denied, len(recipients))
	}
	if code, out, _ := runCmd(ctx, "stats", "--addr", c.Addrs()[0]); code != 0 || !strings.Contains(out, fmt.Sprintf("%d ±1", r.Recipients)) ||
		!strings.Contains(out, fmt.Sprintf("content-59s %d", denied)) {
		t.Fatalf("table: exit %d\n%s", code, out)
	}
}

// fakeLimiter serves a Ring of itself and of a member that is not there,
// and a Usage answer of one day.
type fakeLimiter struct {
	pb.UnimplementedLimiterServer
	self, gone string
}

func (f *fakeLimiter) Ring(context.Context, *pb.RingRequest) (*pb.RingResponse, error) {
	return &pb.RingResponse{Node: "a", Members: []*pb.Member{{Name: "a", Addr: f.self}, {Name: "b", Addr: f.gone}}}, nil
}

func (f *fakeLimiter) Usage(context.Context, *pb.UsageRequest) (*pb.UsageResponse, error) {
	return &pb.UsageResponse{Node: "a", Zone: "UTC", Days: []*pb.UsageDay{{Date: "2026-11-21", Domain: "default", Admitted: 5, Denied: 2,
		Rules: []*pb.UsageRule{{Name: "recipient-1m", Denied: 2}}, RecipientsSketch: []byte{14, 0, 0, 0}}}}, nil
}

// TestStatsNamesSilentMembers prints what the members that answered said,
// names the one that did not, and exits 1.
func TestStatsNamesSilentMembers(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := freePort(t) // nothing listens there
	srv := grpc.NewServer()
	pb.RegisterLimiterServer(srv, &fakeLimiter{self: lis.Addr().String(), gone: gone})
	go srv.Serve(lis)
	defer srv.Stop()
	code, out, errOut := runCmd(context.Background(), "stats", "--addr", lis.Addr().String(), "--timeout", "2s")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(out, "2026-11-21") || !strings.Contains(out, "recipient-1m 2") || !strings.Contains(out, "1 of 2 members") {
		t.Fatalf("output lacks the answered member's day:\n%s", out)
	}
	if !strings.Contains(errOut, "1 of 2 members did not answer") || !strings.Contains(errOut, "b ("+gone+")") {
		t.Fatalf("stderr does not name the silent member:\n%s", errOut)
	}
}

func TestStatsFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"stats", "--days", "0"}, {"stats", "--zone", "mars"}, {"stats", "extra"}} {
		if code, _, _ := runCmd(context.Background(), args...); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut := runCmd(context.Background(), "serve", "--stats-timezone", "Nowhere/Atlantis", "--listen", "127.0.0.1:0"); code != 2 || !strings.Contains(errOut, "Nowhere/Atlantis") {
		t.Errorf("serve --stats-timezone Nowhere/Atlantis: exit %d, %s", code, errOut)
	}
	if code, _, errOut := runCmd(context.Background(), "serve", "--stats-days", "0", "--listen", "127.0.0.1:0"); code != 2 || !strings.Contains(errOut, "--stats-days 0") {
		t.Errorf("serve --stats-days 0: exit %d, %s", code, errOut)
	}
}
