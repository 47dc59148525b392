package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// tenPerHour is one domain with one rule: 10 sends per recipient per hour.
const tenPerHour = `domains:
  - name: default
    rules:
      - {name: ten-per-hour, scope: recipient, limit: 10, window: 1h}
`

// moveCluster starts size nodes on rules, with the system clock.
func moveCluster(t *testing.T, size int, rulesYAML string, inMemory bool, dataDir string) *nodetest.Cluster {
	t.Helper()
	rs, err := rules.Parse("test", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: size, Rules: rs, InMemory: inMemory, DataDir: dataDir,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sender sends through random running nodes of a cluster as a client
// would: an item that fails as retryable is sent again, with the same
// request id, until it is decided.
type sender struct {
	c      *nodetest.Cluster
	mu     sync.Mutex // guards rng
	rng    *rand.Rand
	nextID atomic.Uint64
}

func newSender(c *nodetest.Cluster, seed uint64) *sender {
	return &sender{c: c, rng: rand.New(rand.NewPCG(seed, 7))}
}

// send checks-and-records one send to rcp and reports whether it was
// admitted. It fails the test on a non-retryable error or after 20 s.
func (s *sender) send(t testing.TB, rcp string, mode pb.Mode) (admitted bool, used uint32) {
	id := s.nextID.Add(1)
	deadline := time.Now().Add(20 * time.Second)
	for attempt := 0; ; attempt++ {
		up := s.c.Up()
		s.mu.Lock()
		m := up[s.rng.IntN(len(up))]
		s.mu.Unlock()
		req := &pb.CheckRequest{Recipients: []string{rcp}, Modes: []pb.Mode{mode}}
		if mode != pb.Mode_MODE_PEEK {
			req.RequestIds = []uint64{id}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := m.Node.Check(ctx, req)
		cancel()
		retry := err != nil
		if err == nil && len(resp.Errors) > 0 {
			if codes.Code(resp.Errors[0].Code) != codes.Unavailable && codes.Code(resp.Errors[0].Code) != codes.DeadlineExceeded {
				t.Fatalf("%s via %s: %v", rcp, m.Name, resp.Errors[0])
			}
			retry = true
		}
		if !retry {
			return resp.Admitted[0], resp.Used[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no decision in 20 s (%d attempts): %v %v", rcp, attempt, err, resp.GetErrors())
		}
	}
}

// TestRollingRestartKeepsCounts spends 4 of 10 per recipient, restarts
// every node in turn (a graceful stop, then a start with an empty memory),
// and then gets exactly 6 more per recipient: history moved with ownership.
func TestRollingRestartKeepsCounts(t *testing.T) {
	for _, inMemory := range []bool{true, false} {
		t.Run(map[bool]string{false: "grpc", true: "in-memory"}[inMemory], func(t *testing.T) {
			c := moveCluster(t, 3, tenPerHour, inMemory, "")
			s := newSender(c, 1)
			var rcps []string
			for i := range 300 {
				rcps = append(rcps, fmt.Sprintf("+86139%08d", i))
			}
			for _, r := range rcps {
				for k := range 4 {
					if ok, _ := s.send(t, r, pb.Mode_MODE_CHECK_AND_RECORD); !ok {
						t.Fatalf("%s: send %d of the first 4 denied", r, k+1)
					}
				}
			}
			for _, m := range c.Members() {
				if err := c.Stop(m); err != nil {
					t.Fatal(err)
				}
				if err := c.Restart(context.Background(), m); err != nil {
					t.Fatal(err)
				}
				if err := c.WaitConverged(context.Background(), 3); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range rcps {
				if _, used := s.send(t, r, pb.Mode_MODE_PEEK); used != 4 {
					t.Fatalf("%s: after the rolling restart the cluster counts %d sends, want 4", r, used)
				}
				admitted := 0
				for range 10 {
					if ok, _ := s.send(t, r, pb.Mode_MODE_CHECK_AND_RECORD); ok {
						admitted++
					}
				}
				if admitted != 6 {
					t.Fatalf("%s: %d more admitted after the rolling restart, want 6", r, admitted)
				}
			}
		})
	}
}
