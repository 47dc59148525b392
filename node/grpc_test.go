package node_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// steppingClock advances 40 ms on every reading, so that windows slide many
// times while goroutines race.
type steppingClock struct{ ns atomic.Int64 }

func (c *steppingClock) Now() int64 { return c.ns.Add(40e6) }

const testRules = `domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 15, window: 1m}
      - {name: recipient-24h, scope: recipient, limit: 50, window: 24h}
      - {name: content-59s, scope: recipient+content, limit: 2, window: 59s}
      - {name: content-59m, scope: recipient+content, limit: 5, window: 59m}
  - name: fast
    rules:
      - {name: r-5-300ms, scope: recipient, limit: 5, window: 300ms}
      - {name: r-9-2s, scope: recipient, limit: 9, window: 2s}
      - {name: c-2-500ms, scope: recipient+content, limit: 2, window: 500ms}
`

// startServer serves n over gRPC on 127.0.0.1 and returns a client.
func startServer(t *testing.T, n *node.Node) pb.LimiterClient {
	t.Helper()
	return pb.NewLimiterClient(dialNode(t, serveNode(t, n)))
}

// serveNode serves n on 127.0.0.1 until the test ends, waits until its
// health reports SERVING (asked over opts; plaintext without them) and
// returns its address. Serve's error fails the test.
func serveNode(t *testing.T, n *node.Node, opts ...grpc.DialOption) string {
	t.Helper()
	addr, stop := startNode(t, n, opts...)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr
}

// startNode serves n on 127.0.0.1, waits until its health reports SERVING
// (asked over opts; plaintext without them) and returns its address and
// stop, which ends Serve and returns its result; stop may be called more
// than once, and is called when the test ends.
func startNode(t *testing.T, n *node.Node, opts ...grpc.DialOption) (addr string, stop func() error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, lis) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := nodetest.WaitServingWith(wctx, lis.Addr().String(), opts...); err != nil {
		t.Fatalf("health: %v", err)
	}
	return lis.Addr().String(), stop
}

// dialNode returns a connection to addr, closed when the test ends; without
// opts it is plaintext.
func dialNode(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestConcurrentChecksNeverOverAdmit: 64 goroutines hammer 6 recipients in
// two domains through gRPC while the clock races ahead; replaying every
// admitted send against the rules must find no window above its limit.
func TestConcurrentChecksNeverOverAdmit(t *testing.T) {
	rs, err := rules.Parse("test", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := &steppingClock{}
	clk.ns.Store(1_790_000_000_000 * 1e6)
	n, err := node.New(node.Config{Rules: rs, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	cli := startServer(t, n)

	const workers, batches, size = 64, 40, 12
	var mu sync.Mutex
	var sends []bench.Send
	var denied atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			domain := []string{"default", "fast"}[w%2]
			for b := range batches {
				req := &pb.CheckRequest{Domains: []string{domain}}
				for i := range size {
					req.Recipients = append(req.Recipients, fmt.Sprintf("+8613800000%d", (w+b+i)%6))
					req.ContentHashes = append(req.ContentHashes, uint64((w*b+i)%4)) // 0: no content
					req.Costs = append(req.Costs, uint32(1+(i%5)/4))                 // some cost 2
				}
				resp, err := cli.Check(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				if len(resp.Errors) > 0 {
					t.Errorf("item errors: %v", resp.Errors)
					return
				}
				mu.Lock()
				for i := range size {
					if !resp.Admitted[i] {
						denied.Add(1)
						continue
					}
					sends = append(sends, bench.Send{
						Domain: domain, Recipient: req.Recipients[i], Content: req.ContentHashes[i],
						Cost: int(req.Costs[i]), At: resp.DecidedAtMs[i], Checked: true,
					})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rules := map[string][]window.Rule{}
	for _, name := range rs.Names() {
		rules[name] = rs.Domain(name).Rules()
	}
	v, err := bench.Audit(rules, sends)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d admitted, %d denied, %d over-admitted", len(sends), denied.Load(), len(v))
	if len(v) > 0 {
		t.Fatalf("%d over-admissions, first: %v", len(v), v[0])
	}
	if len(sends) < 1000 || denied.Load() < 1000 {
		t.Fatalf("%d admitted, %d denied: the load does not press the limits", len(sends), denied.Load())
	}
}
