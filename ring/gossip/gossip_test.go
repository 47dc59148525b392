package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/freqring/freqring/ring"
)

// testLog sends slog records to t.Log until the test's cleanups have run;
// memberlist goroutines may still log a line after Close returns.
type testLog struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func newTestLogger(t testing.TB) *slog.Logger {
	w := &testLog{t: t}
	t.Cleanup(func() { // registered first, so it runs after every Close
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testConfig is the default timing (what production runs) on 127.0.0.1 with
// an OS-chosen port, except for a short DeadNodeReclaimTime so a crashed
// node's name can come back at once. Members start serving, so that they
// are in the ring (TestCluster also covers StateJoining).
func testConfig(log *slog.Logger, name string, seeds ...string) Config {
	return Config{
		State:               StateServing,
		NodeName:            name,
		BindAddr:            "127.0.0.1",
		GRPCAddr:            fmt.Sprintf("127.0.0.1:%d", 9000+int(name[len(name)-1])),
		Join:                seeds,
		Logger:              log,
		DeadNodeReclaimTime: 200 * time.Millisecond,
	}
}

func start(t *testing.T, cfg Config) *Membership {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start(%s): %v", cfg.NodeName, err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// wait5s returns a context that ends in 5s (or with the test).
func wait5s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it returns nil and returns how long that took,
// or fails the test with cond's last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	begin := time.Now()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return time.Since(begin)
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s: not done after %v: %v", what, timeout, err)
		case <-tick.C:
		}
	}
}

// converged reports whether every membership in ms has a ring of exactly the
// named members, all with the same epoch.
func converged(ms []*Membership, names ...string) func() error {
	slices.Sort(names)
	return func() error {
		var epoch uint64
		for i, m := range ms {
			r := m.Ring()
			var got []string
			for _, x := range r.Members() {
				got = append(got, x.Name)
			}
			if !slices.Equal(got, names) {
				return fmt.Errorf("%s has ring %v, want %v", m.Name(), got, names)
			}
			if i > 0 && r.Epoch() != epoch {
				return fmt.Errorf("%s has epoch %016x, %s has %016x", m.Name(), r.Epoch(), ms[0].Name(), epoch)
			}
			epoch = r.Epoch()
		}
		return nil
	}
}

func member(m *Membership, name string) (MemberState, bool) {
	for _, s := range m.Members() {
		if s.Name == name {
			return s, true
		}
	}
	return MemberState{}, false
}

// TestCluster runs three members through join, graceful leave, rejoin, crash,
// restart under the same name and a state change, with the default timings,
// and logs how long each step took to converge.
func TestCluster(t *testing.T) {
	log := newTestLogger(t)
	a := start(t, testConfig(log, "node-a"))
	_, port, _ := net.SplitHostPort(a.GossipAddr())
	b := start(t, testConfig(log, "node-b", a.GossipAddr()))
	// "localhost" resolves to 127.0.0.1 and often ::1 as well: Join must try
	// every address and succeed when one answers.
	c := start(t, testConfig(log, "node-c", net.JoinHostPort("localhost", port)))

	watch, cancel := a.Watch()
	defer cancel()
	d := eventually(t, 10*time.Second, "three members converge", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))
	t.Logf("3 members converged %v after the last Start", d)
	want := a.Ring().Epoch()
	eventually(t, time.Second, "watch delivers the converged ring", func() error {
		select {
		case r := <-watch:
			if r.Epoch() == want {
				return nil
			}
			return fmt.Errorf("watch gave epoch %016x, want %016x", r.Epoch(), want)
		default:
			return errors.New("nothing on the watch channel")
		}
	})
	r := a.Ring()
	if got := r.Config(); got != (ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}) {
		t.Fatalf("ring config %+v, want the defaults", got)
	}
	for _, x := range r.Members() {
		s, ok := member(a, x.Name)
		if !ok || x.Addr != s.GRPCAddr || s.State != StateServing || s.Boot == 0 {
			t.Fatalf("ring member %+v, gossip member %+v (found %v)", x, s, ok)
		}
	}

	// Graceful leave: peers drop the member as soon as the leave message arrives.
	begin := time.Now()
	if err := c.Leave(wait5s(t)); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	eventually(t, 5*time.Second, "peers drop the member that left", converged([]*Membership{a, b}, "node-a", "node-b"))
	t.Logf("after Leave: 2 members converged %v after Leave began", time.Since(begin))

	// A left member may come back under its name at once, from a new port.
	begin = time.Now()
	c = start(t, testConfig(log, "node-c", a.GossipAddr()))
	eventually(t, 10*time.Second, "the member that left rejoins", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))
	t.Logf("rejoin after leave: 3 members converged %v after Start began", time.Since(begin))

	// Crash: no leave message; peers must detect the failure.
	oldB, _ := member(a, "node-b")
	begin = time.Now()
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	eventually(t, 15*time.Second, "peers drop the crashed member", converged([]*Membership{a, c}, "node-a", "node-c"))
	t.Logf("after crash: failure detected and 2 members converged %v after Close", time.Since(begin))

	// Restart under the same name from a new address: allowed once the old
	// member has been dead for DeadNodeReclaimTime.
	begin = time.Now()
	b = start(t, testConfig(log, "node-b", c.GossipAddr()))
	eventually(t, 10*time.Second, "the crashed member rejoins under its name", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))
	t.Logf("restart after crash: 3 members converged %v after Start began", time.Since(begin))
	newB, _ := member(a, "node-b")
	if newB.Boot == oldB.Boot || newB.GossipAddr == oldB.GossipAddr {
		t.Fatalf("restarted member: before %+v, after %+v; want a new Boot and address", oldB, newB)
	}

	// A joining member is a member, not in the ring, until it serves.
	if err := b.SetState(wait5s(t), StateJoining); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "a joining member is out of the ring", converged([]*Membership{a, b, c}, "node-a", "node-c"))
	if err := b.SetState(wait5s(t), StateServing); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "a serving member is in the ring", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))

	// A leaving member drops out of the ring but stays in Members.
	begin = time.Now()
	if err := b.SetState(wait5s(t), StateLeaving); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "a leaving member drops out of the ring", converged([]*Membership{a, b, c}, "node-a", "node-c"))
	t.Logf("StateLeaving: rings converged %v after SetState", time.Since(begin))
	if s, ok := member(c, "node-b"); !ok || s.State != StateLeaving {
		t.Fatalf("node-b as c sees it: %+v (found %v), want StateLeaving", s, ok)
	}
	if err := b.SetState(wait5s(t), StateServing); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "a serving member is back in the ring", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))

	// After Close: the last ring stays, the watch channel is closed, calls fail.
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range watch { // drain; the loop ends only if Close closed the channel
	}
	if a.Ring() == nil || a.Ring().Len() == 0 {
		t.Fatal("Ring() after Close lost the last ring")
	}
	if err := a.Leave(wait5s(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Leave after Close: %v, want ErrClosed", err)
	}
	if err := a.SetState(wait5s(t), StateServing); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetState after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRejoinHeals checks the rejoin loop: a member whose seed restarted as a
// cluster of its own (same address, no seeds) merges back with it.
func TestRejoinHeals(t *testing.T) {
	log := newTestLogger(t)
	a := start(t, testConfig(log, "node-a"))
	cfg := testConfig(log, "node-b", a.GossipAddr())
	cfg.RejoinInterval = 100 * time.Millisecond
	b := start(t, cfg)
	eventually(t, 10*time.Second, "two members converge", converged([]*Membership{a, b}, "node-a", "node-b"))

	if err := a.Leave(wait5s(t)); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	eventually(t, 5*time.Second, "b is alone", converged([]*Membership{b}, "node-b"))

	// a comes back on the same port without seeds: two clusters of one.
	cfg = testConfig(log, "node-a")
	_, port, _ := net.SplitHostPort(a.GossipAddr())
	fmt.Sscan(port, &cfg.BindPort)
	a = start(t, cfg)
	d := eventually(t, 5*time.Second, "the rejoin loop merges the clusters", converged([]*Membership{a, b}, "node-a", "node-b"))
	t.Logf("merged %v after the seed came back (RejoinInterval %v)", d, b.cfg.RejoinInterval)
}

func TestSingleNode(t *testing.T) {
	m := start(t, testConfig(newTestLogger(t), "node-1"))
	r := m.Ring()
	if r.Len() != 1 || r.Epoch() == 0 || r.OwnerString("+8613800138000").Name != "node-1" {
		t.Fatalf("ring of one: len %d, epoch %x", r.Len(), r.Epoch())
	}
	w, cancel := m.Watch()
	if got := <-w; got != r {
		t.Fatalf("Watch gave %p first, want the current ring %p", got, r)
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-w; ok {
		t.Fatal("channel still open after cancel")
	}
	if err := m.SetState(t.Context(), State(9)); err == nil {
		t.Fatal("SetState(9) succeeded")
	}
	// Alone, Leave and SetState do not wait for a peer.
	if err := m.SetState(t.Context(), StateServing); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	if err := m.Leave(t.Context()); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := m.SetState(t.Context(), StateServing); !errors.Is(err, ErrLeft) {
		t.Fatalf("SetState after Leave: %v, want ErrLeft", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	w, _ = m.Watch()
	if got, ok := <-w; !ok || got == nil {
		t.Fatal("Watch after Close: want the last ring, then a closed channel")
	}
	if _, ok := <-w; ok {
		t.Fatal("Watch after Close: channel open")
	}
}

func TestStartGivesUpWithContext(t *testing.T) {
	// A port nobody listens on: take one, then free it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	begin := time.Now()
	m, err := Start(ctx, testConfig(newTestLogger(t), "node-1", dead))
	if err == nil {
		m.Close()
		t.Fatal("Start joined a seed that does not exist")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), dead) {
		t.Fatalf("Start: %v, want DeadlineExceeded naming %s", err, dead)
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Fatalf("Start took %v to give up, want about the 500ms deadline", d)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{NodeName: "n", GRPCAddr: "127.0.0.1:9000"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" means valid
	}{
		{"minimal", func(*Config) {}, ""},
		{"no grpc addr", func(c *Config) { c.GRPCAddr = "" }, `GRPCAddr "" is not host:port`},
		{"grpc addr without port", func(c *Config) { c.GRPCAddr = "10.0.0.1" }, `GRPCAddr "10.0.0.1" is not host:port`},
		{"grpc addr too long", func(c *Config) { c.GRPCAddr = strings.Repeat("h", 300) + ":1" }, "GRPCAddr is 302 bytes, max 255"},
		{"name too long", func(c *Config) { c.NodeName = strings.Repeat("n", 129) }, "is 129 bytes, max 128"},
		{"bind port", func(c *Config) { c.BindPort = 70000 }, "BindPort 70000 out of range [0, 65535]"},
		{"advertise port", func(c *Config) { c.AdvertisePort = -1 }, "AdvertisePort -1 out of range [0, 65535]"},
		{"state", func(c *Config) { c.State = 7 }, "State 7 out of range [1, 3]"},
		{"empty seed", func(c *Config) { c.Join = []string{"a:1", ""} }, "Join[1] is empty"},
		{"negative probe interval", func(c *Config) { c.ProbeInterval = -time.Second }, "ProbeInterval -1s is negative"},
		{"probe timeout over interval", func(c *Config) { c.ProbeTimeout = time.Second }, "ProbeTimeout 1s out of range (0, ProbeInterval 500ms]"},
		{"suspicion", func(c *Config) { c.SuspicionMult = 101 }, "SuspicionMult 101 out of range [1, 100]"},
		{"placement", func(c *Config) { c.Placement.Load = 0.5 }, "Placement: ring: Load 0.5 out of range [1, 10]"},
		{"negative reclaim means never", func(c *Config) { c.DeadNodeReclaimTime = -1 }, ""},
		{"negative rejoin disables", func(c *Config) { c.RejoinInterval = -1 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			cfg, err := cfg.withDefaults()
			if err == nil {
				err = cfg.validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("validate: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestLogWriter(t *testing.T) {
	var sb strings.Builder
	w := &logWriter{log: slog.New(slog.NewTextHandler(&sb, &slog.HandlerOptions{
		Level:       slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return cmpTime(a) },
	}))}
	for _, line := range []string{
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:1\n",
		"[INFO] memberlist: Marking node-b as failed\n",
		"[WARN] memberlist: Was able to connect to x over TCP but UDP probes failed\n",
		"[ERR] memberlist: Conflicting address for node-b\n",
		"no level\n",
	} {
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	want := `level=DEBUG msg="Stream connection from=127.0.0.1:1" component=memberlist
level=DEBUG msg="Marking node-b as failed" component=memberlist
level=WARN msg="Was able to connect to x over TCP but UDP probes failed" component=memberlist
level=WARN msg="Conflicting address for node-b" component=memberlist
level=DEBUG msg="no level" component=memberlist
`
	if sb.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", sb.String(), want)
	}
}

func cmpTime(a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// TestDeparted: Departed lists a member that failed while serving, one
// that announced StateLeaving before it left as leaving, and forgets one
// that comes back under its name.
func TestDeparted(t *testing.T) {
	log := newTestLogger(t)
	a := start(t, testConfig(log, "node-a"))
	b := start(t, testConfig(log, "node-b", a.GossipAddr()))
	c := start(t, testConfig(log, "node-c", a.GossipAddr()))
	eventually(t, 10*time.Second, "three members converge", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))

	if err := c.SetState(wait5s(t), StateLeaving); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 10*time.Second, "a sees c leaving", func() error {
		if s, _ := member(a, "node-c"); s.State != StateLeaving {
			return fmt.Errorf("a sees c in state %v", s.State)
		}
		return nil
	})
	if err := c.Leave(wait5s(t)); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	c.Close()
	before := time.Now()
	b.Close() // a crash: no leave
	eventually(t, 20*time.Second, "a sees b gone", converged([]*Membership{a}, "node-a"))
	d := a.Departed()
	if c, ok := d["node-c"]; !ok || !c.Leaving {
		t.Errorf("Departed = %v, want node-c leaving", d)
	}
	if b, ok := d["node-b"]; !ok || b.Leaving || b.At.Before(before) {
		t.Errorf("Departed = %v, want node-b at or after %v", d, before)
	}

	b = start(t, testConfig(log, "node-b", a.GossipAddr()))
	eventually(t, 10*time.Second, "b back", converged([]*Membership{a, b}, "node-a", "node-b"))
	if d := a.Departed(); len(d) != 1 {
		t.Errorf("Departed = %v after b came back, want node-c only", d)
	}
	if got := [3]uint64{a.Departures("node-a"), a.Departures("node-b"), a.Departures("node-c")}; got != [3]uint64{0, 1, 1} {
		t.Errorf("Departures of a, b, c = %v after b came back, want [0 1 1]: they count every departure, and never forget one", got)
	}
}
