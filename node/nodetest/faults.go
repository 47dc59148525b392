package nodetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is the network of a cluster with Config.Faults: the nodes'
// gossip (a memberlist.Transport per member), their peer calls (a
// node.Carrier) and the load's checks (Cluster.Check) all pass through
// one faultNet, which a test freezes members of and cuts links in.
//
// A frozen member is a stopped process (SIGSTOP, a long GC pause, a VM
// migration): it sends nothing and takes nothing in until it thaws, and
// what was sent to it waits, as in a socket's buffer, to be read when it
// thaws. A call it was serving when it froze finishes on thaw (with a fresh
// deadline: a server reads a request's deadline when it reads the request);
// its callers give up at their own deadlines meanwhile. A cut link from a
// to b loses what a sends to b: gossip packets, stream dials, peer calls;
// a cut from b to a loses b's answers to a's calls, after b acted on them.
// Gossip packets are never lost otherwise, however starved the machine.

// faultNet is a Cluster's network with faults. It is safe for concurrent
// use.
type faultNet struct {
	mu     sync.Mutex
	ends   map[string]*gossipEnd // by gossip address: the transport of the member started there last
	names  map[string]string     // node address -> member name
	cut    map[link]bool         // links that lose what is sent on them
	frozen map[string]*freeze    // by member name
	ports  int                   // gossip ports handed out
}

// link is the direction from one member to another, by name; "" is a
// caller outside the cluster.
type link struct{ from, to string }

// freeze is one freeze of a member: thawed is closed when it ends; killed
// says the member was killed meanwhile, so what waited is dropped.
type freeze struct {
	thawed chan struct{}
	killed bool
}

func newFaultNet() *faultNet {
	return &faultNet{ends: map[string]*gossipEnd{}, names: map[string]string{}, cut: map[link]bool{}, frozen: map[string]*freeze{}}
}

// gossipAddr returns the gossip address of the next member: a label, as no
// socket is bound.
func (f *faultNet) gossipAddr() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ports++
	return fmt.Sprintf("127.0.0.1:%d", 20000+f.ports)
}

// named records that node address addr is member name's.
func (f *faultNet) named(addr, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names[addr] = name
}

// name returns the member name of node address addr ("" if unknown).
func (f *faultNet) name(addr string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.names[addr]
}

// setFrozen freezes or thaws member name.
func (f *faultNet) setFrozen(name string, frozen bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fr := f.frozen[name]
	switch {
	case frozen && fr == nil:
		f.frozen[name] = &freeze{thawed: make(chan struct{})}
	case !frozen && fr != nil:
		delete(f.frozen, name)
		close(fr.thawed)
	}
}

// killed ends any freeze of member name, dropping what waited for it.
func (f *faultNet) killed(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fr := f.frozen[name]; fr != nil {
		fr.killed = true
		delete(f.frozen, name)
		close(fr.thawed)
	}
}

// setCut cuts or heals the link from a to b.
func (f *faultNet) setCut(from, to string, cut bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cut {
		f.cut[link{from, to}] = true
	} else {
		delete(f.cut, link{from, to})
	}
}

// healAll heals every cut link.
func (f *faultNet) healAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.cut)
}

func (f *faultNet) isCut(from, to string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[link{from, to}]
}

// awake waits while member name is frozen and reports whether it is still
// alive (not killed while it waited).
func (f *faultNet) awake(name string) bool {
	f.mu.Lock()
	fr := f.frozen[name]
	f.mu.Unlock()
	if fr == nil {
		return true
	}
	<-fr.thawed
	return !fr.killed
}

// thawedCh returns a channel closed when member name is not frozen, and
// the freeze it waits for (nil: not frozen).
func (f *faultNet) thawedCh(name string) (*freeze, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fr := f.frozen[name]; fr != nil {
		return fr, fr.thawed
	}
	return nil, nil
}

// heldCallTimeout bounds a call that waited for its frozen callee to thaw:
// the callee reads it then, with this deadline.
const heldCallTimeout = 10 * time.Second

var (
	errCut    = status.Error(codes.Unavailable, "nodetest: the network between caller and callee is cut")
	errLost   = status.Error(codes.Unavailable, "nodetest: the callee's answer was lost (the network back to the caller is cut)")
	errKilled = status.Error(codes.Unavailable, "nodetest: the member was killed")
)

