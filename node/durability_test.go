package node_test

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// fsyncHold is an Observer that, once armed, holds every WAL fsync until
// released.
type fsyncHold struct {
	stageRecorder
	armed atomic.Bool
	open  chan struct{}
	once  sync.Once
}

func (h *fsyncHold) Fsync(time.Duration) {
	if h.armed.Load() {
		<-h.open
	}
}
func (h *fsyncHold) Stage(node.Call, node.Stage, time.Duration) {}
func (h *fsyncHold) release()                                   { h.once.Do(func() { close(h.open) }) }

// durabilityCluster starts size in-memory nodes with WALs, serving one
// domain, d, of the durability named ("": none named), every node's fsyncs
// behind hold; it returns the first member and a recipient it owns.
func durabilityCluster(t *testing.T, size int, durability string, hold *fsyncHold) (*nodetest.Member, string) {
	t.Helper()
	yaml := "domains:\n- name: d\n  rules:\n  - {name: r, scope: recipient, limit: 5, window: 1m}\n"
	if durability != "" {
		yaml = strings.Replace(yaml, "- name: d\n", "- name: d\n  durability: "+durability+"\n", 1)
	}
	rs, err := rules.Parse("t", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: size, InMemory: true, DataDir: t.TempDir(), Rules: rs,
		Node: func(cfg *node.Config) { cfg.Observer = hold }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Cleanup(hold.release) // before Close
	waitSettled(t, c)
	owner := c.Members()[0]
	r := owner.Node.Ring()
	for i := 0; ; i++ {
		if rcp := fmt.Sprintf("+86139%08d", i); r.OwnerString(rcp).Name == owner.Name {
			return owner, rcp
		}
	}
}

// checkWhileHeld checks rcp in domain d on m with every fsync held back by
// hold: with waits, it must not be answered until hold is released (it is,
// after 300 ms); without, it must be answered meanwhile.
func checkWhileHeld(t *testing.T, m *nodetest.Member, rcp string, hold *fsyncHold, waits bool) {
	t.Helper()
	hold.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		resp, err := m.Node.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Domains: []string{"d"}})
		if err == nil && (len(resp.Errors) > 0 || !resp.Admitted[0]) {
			err = fmt.Errorf("check: %v", resp)
		}
		done <- err
	}()
	if waits {
		select {
		case err := <-done:
			t.Fatalf("answered (%v) while the WAL's fsync was held back", err)
		case <-time.After(300 * time.Millisecond): // a wrong answer comes at once; a right one never
		}
		hold.release()
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer in 10 s: the check waits for an fsync held back")
	}
}

// TestDurabilityOfADomain: with its WAL's fsyncs held back, a node alone
// answers a check of a domain of durability async at once (the sync loop
// fsyncs it later), and one of fsync, replicated (there is no backup to
// hold the send) or of a domain that names none (the default, replicated)
// only once the fsync is done.
func TestDurabilityOfADomain(t *testing.T) {
	for _, tc := range []struct {
		durability string // the domain's; "" is the node's default
		waits      bool
	}{{"fsync", true}, {"", true}, {"replicated", true}, {"async", false}} {
		t.Run(cmp.Or(tc.durability, "default"), func(t *testing.T) {
			hold := &fsyncHold{open: make(chan struct{})}
			m, rcp := durabilityCluster(t, 1, tc.durability, hold)
			checkWhileHeld(t, m, rcp, hold, tc.waits)
		})
	}
}

// TestReplicatedDurabilityNeedsNoFsync: in a cluster of two with WALs, an
// owner answers a check of a domain of durability replicated while every
// fsync of both nodes is held back (the backup holds the send), and one of
// durability fsync only once its fsync is done.
func TestReplicatedDurabilityNeedsNoFsync(t *testing.T) {
	for _, tc := range []struct {
		durability string
		waits      bool
	}{{"replicated", false}, {"fsync", true}} {
		t.Run(tc.durability, func(t *testing.T) {
			hold := &fsyncHold{open: make(chan struct{})}
			m, rcp := durabilityCluster(t, 2, tc.durability, hold)
			checkWhileHeld(t, m, rcp, hold, tc.waits)
		})
	}
}
