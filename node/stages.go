package node

import (
	"context"
	"time"

	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/freqring/freqring/wal"
)

// This file times the stages of a call for Observer.Stage: the names of
// calls and stages, the timer a call carries through its stages, and the
// gRPC hooks that see what the handlers cannot (a call's arrival, and its
// response handed to the transport).

// Call names the kind of call a stage belongs to.
type Call uint8

const (
	// CallCheck is a Limiter.Check call, or one request of a CheckStream,
	// at the node it reached.
	CallCheck Call = iota
	// CallForward is a Peer.Forward call at the owner it was forwarded to.
	CallForward
	// CallReplicate is one Replicate request at a backup.
	CallReplicate
	numCalls
)

var callNames = [numCalls]string{"check", "forward", "replicate"}

// String returns the call's name as a metric label: check, forward or
// replicate.
func (c Call) String() string {
	if c < numCalls {
		return callNames[c]
	}
	return "unknown"
}

// Calls returns every Call, in order.
func Calls() []Call { return []Call{CallCheck, CallForward, CallReplicate} }

// Stage names a part of a call's wall time. The stages of one call are not
// all in sequence: the WAL and the backups are waited for together
// (StagePersist is both), and a check's forwards run while it decides its
// own items.
type Stage uint8

const (
	// StageQueue is from the call's arrival at the gRPC server (its
	// stream's headers read) to its start, less the request's unmarshal:
	// the handler goroutine's scheduling, reading the request, and the
	// item gate (Limits.MaxItemsInFlight). For a request of a CheckStream,
	// from its read to its start: the item gate and its goroutine's
	// scheduling.
	StageQueue Stage = iota
	// StageDecode is the request unmarshalled and its items validated and
	// hashed.
	StageDecode
	// StageJudge is each item's ownership verdict under the ring.
	StageJudge
	// StageForward is one Peer.Forward to an owner, as its caller sees it:
	// the network both ways and the owner's whole call.
	StageForward
	// StageStore is the items decided in the store, answered and counted
	// (with any wait for a partition being acquired).
	StageStore
	// StageWALQueue is a WAL append waiting for its group commit to be
	// taken: the group wait and the flush of the group before.
	StageWALQueue
	// StageWALWrite is the write(2) of the append's group.
	StageWALWrite
	// StageWALFsync is the fsync of the append's group; not observed when
	// the group was not fsynced.
	StageWALFsync
	// StageBackup is the owner waiting for its backups to hold the call's
	// sends: the network both ways and each backup's Replicate.
	StageBackup
	// StagePersist is the call's whole wait for durability: the WAL and
	// the backups together, then any take-back or wait for the calls that
	// recorded its duplicates.
	StagePersist
	// StageApply is a backup recording replicated sends in its store.
	StageApply
	// StageRespond is from the handler's return to the response handed to
	// the transport: marshalling it (on a stream, with the wait for the
	// stream's sends before it).
	StageRespond
	numStages
)

// NumStages is the number of Stages: the length of a table indexed by
// Stage.
const NumStages = int(numStages)

var stageNames = [numStages]string{"queue", "decode", "judge", "forward", "store", "wal_queue", "wal_write", "wal_fsync", "backup", "persist", "apply", "respond"}

// String returns the stage's name as a metric label, such as wal_fsync.
func (s Stage) String() string {
	if s < numStages {
		return stageNames[s]
	}
	return "unknown"
}

// StagesOf returns the stages a call of kind c reports, in the order of
// the call.
func StagesOf(c Call) []Stage {
	switch c {
	case CallCheck:
		return []Stage{StageQueue, StageDecode, StageJudge, StageForward, StageStore, StageWALQueue, StageWALWrite, StageWALFsync, StageBackup, StagePersist, StageRespond}
	case CallForward:
		return []Stage{StageQueue, StageDecode, StageJudge, StageStore, StageWALQueue, StageWALWrite, StageWALFsync, StageBackup, StagePersist, StageRespond}
	case CallReplicate:
		return []Stage{StageApply, StageWALQueue, StageWALWrite, StageWALFsync, StageRespond}
	}
	return nil
}

// stageTimer times the stages of one call in sequence for an Observer; with
// none, its methods do nothing. It is used by one goroutine, but observe
// may be called from any.
type stageTimer struct {
	o    Observer
	call Call
	last time.Time // the end of the stage before
}