// carry is the cluster's node.Carrier, for peer calls and the load's checks.
func (f *faultNet) carry(ctx context.Context, fromAddr, toAddr string, deliver func(context.Context) error) error {
	from, to := f.name(fromAddr), f.name(toAddr)
	if from != "" && !f.awake(from) { // a frozen caller sends nothing yet
		return errKilled
	}
	if f.isCut(from, to) {
		return errCut
	}
	err := f.deliver(ctx, to, deliver)
	if err == nil && f.isCut(to, from) {
		err = errLost
	}
	if from != "" && !f.awake(from) { // nor reads the answer
		return errKilled
	}
	return err
}

// deliver calls deliver at member to: at once, or, while it is frozen, once
// it thaws, with a fresh deadline, the caller waiting no longer than ctx.
func (f *faultNet) deliver(ctx context.Context, to string, deliver func(context.Context) error) error {
	fr, thawed := f.thawedCh(to)
	if fr == nil {
		return deliver(ctx)
	}
	done := make(chan error, 1)
	go func() {
		<-thawed
		if fr.killed {
			done <- errKilled
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), heldCallTimeout)
		defer cancel()
		done <- deliver(dctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// newEnd returns the gossip transport of member name at address addr,
// replacing the one of an earlier start there.
func (f *faultNet) newEnd(name, addr string) *gossipEnd {
	host, port, _ := net.SplitHostPort(addr)
	var p int
	fmt.Sscan(port, &p)
	e := &gossipEnd{net: f, name: name, addr: &net.TCPAddr{IP: net.ParseIP(host), Port: p},
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), down: make(chan struct{}), kick: make(chan struct{}, 1)}
	f.mu.Lock()
	f.ends[addr] = e
	f.mu.Unlock()
	go e.pump()
	return e
}

func (f *faultNet) end(addr string) *gossipEnd {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ends[addr]
}

// gossipEnd is one member's memberlist.Transport on a faultNet. What
// arrives waits in a queue that its pump hands to memberlist while the
// member is not frozen, so that no sender waits for a busy receiver and
// nothing is lost to a full buffer.
type gossipEnd struct {
	net  *faultNet
	name string
	addr *net.TCPAddr

	packets chan *memberlist.Packet
	streams chan net.Conn
	down    chan struct{} // closed by Shutdown
	once    sync.Once

	mu    sync.Mutex // guards queue
	queue []any      // *memberlist.Packet or net.Conn, in arrival order
	kick  chan struct{}
}

var _ memberlist.Transport = (*gossipEnd)(nil)

func (e *gossipEnd) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return e.addr.IP, e.addr.Port, nil
}

func (e *gossipEnd) PacketCh() <-chan *memberlist.Packet { return e.packets }
func (e *gossipEnd) StreamCh() <-chan net.Conn           { return e.streams }

func (e *gossipEnd) Shutdown() error {
	e.once.Do(func() { close(e.down) })
	return nil
}

func (e *gossipEnd) isDown() bool {
	select {
	case <-e.down:
		return true
	default:
		return false
	}
}

// errNoRoute fails a dial to a member that is not there or is cut off.
var errNoRoute = errors.New("nodetest: no route to the member")

// WriteTo sends packet b to addr: it waits while this member is frozen, and
// is lost if the link is cut or nobody is there, as a UDP packet would be.
func (e *gossipEnd) WriteTo(b []byte, addr string) (time.Time, error) {
	if !e.net.awake(e.name) || e.isDown() {
		return time.Now(), errors.New("nodetest: the transport is shut down")
	}
	dest := e.net.end(addr)
	if dest == nil || dest.isDown() || e.net.isCut(e.name, dest.name) {
		return time.Now(), nil
	}
	dest.enqueue(&memberlist.Packet{Buf: append([]byte(nil), b...), From: e.addr})
	return time.Now(), nil
}

