package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestDownMsgRoundTrip(t *testing.T) {
	for _, d := range []downMsg{{boot: 1<<64 - 1, name: "node-a"}, {}, {boot: 7, name: strings.Repeat("n", 255)}} {
		b := d.append(nil)
		got, err := decodeDownMsg(b)
		if err != nil || got != d {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", d, got, err)
		}
		for n := range len(b) {
			if _, err := decodeDownMsg(b[:n]); !errors.Is(err, errBadMessage) {
				t.Fatalf("decode of %d of %d bytes: %v", n, len(b), err)
			}
		}
	}
}

func FuzzDecodeDownMsg(f *testing.F) {
	f.Add(downMsg{boot: 9, name: "node-c"}.append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDownMsg(b)
		if err != nil {
			return
		}
		if enc := d.append(nil); !bytes.Equal(enc, b) {
			t.Fatalf("decode(%x) = %+v, which encodes to %x", b, d, enc)
		}
	})
}

func TestRefusesTCP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if refusesTCP(addr) {
		t.Fatalf("%s listens, yet refuses", addr)
	}
	lis.Close()
	if !refusesTCP(addr) {
		t.Fatalf("%s closed, yet not refused", addr)
	}
}

// refusals says, per member looking, which gRPC addresses refuse.
type refusals struct {
	mu sync.Mutex
	by map[string]map[string]bool // looker -> address -> refused
}

func (r *refusals) set(looker, addr string, refused bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by[looker] == nil {
		r.by[looker] = map[string]bool{}
	}
	r.by[looker][addr] = refused
}

func (r *refusals) hook(looker string) func(string) bool {
	return func(addr string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.by[looker][addr]
	}
}

// TestSuspectMarksDown: a member whose gRPC address refuses connections is
// out of the ring at once where it refuses (the claim travels, and each
// member looks for itself), and stays in where it does not; memberlist,
// which still sees it alive, changes nothing.
func TestSuspectMarksDown(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c", "node-d")
	ref := &refusals{by: map[string]map[string]bool{}}
	cfg := func(name string, seeds ...string) Config {
		c := mockConfig(t, n, name, seeds...)
		c.Refuses = ref.hook(name)
		return c
	}
	seed := n.byName["node-a"].addr
	a := start(t, cfg("node-a"))
	b := start(t, cfg("node-b", seed))
	c := start(t, cfg("node-c", seed))
	d := start(t, cfg("node-d", seed))
	all := []*Membership{a, b, c, d}
	eventually(t, 10*time.Second, "four converge", converged(all, "node-a", "node-b", "node-c", "node-d"))

	// node-c refuses a and b, not d.
	ca := c.cfg.GRPCAddr
	ref.set("node-a", ca, true)
	ref.set("node-b", ca, true)
	a.Suspect("node-c")
	eventually(t, 5*time.Second, "a and b mark c down", converged([]*Membership{a, b}, "node-a", "node-b", "node-d"))
	for _, m := range []*Membership{a, b} {
		if _, ok := member(m, "node-c"); ok {
			t.Fatalf("%s still lists node-c", m.Name())
		}
		if got := m.Departures("node-c"); got != 1 {
			t.Fatalf("%s counts %d departures of node-c, want 1", m.Name(), got)
		}
		if _, ok := m.Departed()["node-c"]; !ok {
			t.Fatalf("%s: node-c not among the departed", m.Name())
		}
		if _, ok := m.Down()["node-c"]; !ok {
			t.Fatalf("%s: node-c not marked down", m.Name())
		}
	}
	// d, which c does not refuse, and c itself keep c.
	time.Sleep(200 * time.Millisecond)
	if err := converged([]*Membership{c, d}, "node-a", "node-b", "node-c", "node-d")(); err != nil {
		t.Fatalf("c and d: %v", err)
	}
	if len(d.Down()) != 0 || len(c.Down()) != 0 {
		t.Fatalf("marked down: by d %v, by c %v", d.Down(), c.Down())
	}
	// A second suspicion of a member marked down, and one of a member
	// that accepts, change nothing.
	a.Suspect("node-c")
	d.Suspect("node-c")
	a.Suspect("node-b")
	time.Sleep(200 * time.Millisecond)
	if got := a.Departures("node-c"); got != 1 || len(d.Down()) != 0 || a.Departures("node-b") != 0 {
		t.Fatalf("after more suspicions: a counts %d departures of c, d marks %v, a counts %d of b", got, d.Down(), a.Departures("node-b"))
	}

	// c goes for good: memberlist's failure detection takes over the mark.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "memberlist declares c dead", func() error {
		for _, m := range []*Membership{a, b, d} {
			if len(m.Down()) != 0 || m.Departures("node-c") == 0 {
				return fmt.Errorf("%s: marked down %v, %d departures of c", m.Name(), m.Down(), m.Departures("node-c"))
			}
		}
		return converged([]*Membership{a, b, d}, "node-a", "node-b", "node-d")()
	})
}
