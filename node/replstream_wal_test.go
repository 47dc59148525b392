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

// fsyncGate is an Observer that, once armed, holds every WAL fsync of its
// node until opened: the node's Appends wait meanwhile.
type fsyncGate struct {
	armed atomic.Bool
	hit   chan struct{} // a value when an fsync waits at the gate
	once  sync.Once
	open  chan struct{} // closed by release
}

func (g *fsyncGate) CheckDone(int, time.Duration) {}
func (g *fsyncGate) Snapshot(time.Duration)       {}
func (g *fsyncGate) Recovery(time.Duration)       {}
func (g *fsyncGate) Fsync(time.Duration) {
	if !g.armed.Load() {
		return
	}
	select {
	case g.hit <- struct{}{}:
	default:
	}
	<-g.open
}
func (g *fsyncGate) release() { g.once.Do(func() { close(g.open) }) }

// TestReplicatedSendIsDurableBeforeItsAnswer holds back the WAL of a
// partition's backup: with sync replication, the owner must not answer a
// check admitted there until the backup's WAL has the send (its ack on the
// replication stream waits for the append).
func TestReplicatedSendIsDurableBeforeItsAnswer(t *testing.T) {
	gate := &fsyncGate{hit: make(chan struct{}, 1), open: make(chan struct{})}
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
	var backup, owner *nodetest.Member
	for _, m := range c.Members() {
		if m.Name == "node-0" {
			backup = m
		} else {
			owner = m
		}
	}
	r := owner.Node.Ring()
	rcp := ""
	for i := 0; rcp == ""; i++ {
		if s := fmt.Sprintf("+86138%08d", i); r.OwnerString(s).Name == owner.Name {
			rcp = s
		}
	}
	if b, ok := r.ReplicaString(rcp); !ok || b.Name != backup.Name {
		t.Fatalf("recipient %s: backup %v, want %s", rcp, b, backup.Name)
	}
	gate.armed.Store(true)
	type answer struct {
		resp *pb.CheckResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := owner.Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}})
		done <- answer{resp, err}
	}()
	<-gate.hit // the backup's WAL waits
	select {
	case a := <-done:
		t.Fatalf("the owner answered (%v, %v) while its backup's WAL held the send back", a.resp, a.err)
	case <-time.After(300 * time.Millisecond): // a wrong answer comes at once; a right one never
	}
	gate.release()
	a := <-done
	if a.err != nil || len(a.resp.Errors) > 0 || !a.resp.Admitted[0] {
		t.Fatalf("after the backup's WAL: %v, %v; want admitted", a.resp, a.err)
	}
	if st := owner.Node.Stats(); st.ReplicateCalls == 0 || st.ReplicateUnaryCalls != 0 {
		t.Fatalf("%d Replicate calls, %d unary: want them on a stream", st.ReplicateCalls, st.ReplicateUnaryCalls)
	}
}