// DialTimeout opens a stream to addr: it waits while this member is frozen
// and fails if the link is cut either way or nobody is there. A frozen
// receiver accepts the stream when it thaws.
func (e *gossipEnd) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if !e.net.awake(e.name) || e.isDown() {
		return nil, errors.New("nodetest: the transport is shut down")
	}
	dest := e.net.end(addr)
	if dest == nil || dest.isDown() || e.net.isCut(e.name, dest.name) || e.net.isCut(dest.name, e.name) {
		return nil, fmt.Errorf("dial %s: %w", addr, errNoRoute)
	}
	mine, theirs := net.Pipe()
	dest.enqueue(pipeConn{theirs, dest.addr, e.addr})
	return pipeConn{mine, e.addr, dest.addr}, nil
}

func (e *gossipEnd) enqueue(x any) {
	e.mu.Lock()
	e.queue = append(e.queue, x)
	e.mu.Unlock()
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// pump hands what arrived to memberlist, in order, while the member is not
// frozen, until Shutdown; what is left then is dropped.
func (e *gossipEnd) pump() {
	for {
		e.mu.Lock()
		var x any
		if len(e.queue) > 0 {
			x = e.queue[0]
			e.queue[0] = nil
			e.queue = e.queue[1:]
		}
		e.mu.Unlock()
		if x == nil {
			select {
			case <-e.kick:
				continue
			case <-e.down:
				return
			}
		}
		if !e.net.awake(e.name) {
			return
		}
		switch x := x.(type) {
		case *memberlist.Packet:
			x.Timestamp = time.Now() // received now
			select {
			case e.packets <- x:
			case <-e.down:
				return
			}
		case net.Conn:
			select {
			case e.streams <- x:
			case <-e.down:
				x.Close()
				return
			}
		}
	}
}

// pipeConn is one end of a net.Pipe with the addresses of a TCP stream.
type pipeConn struct {
	net.Conn
	local, remote net.Addr
}

func (c pipeConn) LocalAddr() net.Addr  { return c.local }
func (c pipeConn) RemoteAddr() net.Addr { return c.remote }

// errNoFaults fails the fault methods of a cluster started without
// Config.Faults.
var errNoFaults = errors.New("nodetest: the cluster was started without Config.Faults")

// Freeze stops m as SIGSTOP would (see faults.go): it sends and reads
// nothing until Thaw. A cluster without Config.Faults returns an error.
func (c *Cluster) Freeze(m *Member) error {
	if c.faults == nil {
		return errNoFaults
	}
	c.faults.setFrozen(m.Name, true)
	return nil
}

// Thaw ends m's freeze: it reads what waited for it and goes on.
func (c *Cluster) Thaw(m *Member) error {
	if c.faults == nil {
		return errNoFaults
	}
	c.faults.setFrozen(m.Name, false)
	return nil
}

// Cut loses, until Heal, what from sends to to: its gossip packets, its
// peer calls, and its answers to to's calls (after it acted on them); a
// gossip stream needs both ways. For a network partition, Isolate.
func (c *Cluster) Cut(from, to *Member) error {
	if c.faults == nil {
		return errNoFaults
	}
	c.faults.setCut(from.Name, to.Name, true)
	return nil
}

// Isolate cuts m off from every other member, both ways, as a network
// partition would; callers outside the cluster still reach it.
func (c *Cluster) Isolate(m *Member) error {
	if c.faults == nil {
		return errNoFaults
	}
	for _, o := range c.Members() {
		if o != m {
			c.faults.setCut(m.Name, o.Name, true)
			c.faults.setCut(o.Name, m.Name, true)
		}
	}
	return nil
}

// Heal heals every cut.
func (c *Cluster) Heal() error {
	if c.faults == nil {
		return errNoFaults
	}
	c.faults.healAll()
	return nil
}

// Check calls m's Check as a caller outside the cluster would: with
// Config.Faults, through the network, so that it waits for a frozen m
// (until ctx ends; m answers when it thaws all the same) and fails if m
// was killed meanwhile. Without Faults it calls m.Node.Check.
func (c *Cluster) Check(ctx context.Context, m *Member, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if c.faults == nil {
		return m.Node.Check(ctx, req)
	}
	var resp *pb.CheckResponse // set by deliver, read once it returned
	err := c.faults.carry(ctx, "", m.Addr, func(ctx context.Context) error {
		r, err := m.Node.Check(ctx, proto.Clone(req).(*pb.CheckRequest))
		if err == nil {
			resp = r
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
