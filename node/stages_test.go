package node_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// stageRecorder is an Observer that keeps every stage observation. Safe for
// concurrent use.
type stageRecorder struct {
	mu     sync.Mutex
	stages map[string][]time.Duration // by "call/stage"
}

func (o *stageRecorder) CheckDone(int, time.Duration) {}
func (o *stageRecorder) Fsync(time.Duration)          {}
func (o *stageRecorder) Snapshot(time.Duration)       {}
func (o *stageRecorder) Recovery(time.Duration)       {}
func (o *stageRecorder) Stage(c node.Call, s node.Stage, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stages[c.String()+"/"+s.String()] = append(o.stages[c.String()+"/"+s.String()], d)
}

// observed returns the names of the stages observed, sorted, and fails t
// if one lasted less than 0 or longer than limit.
func (o *stageRecorder) observed(t *testing.T, node string, limit time.Duration) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var names []string
	for name, ds := range o.stages {
		names = append(names, name)
		for _, d := range ds {
			if d < 0 || d > limit {
				t.Errorf("%s: stage %s lasted %v, outside [0, %v]", node, name, d, limit)
			}
		}
	}
	slices.Sort(names)
	return names
}

// TestStagesTimed checks a batch over gRPC through one node of two with
// WALs, of durability fsync: the entry node reports every stage of a check that forwards part of
// its batch and replicates the rest, the other the stages of the forward it
// answered and of the replication it took; each lasts from 0 to the call's
// timeout.
func TestStagesTimed(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	recs := map[string]*stageRecorder{}
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 2, DataDir: t.TempDir(), Node: func(cfg *node.Config) {
		rec := &stageRecorder{stages: map[string][]time.Duration{}}
		mu.Lock()
		recs[cfg.Name] = rec
		mu.Unlock()
		cfg.Observer = rec
		cfg.Durability = rules.DurabilityFsync // the owners' appends wait for their fsync: wal_fsync
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	entry, other := c.Members()[0], c.Members()[1]
	var rcps []string
	for i := range 40 {
		rcps = append(rcps, fmt.Sprintf("+86137%08d", i))
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := pb.NewLimiterClient(dialNode(t, entry.Addr)).Check(cctx, &pb.CheckRequest{Recipients: rcps})
	if err != nil || len(resp.Errors) > 0 {
		t.Fatalf("check: %v %v", err, resp.GetErrors())
	}
	// The other node's answer to the forward and its ack to the
	// replication reached the entry node; the entry's own ack of the
	// forward's replication reached the other node before it answered.
	// A backup's append waits for no fsync (replicate/wal_fsync), unless
	// it shares its group commit with an owner's that does.
	want := map[*nodetest.Member][]string{
		entry: {"check/backup", "check/decode", "check/forward", "check/judge", "check/persist", "check/queue", "check/respond", "check/store",
			"check/wal_fsync", "check/wal_queue", "check/wal_write", "replicate/apply", "replicate/respond", "replicate/wal_queue", "replicate/wal_write"},
		other: {"forward/backup", "forward/decode", "forward/judge", "forward/persist", "forward/queue", "forward/respond", "forward/store",
			"forward/wal_fsync", "forward/wal_queue", "forward/wal_write", "replicate/apply", "replicate/respond", "replicate/wal_queue", "replicate/wal_write"},
	}
	for m, names := range want {
		// respond is observed once the response is on its way: the
		// caller may see it first.
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := slices.DeleteFunc(recs[m.Name].observed(t, m.Name, 10*time.Second), func(s string) bool { return s == "replicate/wal_fsync" })
			if slices.Equal(got, names) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s observed stages\n%v\nwant\n%v", m.Name, got, names)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestForwardingCheckHoldsNoGroupCommit: a check whose items all belong to
// another node announces no WAL append, so that its node's group commits
// (here, of the sends it takes as that node's backup) do not wait for it
// while its forward is in flight.
func TestForwardingCheckHoldsNoGroupCommit(t *testing.T) {
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 2, InMemory: true, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	entry, owner := c.Members()[0], c.Members()[1]
	r := entry.Node.Ring()
	var theirs []string
	for i := 0; len(theirs) < 20; i++ {
		rcp := fmt.Sprintf("+86138%08d", i)
		if r.PartitionOwner(r.PartitionString(rcp)).Name == owner.Name {
			theirs = append(theirs, rcp)
		}
	}
	before := entry.Node.Stats().WAL
	for _, rcp := range theirs {
		resp, err := c.Check(ctx, entry, &pb.CheckRequest{Recipients: []string{rcp}})
		if err != nil || len(resp.Errors) > 0 || !resp.Admitted[0] {
			t.Fatalf("check %s: %v %v", rcp, err, resp.GetErrors())
		}
	}
	after := entry.Node.Stats().WAL
	if after.Appends-before.Appends < int64(len(theirs)) {
		t.Fatalf("the entry node, the owner's backup, appended %d records for %d sends", after.Appends-before.Appends, len(theirs))
	}
	if waits := after.GroupWaits - before.GroupWaits; waits != 0 {
		t.Fatalf("%d group commits waited for appends the forwarding checks announced", waits)
	}
}
