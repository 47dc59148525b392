package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/internal/freeport"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// crashRules bind within a fraction of a second, and count every send of the
// test in recipient-24h without saturating it.
const crashRules = `domains:
  - name: default
    rules:
      - {name: r-20-1s, scope: recipient, limit: 20, window: 1s}
      - {name: r-900-24h, scope: recipient, limit: 900, window: 24h}
      - {name: c-3-500ms, scope: recipient+content, limit: 3, window: 500ms}
`

// TestMain runs the crash test's child node when asked to.
func TestMain(m *testing.M) {
	if dir := os.Getenv("FREQRING_CRASH_CHILD_DIR"); dir != "" {
		os.Exit(crashChild(dir, os.Getenv("FREQRING_CRASH_CHILD_ADDR")))
	}
	os.Exit(m.Run())
}

// crashChild serves a durable node until it is killed.
func crashChild(dir, addr string) int {
	rs, err := rules.Parse("crash", []byte(crashRules))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logf, err := os.OpenFile(filepath.Join(dir, "child.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	n, err := node.New(node.Config{Rules: rs, DataDir: dir, SnapshotWALBytes: 32 << 10, SegmentBytes: 16 << 10, Logger: newFileLogger(logf)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := n.Serve(context.Background(), lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestKillNineLosesNothing runs a durable node as a child process, drives
// concurrent checks at it, kills it with SIGKILL at random moments, and
// restarts it on the same data directory, five times. Every send the client
// saw admitted must still count after each restart (none forgotten), none may
// count twice, and replaying them all against the rules must find no window
// above its limit.
func TestKillNineLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	dir := t.TempDir()
	port, err := freeport.TCP() // the child listens on it, restart after restart
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.5, MaxDelay: 200 * time.Millisecond}}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := pb.NewLimiterClient(conn)

	recipients := make([]string, 12)
	for i := range recipients {
		recipients[i] = fmt.Sprintf("+86139%08d", i)
	}
	var (
		mu        sync.Mutex
		admitted  []bench.Send
		acked     = map[string]int{} // per recipient: admitted sends the client saw
		uncertain = map[string]int{} // per recipient: sends of calls that failed (maybe recorded)
	)
	rng := rand.New(rand.NewPCG(1, 1))
	const rounds = 5
	for round := range rounds + 1 {
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), "FREQRING_CRASH_CHILD_DIR="+dir, "FREQRING_CRASH_CHILD_ADDR="+addr)
		child.Stderr = os.Stderr
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		waitServing(t, conn)

		// Whatever the client saw admitted still counts, once.
		resp, err := cli.Check(context.Background(), &pb.CheckRequest{Recipients: recipients, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for i, r := range recipients {
			used := int(resp.Used[i*3+1]) // r-900-24h
			if used < acked[r] || used > acked[r]+uncertain[r] {
				t.Errorf("round %d: %s counts %d sends in 24h; the client saw %d admitted and %d uncertain", round, r, used, acked[r], uncertain[r])
			}
			// What counted is now certain: the uncertain ones were either recorded or not.
			acked[r], uncertain[r] = used, 0
		}
		mu.Unlock()
		if round == rounds {
			child.Process.Kill()
			child.Wait()
			break
		}

		// Load until the kill.
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				wr := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for ctx.Err() == nil {
					req := &pb.CheckRequest{}
					for range 8 {
						req.Recipients = append(req.Recipients, recipients[wr.IntN(len(recipients))])
						req.ContentHashes = append(req.ContentHashes, uint64(1+wr.IntN(3)))
					}
					resp, err := cli.Check(ctx, req)
					mu.Lock()
					if err != nil {
						for _, r := range req.Recipients {
							uncertain[r]++
						}
						mu.Unlock()
						continue
					}
					for i, r := range req.Recipients {
						if resp.Admitted[i] {
							acked[r]++
							admitted = append(admitted, bench.Send{Domain: "default", Recipient: r, Content: req.ContentHashes[i], At: resp.DecidedAtMs[i], Checked: true})
						}
					}
					mu.Unlock()
				}
			})
		}
		// A random moment, counted in admitted sends rather than time, so
		// that a busy machine loads the node as much as an idle one.
		mu.Lock()
		target, deadline := len(admitted)+100+rng.IntN(200), time.Now().Add(time.Minute)
		mu.Unlock()
		for {
			mu.Lock()
			n := len(admitted)
			mu.Unlock()
			if n >= target {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d admitted sends after a minute, want %d", round, n, target)
			}
			time.Sleep(time.Millisecond)
		}
		if err := child.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		child.Wait()
		stop()
		wg.Wait()
	}
	rs, _ := rules.Parse("crash", []byte(crashRules))
	v, err := bench.Audit(map[string][]window.Rule{"default": rs.Domain("default").Rules()}, admitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rounds, %d admitted sends, %d over-admissions", rounds, len(admitted), len(v))
	if len(v) > 0 {
		t.Fatalf("over-admission across restarts: %v", v[0])
	}
	if len(admitted) < 500 {
		t.Fatalf("only %d admitted sends: the test did not load the node", len(admitted))
	}
}

func newFileLogger(f *os.File) *slog.Logger { return slog.New(slog.NewTextHandler(f, nil)) }

// waitServing blocks until the node at conn reports SERVING, through the
// health Watch stream (no polling loop of our own).
func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		for {
			r, err := w.Recv()
			if err != nil {
				break // the old child's connection broke: watch again
			}
			if r.Status == healthpb.HealthCheckResponse_SERVING {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the child node did not become SERVING in 30 s")
		}
	}
}
