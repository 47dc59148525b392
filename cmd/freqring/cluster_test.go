package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/freeport"
)

// buildBinary builds cmd/freqring into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "freqring")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		port, err := freeport.TCPAndUDP()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ports, port) {
			ports = append(ports, port)
		}
	}
	return ports
}

// watchMembers blocks until the node at addr reports a ring of want members,
// through its WatchRing stream.
func watchMembers(t *testing.T, addr string, want int, timeout time.Duration) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for ctx.Err() == nil {
		w, err := pb.NewLimiterClient(conn).WatchRing(ctx, &pb.RingRequest{}, grpc.WaitForReady(true))
		if err != nil {
			continue
		}
		for {
			r, err := w.Recv()
			if err != nil {
				break
			}
			if len(r.Members) == want {
				return
			}
		}
	}
	t.Fatalf("%s did not see a ring of %d members within %v", addr, want, timeout)
}

// threeNodes is three `freqring serve` processes on 127.0.0.1.
type threeNodes struct {
	procs []*exec.Cmd
	logs  []*bytes.Buffer
	addrs []string // gRPC
	clis  []pb.LimiterClient
}

// startThree starts three nodes of bin, joined, and waits until each sees
// a ring of three; t's cleanup kills them (and logs them if t failed).
func startThree(t *testing.T, bin string) *threeNodes {
	ports := freePorts(t, 6)
	keys := writeClusterKeys(t)
	c := &threeNodes{}
	t.Cleanup(func() {
		for i, p := range c.procs {
			p.Process.Kill()
			p.Wait()
			if t.Failed() {
				t.Logf("node %d log:\n%s", i, c.logs[i])
			}
		}
	})
	for i := range 3 {
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		args := []string{"serve", "--name", fmt.Sprintf("n%d", i), "--listen", c.addrs[i], "--admin-listen", "off",
			"--gossip", fmt.Sprintf("127.0.0.1:%d", ports[3+i]), "--data-dir", filepath.Join(t.TempDir(), "data"), "--cluster-keys", keys}
		if i > 0 {
			args = append(args, "--join", fmt.Sprintf("127.0.0.1:%d", ports[3]))
		}
		cmd := exec.Command(bin, args...)
		var log bytes.Buffer
		cmd.Stderr = &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c.procs, c.logs = append(c.procs, cmd), append(c.logs, &log)
		if i == 0 {
			watchMembers(t, c.addrs[0], 1, 20*time.Second)
		}
		conn, err := grpc.NewClient(c.addrs[i], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.clis = append(c.clis, pb.NewLimiterClient(conn))
	}
	for i := range 3 {
		watchMembers(t, c.addrs[i], 3, 20*time.Second)
	}
	return c
}

// TestThreeProcesses runs the real binary as three processes on 127.0.0.1,
// joined by the command line: they agree on one ring, route checks to
// owners, and a SIGTERM makes a node leave cleanly while the others go on.
func TestThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts processes")
	}
	c := startThree(t, buildBinary(t))
	procs, logs := c.procs, c.logs
	grpcAddr := func(i int) string { return c.addrs[i] }

	var rcps []string
	for i := range 60 {
		rcps = append(rcps, fmt.Sprintf("+86137%08d", i))
	}
	code, out, errOut := runCmd(context.Background(), "check", "--addr", grpcAddr(1), "--json", strings.Join(rcps[:1], ""))
	if code != 0 || !strings.Contains(out, `"admitted":true`) {
		t.Fatalf("check: exit %d %s %s", code, out, errOut)
	}
	code, out, errOut = runCmd(context.Background(), append([]string{"check", "--addr", grpcAddr(1)}, rcps...)...)
	if code != 0 || strings.Count(out, "ADMITTED") != 60 {
		t.Fatalf("check of 60 recipients through one node: exit %d, %d admitted\n%s\n%s", code, strings.Count(out, "ADMITTED"), errOut, out)
	}
	code, out, _ = runCmd(context.Background(), "status", "--addr", grpcAddr(2))
	if code != 0 || strings.Count(out, "serving  true") != 3 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	t.Logf("status:\n%s", out)
	if !strings.Contains(out, "n1") {
		t.Fatal("status does not list n1")
	}

	// SIGTERM n2: it leaves, exits 0, and the others keep answering.
	procs[2].Process.Signal(syscall.SIGTERM)
	if err := procs[2].Wait(); err != nil {
		t.Fatalf("n2 after SIGTERM: %v\n%s", err, logs[2])
	}
	watchMembers(t, grpcAddr(0), 2, 20*time.Second)
	watchMembers(t, grpcAddr(1), 2, 20*time.Second)
	code, out, _ = runCmd(context.Background(), append([]string{"check", "--addr", grpcAddr(0), "--mode", "peek"}, rcps...)...)
	if code != 0 || strings.Contains(out, "FAILED") {
		t.Fatalf("check after n2 left: exit %d\n%s", code, out)
	}
	for i := range 2 {
		procs[i].Process.Signal(syscall.SIGTERM)
		if err := procs[i].Wait(); err != nil {
			t.Fatalf("n%d after SIGTERM: %v\n%s", i, err, logs[i])
		}
	}
	if !strings.Contains(logs[0].String(), "msg=stopped") {
		t.Fatalf("n0 did not log a clean stop:\n%s", logs[0])
	}
}