// startStages returns a timer of call's stages that begins now or, for a
// call whose request ctx says took time to unmarshal, that long ago, so
// that its first stage (StageDecode) counts the unmarshal.
func (n *Node) startStages(call Call, ctx context.Context) stageTimer {
	if n.cfg.Observer == nil {
		return stageTimer{}
	}
	st := stageTimer{o: n.cfg.Observer, call: call, last: time.Now()}
	if rt := timingOf(ctx); rt != nil {
		st.last = st.last.Add(-rt.unmarshal)
	}
	return st
}

// lap observes stage s as lasting since the end of the stage before, and
// returns its end.
func (t *stageTimer) lap(s Stage) time.Time {
	if t.o == nil {
		return time.Time{}
	}
	now := time.Now()
	t.o.Stage(t.call, s, now.Sub(t.last))
	t.last = now
	return now
}

// restart begins the next stage now, observing nothing.
func (t *stageTimer) restart() {
	if t.o != nil {
		t.last = time.Now()
	}
}

// since observes stage s as lasting from start to now; a zero start (taken
// without an observer) observes nothing.
func (t *stageTimer) since(s Stage, start time.Time) {
	if t.o != nil && !start.IsZero() {
		t.o.Stage(t.call, s, time.Since(start))
	}
}

// now returns the time, or zero without an observer.
func (t *stageTimer) now() time.Time {
	if t.o == nil {
		return time.Time{}
	}
	return time.Now()
}

// commit observes the steps of a WAL append; a zero c (no append, or a
// failed one) observes nothing.
func (t *stageTimer) commit(c wal.Commit) {
	if t.o == nil || c == (wal.Commit{}) {
		return
	}
	t.o.Stage(t.call, StageWALQueue, c.Queued)
	t.o.Stage(t.call, StageWALWrite, c.Write)
	if c.Fsync > 0 {
		t.o.Stage(t.call, StageWALFsync, c.Fsync)
	}
}

// rpcTiming is what the gRPC hooks know of one timed call: when it arrived,
// how long its request took to unmarshal, and when its handler returned.
// The call's context carries it (rpcTimingKey). Its fields are written by
// the call's handler goroutine and read by the same goroutine, or by the
// server after the handler returned.
type rpcTiming struct {
	call      Call
	arrived   time.Time
	unmarshal time.Duration
	returned  time.Time
}

// handled notes that the call's handler returns now.
func (rt *rpcTiming) handled() { rt.returned = time.Now() }

type rpcTimingKey struct{}

// timingOf returns the call's timing, or nil when ctx carries none (the
// node has no observer, the call is not timed, or it came in process).
func timingOf(ctx context.Context) *rpcTiming {
	rt, _ := ctx.Value(rpcTimingKey{}).(*rpcTiming)
	return rt
}

// timedMethods are the gRPC methods whose stages are timed, by full name.
var timedMethods = map[string]Call{
	"/freqring.v1.Limiter/Check": CallCheck,
	"/freqring.v1.Peer/Forward":  CallForward,
}

// tapArrival is the server's InTapHandle: on the transport's goroutine,
// before the call's own starts, it notes a timed call's arrival.
func tapArrival(ctx context.Context, info *tap.Info) (context.Context, error) {
	call, ok := timedMethods[info.FullMethodName]
	if !ok {
		return ctx, nil
	}
	return context.WithValue(ctx, rpcTimingKey{}, &rpcTiming{call: call, arrived: time.Now()}), nil
}

// queued observes StageQueue of the call ctx carries, which starts now
// (nothing for a call without timing).
func (n *Node) queued(ctx context.Context) {
	if rt := timingOf(ctx); rt != nil && n.cfg.Observer != nil {
		n.cfg.Observer.Stage(rt.call, StageQueue, time.Since(rt.arrived)-rt.unmarshal)
	}
}

// respondTimer is the server's stats.Handler: it observes StageRespond of
// timed calls, from the handler's return to the response sent to the
// transport. Safe for concurrent use.
type respondTimer struct{ o Observer }

func (h respondTimer) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h respondTimer) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h respondTimer) HandleConn(context.Context, stats.ConnStats) {}

func (h respondTimer) HandleRPC(ctx context.Context, s stats.RPCStats) {
	p, ok := s.(*stats.OutPayload)
	if !ok || p.Client {
		return
	}
	if rt := timingOf(ctx); rt != nil && !rt.returned.IsZero() {
		h.o.Stage(rt.call, StageRespond, p.SentTime.Sub(rt.returned))
	}
}
