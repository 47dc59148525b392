package nodetest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/node"
)

// TestStartReportsAFailedServe: a node whose gossip port is taken fails in
// Open, and Start says so at once ("stopped before serving" with the
// cause), not as a dial error when StartTimeout ends.
func TestStartReportsAFailedServe(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	const timeout = time.Minute
	start := time.Now()
	_, err = Start(context.Background(), Config{Size: 1, StartTimeout: timeout, Node: func(cfg *node.Config) {
		cfg.Cluster.BindPort = port
	}})
	if err == nil || !strings.Contains(err.Error(), "stopped before serving") {
		t.Fatalf("Start with the gossip port taken: %v; want the Serve error", err)
	}
	if elapsed := time.Since(start); elapsed >= timeout {
		t.Fatalf("Start took %v, the whole StartTimeout: the failed Serve was not noticed", elapsed)
	}
}
