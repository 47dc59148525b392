package node_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// walGate is an Observer that, once armed, holds every replicated append
// of its node, as a backup, as its WAL write returns (the stage wal_write
// of a replicate call), until opened: the backup's ack waits meanwhile.
type walGate struct {
	armed atomic.Bool
	hit   chan struct{} // a value when an fsync waits at the gate
	once  sync.Once
	open  chan struct{} // closed by release
}

func (g *walGate) CheckDone(int, time.Duration) {}
func (g *walGate) Snapshot(time.Duration)       {}
func (g *walGate) Recovery(time.Duration)       {}
func (g *walGate) Fsync(time.Duration)          {}
func (g *walGate) Stage(c node.Call, s node.Stage, _ time.Duration) {
	if !g.armed.Load() || c != node.CallReplicate || s != node.StageWALWrite {
		return
	}
	select {
	case g.hit <- struct{}{}:
	default:
	}
	<-g.open
}
func (g *walGate) release() { g.once.Do(func() { close(g.open) }) }

// gatedPair starts two durable nodes, the backup's WAL behind gate, and
// returns them and a recipient the owner owns (the backup backs it).
func gatedPair(t *testing.T, gate *walGate) (owner, backup *nodetest.Member, rcp string) {
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 2, DataDir: t.TempDir(),
		Node: func(cfg *node.Config) {
			if cfg.Name == "node-0" {
				cfg.Observer = gate
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Cleanup(gate.release) // before Close
	waitSettled(t, c)
	for _, m := range c.Members() {
		if m.Name == "node-0" {
			backup = m
		} else {
			owner = m
		}
	}
	r := owner.Node.Ring()
	for i := 0; rcp == ""; i++ {
		if s := fmt.Sprintf("+86138%08d", i); r.OwnerString(s).Name == owner.Name {
			rcp = s
		}
	}
	if b, ok := r.ReplicaString(rcp); !ok || b.Name != backup.Name {
		t.Fatalf("recipient %s: backup %v, want %s", rcp, b, backup.Name)
	}
	return owner, backup, rcp
}

type answer struct {
	resp *pb.CheckResponse
	err  error
}

// checkAsync checks rcp on m and sends the answer on the channel it returns.
func checkAsync(m *nodetest.Member, rcp string) chan answer {
	done := make(chan answer, 1)
	go func() {
		resp, err := m.Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}})
		done <- answer{resp, err}
	}()
	return done
}

func wantAdmitted(t *testing.T, what string, a answer) {
	t.Helper()
	if a.err != nil || len(a.resp.Errors) > 0 || !a.resp.Admitted[0] {
		t.Fatalf("%s: %v, %v; want admitted", what, a.resp, a.err)
	}
}

// TestReplicatedSendIsDurableBeforeItsAnswer holds back the WAL of a
// partition's backup: with sync replication, the owner must not answer a
// check admitted there until the backup's WAL has the send (its ack on the
// replication stream waits for the append's write; the backup fsyncs it
// within its sync interval, docs/durability.md).
func TestReplicatedSendIsDurableBeforeItsAnswer(t *testing.T) {
	gate := &walGate{hit: make(chan struct{}, 1), open: make(chan struct{})}
	owner, _, rcp := gatedPair(t, gate)
	gate.armed.Store(true)
	done := checkAsync(owner, rcp)
	<-gate.hit // the backup's WAL waits
	select {
	case a := <-done:
		t.Fatalf("the owner answered (%v, %v) while its backup's WAL held the send back", a.resp, a.err)
	case <-time.After(300 * time.Millisecond): // a wrong answer comes at once; a right one never
	}
	gate.release()
	wantAdmitted(t, "after the backup's WAL", <-done)
	if st := owner.Node.Stats(); st.ReplicateCalls == 0 || st.ReplicateUnaryCalls != 0 {
		t.Fatalf("%d Replicate calls, %d unary: want them on a stream", st.ReplicateCalls, st.ReplicateUnaryCalls)
	}
}

// TestReplicationStreamDrainsAtShutdown stops a backup while its WAL holds
// a replicated send back: its replication stream ends only after that call
// is answered, so the owner's check is admitted, not failed.
func TestReplicationStreamDrainsAtShutdown(t *testing.T) {
	gate := &walGate{hit: make(chan struct{}, 1), open: make(chan struct{})}
	owner, backup, rcp := gatedPair(t, gate)
	gate.armed.Store(true)
	done := checkAsync(owner, rcp)
	<-gate.hit
	stopped := make(chan error, 1)
	go func() { stopped <- backup.Node.Close() }()
	// Close stops the node's streams (stopping) at once; a handler that
	// returned then would fail the owner's call at once.
	select {
	case a := <-done:
		t.Fatalf("the owner answered (%v, %v) before its stopping backup answered a call it had begun", a.resp, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	gate.release()
	wantAdmitted(t, "after the backup's WAL", <-done)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
