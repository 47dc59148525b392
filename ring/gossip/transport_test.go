package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// mockNet is a memberlist.MockNetwork whose transports (mockTransport) are
// all made before any member starts, so that its maps, which it does not
// lock, are only read while members run.
type mockNet struct {
	net    memberlist.MockNetwork
	byName map[string]*mockTransport
	byAddr map[string]*mockTransport
	stop   chan struct{} // closed by the test's last cleanup: the pumps end
	pumps  sync.WaitGroup
}

// newMockNet returns a network with one transport per name, in order: the
// i-th has the address "127.0.0.1:i+1".
func newMockNet(t *testing.T, names ...string) *mockNet {
	n := &mockNet{byName: map[string]*mockTransport{}, byAddr: map[string]*mockTransport{}, stop: make(chan struct{})}
	// Registered before any start, so it runs after every Close.
	t.Cleanup(func() {
		close(n.stop)
		n.pumps.Wait()
	})
	for _, name := range names {
		mt := &mockTransport{
			MockTransport: n.net.NewTransport(name),
			net:           n,
			packets:       make(chan *memberlist.Packet, 1024),
			streams:       make(chan net.Conn, 64),
			down:          make(chan struct{}),
		}
		mt.addr = mt.address()
		n.byName[name], n.byAddr[mt.addr] = mt, mt
		n.pumps.Go(mt.pumpPackets)
		n.pumps.Go(mt.pumpStreams)
	}
	return n
}

// mockTransport is a memberlist.MockTransport with what a socket has and the
// mock lacks (see the package comment): a pump takes every packet and stream
// at once into a buffer, and after Shutdown drops them, so that no sender
// waits for a busy or closed member. Isolating it cuts it off from every
// other member, both ways, as a network partition would; it still reaches
// itself.
type mockTransport struct {
	*memberlist.MockTransport
	net      *mockNet
	addr     string
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	down     chan struct{} // closed by Shutdown
	downOnce sync.Once
	isolated atomic.Bool
}

var _ memberlist.NodeAwareTransport = (*mockTransport)(nil)

func (t *mockTransport) address() string {
	ip, port, err := t.FinalAdvertiseAddr("", 0)
	if err != nil {
		panic(fmt.Sprintf("BUG: mock transport without an address: %v", err))
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(port))
}

func (t *mockTransport) pumpPackets() {
	for {
		select {
		case <-t.net.stop:
			return
		case p := <-t.MockTransport.PacketCh():
			select {
			case t.packets <- p:
			case <-t.down: // dropped
			case <-t.net.stop:
				return
			}
		}
	}
}

func (t *mockTransport) pumpStreams() {
	for {
		select {
		case <-t.net.stop:
			return
		case c := <-t.MockTransport.StreamCh():
			select {
			case t.streams <- c:
			case <-t.down:
				c.Close() // refused
			case <-t.net.stop:
				c.Close()
				return
			}
		}
	}
}

func (t *mockTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *mockTransport) StreamCh() <-chan net.Conn           { return t.streams }

func (t *mockTransport) Shutdown() error {
	t.downOnce.Do(func() { close(t.down) })
	return nil
}

func (t *mockTransport) isDown() bool {
	select {
	case <-t.down:
		return true
	default:
		return false
	}
}

// cut reports whether a partition lies between t and the member at a.
func (t *mockTransport) cut(a memberlist.Address) bool {
	dest := t.net.byAddr[a.Addr]
	if a.Name != "" {
		dest = t.net.byName[a.Name]
	}
	return dest != t && (t.isolated.Load() || (dest != nil && dest.isolated.Load()))
}

var errPartitioned = errors.New("mock network: partitioned")

func (t *mockTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.cut(a) {
		return time.Now(), nil // lost, as a UDP packet would be
	}
	return t.MockTransport.WriteToAddress(b, a)
}

func (t *mockTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.cut(a) {
		return nil, fmt.Errorf("dial %s: %w", a, errPartitioned)
	}
	return t.MockTransport.DialAddressTimeout(a, timeout)
}

func (t *mockTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *mockTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// mockConfig is testConfig on a transport of n instead of a socket, with a
// short RejoinInterval.
func mockConfig(t *testing.T, n *mockNet, name string, seeds ...string) Config {
	cfg := testConfig(newTestLogger(t), name, seeds...)
	cfg.BindAddr = ""
	cfg.Transport = n.byName[name]
	cfg.RejoinInterval = 50 * time.Millisecond
	return cfg
}

// TestMockNetworkCluster runs three members on one memberlist.MockNetwork
// through Config.Transport: a join, a start cut off from the seed that the
// rejoin loop heals, metadata and a state change, and a Leave.
func TestMockNetworkCluster(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c")
	ta, tc := n.byName["node-a"], n.byName["node-c"]

	a := start(t, mockConfig(t, n, "node-a"))
	if a.GossipAddr() != ta.addr || ta.addr != "127.0.0.1:1" {
		t.Fatalf("GossipAddr %s, transport address %s; want the transport's, 127.0.0.1:1", a.GossipAddr(), ta.addr)
	}
	b := start(t, mockConfig(t, n, "node-b", ta.addr))
	eventually(t, 10*time.Second, "a and b converge", converged([]*Membership{a, b}, "node-a", "node-b"))

	// c starts cut off from its seed a; reaching itself, its other seed, is
	// a start. Once the partition heals, its rejoin loop merges it.
	tc.isolated.Store(true)
	c := start(t, mockConfig(t, n, "node-c", ta.addr, tc.addr))
	if err := converged([]*Membership{c}, "node-c")(); err != nil {
		t.Fatalf("c started cut off: %v", err)
	}
	tc.isolated.Store(false)
	all := []*Membership{a, b, c}
	d := eventually(t, 10*time.Second, "the rejoin loop merges c", converged(all, "node-a", "node-b", "node-c"))
	t.Logf("three members converged %v after the partition healed (RejoinInterval %v)", d, c.cfg.RejoinInterval)

	// Metadata travels over the mock: every member sees every other's.
	for _, m := range all {
		for _, o := range all {
			s, ok := member(m, o.Name())
			if !ok || s.GossipAddr != o.GossipAddr() || s.GRPCAddr != o.cfg.GRPCAddr || s.State != StateServing || s.Boot != o.meta.Boot {
				t.Fatalf("%s sees %s as %+v (found %v), want gossip %s, gRPC %s, serving, boot %x",
					m.Name(), o.Name(), s, ok, o.GossipAddr(), o.cfg.GRPCAddr, o.meta.Boot)
			}
		}
	}
	if err := b.SetState(wait5s(t), StateJoining); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "b leaves the rings while joining", converged(all, "node-a", "node-c"))
	if err := b.SetState(wait5s(t), StateServing); err != nil {
		t.Fatalf("SetState: %v", err)
	}
	eventually(t, 5*time.Second, "b is back in the rings", converged(all, "node-a", "node-b", "node-c"))

	// A Leave, seen by the members that stay.
	if err := c.Leave(wait5s(t)); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	d = eventually(t, 5*time.Second, "a and b see c leave", converged([]*Membership{a, b}, "node-a", "node-b"))
	t.Logf("Leave seen after %v", d)
	for _, m := range []*Membership{a, b} {
		if s, ok := member(m, "node-c"); ok {
			t.Fatalf("%s still lists c after its Leave: %+v", m.Name(), s)
		}
	}

	// The Membership owns its Transport.
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !tc.isDown() {
		t.Fatal("Close did not shut the Transport down")
	}
}

// TestStartFailureShutsTransportDown checks that a Start that fails releases
// the Transport it was given, whether it failed on its config or on its
// seeds.
func TestStartFailureShutsTransportDown(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b")
	ta, tb := n.byName["node-a"], n.byName["node-b"]

	cfg := mockConfig(t, n, "node-a")
	cfg.GRPCAddr = "no port"
	if m, err := Start(t.Context(), cfg); err == nil {
		m.Close()
		t.Fatal("Start with a bad GRPCAddr succeeded")
	}
	if !ta.isDown() {
		t.Fatal("Start failed on its config and left the Transport up")
	}

	tb.isolated.Store(true)
	cfg = mockConfig(t, n, "node-b", "127.0.0.1:1")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if m, err := Start(ctx, cfg); err == nil {
		m.Close()
		t.Fatal("Start reached a seed across a partition")
	} else if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), errPartitioned.Error()) {
		// memberlist's join errors are strings: only the message tells.
		t.Fatalf("Start: %v, want DeadlineExceeded after the partition's dial errors", err)
	}
	if !tb.isDown() {
		t.Fatal("Start failed to join and left the Transport up")
	}
}
