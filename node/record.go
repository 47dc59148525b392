package node

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
)

// This file is what decide recorded, on its way to the disk and the
// backups: one list of sends per call (record), which feeds both the WAL
// payload and each backup's frame (persist).

// send is one entry of a call's list of what it recorded: a send admitted
// and recorded, a refund, or a duplicate's first send sent to the backup
// again. The WAL gets those with wal set; the partition's backup gets all
// of them when the call replicates.
type send struct {
	walSend
	part    int // ring partition of key
	answer  int // the response index it answers
	wal     bool
	opening uint64 // the partition's store.Opening when it was decided
}

// record lists what answer j recorded, if it goes to the WAL or a backup:
// a recorded send; a refund (to the WAL unless it was refunded before); a
// duplicate's first send, to the backup only (its first answer may have
// failed because the backup did not confirm; a backup skips a request id it
// has recorded).
func (p *pass) record(j int, x *item, sb *store.BatchItem) {
	if p.t == nil && !p.replicating {
		return
	}
	dec := &sb.Dec
	s := send{walSend: walSend{domain: x.dv.d.Name(), key: x.key, tag: x.tag, at: dec.At, content: x.it.Content, cost: x.it.Cost, id: x.id},
		part: x.part, answer: j, opening: sb.Opening}
	switch {
	case x.refund:
		s.seq, s.cost, s.refund, s.wal = sb.Seq, sb.Cost, true, !sb.Dup
	case sb.Dup:
	case dec.Recorded:
		s.seq, s.wal = sb.Seq, true
	default:
		return // denied, or a peek: nothing recorded
	}
	p.b.sends = append(p.b.sends, s)
	p.durability = min(p.durability, x.dv.durability)
}

// persist makes the call's recorded sends durable and replicated before it
// answers: the backups get theirs (a call per backup, gathered with other
// calls', replicate) while the WAL gets its payload, in one append;
// answers whose backup did not confirm fail, and their sends are taken
// back (failUnreplicated). If the WAL append fails, the sends are taken
// back and the call fails whole. A
// duplicate is answered only once the calls that might have recorded it
// have ended (confirmDuplicates).
func (p *pass) persist(ctx context.Context) (*pb.CheckResponse, error) {
	n := p.n
	st := p.b.st
	start := st.now()
	defer st.since(StagePersist, start)
	var replicated chan struct{}
	var rs *replicaSet
	if p.replicating {
		rs = p.replicaSet()
		defer n.releaseReplicaSet(rs)
		if len(rs.backups) > 0 {
			replicated = make(chan struct{})
			async := n.cfg.Replication == ReplicationAsync || p.durability == rules.DurabilityAsync
			go func() {
				defer close(replicated)
				n.replicate(ctx, p.r, rs, async)
				st.since(StageBackup, start)
			}()
		}
	}
	var enc *walEncoder
	var walErr error
	if p.t != nil {
		enc = p.walPayload()
		defer n.encoders.Put(enc)
		// The sends are recorded in memory: they go to the WAL even if the
		// caller has left (a deadline), or a crash would forget what the
		// node counts now.
		var c wal.Commit
		c, walErr = n.appendWAL(context.WithoutCancel(ctx), enc, p.t, p.waitsForFsync())
		st.commit(c)
	}
	if replicated != nil {
		<-replicated
	}
	if walErr != nil {
		return nil, p.takeBack(ctx, enc, walErr)
	}
	if replicated != nil {
		p.failUnreplicated(ctx, rs)
	}
	p.failReopened(ctx)
	if p.t != nil || p.replicating {
		n.flight.leave(p.flight)
		if len(p.resp.Duplicates) > 0 {
			p.confirmDuplicates(ctx)
		}
	}
	return p.resp, nil
}

// waitsForFsync reports whether the call's answer waits for its WAL
// append's fsync: for a domain of durability fsync, and for one of
// replicated when the sends have no backup to hold them (a node alone, or
// replication off), which would leave the page cache the only other copy.
func (p *pass) waitsForFsync() bool {
	return p.durability == rules.DurabilityFsync || p.durability == rules.DurabilityReplicated && !p.replicating
}

// failReopened fails the answers whose send was decided from a record its
// partition has since been closed and opened again over (store.Opening
// moved): this node acquired the partition meanwhile, which merges what
// others decided for it, so the decision may have been made without their
// sends. It happens to a node that decided with its partition open under a
// ring that others no longer shared (it was frozen, say) and then acquired
// the partition again (rules 7 and 8): its backup takes the send once it
// has handed the partition over. The sends are taken back (withdraw), and
// a retry is decided from the merged record.
func (p *pass) failReopened(ctx context.Context) {
	var failed map[int]bool
	for k := range p.b.sends {
		s := &p.b.sends[k]
		if !s.wal || s.refund || !p.resp.Recorded[s.answer] || p.n.store.Opening(s.part) == s.opening {
			continue
		}
		if failed == nil {
			failed = map[int]bool{}
		}
		failed[s.answer] = true
		p.retract(s.answer, fmt.Sprintf("node %s: partition %d was acquired again while this item was decided from its earlier record; retry", p.n.cfg.Name, s.part))
	}
	if failed == nil {
		return
	}
	p.n.reopenedFailures.Add(int64(len(failed)))
	p.withdraw(ctx, failed)
	wire.SortErrors(p.resp.Errors)
}

// walPayload returns the WAL payload of the sends listed for the WAL, in a
// pooled encoder.
func (p *pass) walPayload() *walEncoder {
	enc, _ := p.n.encoders.Get().(*walEncoder)
	if enc == nil {
		enc = new(walEncoder)
	}
	enc.reset()
	for k := range p.b.sends {
		if s := &p.b.sends[k]; s.wal {
			enc.add(s.walSend)
		}
	}
	return enc
}

// replicaSet returns the listed sends gathered by backup. A refund goes to
// the backup without its sequence number: the backup numbers what it
// applies, and skips a refund it has applied.
func (p *pass) replicaSet() *replicaSet {
	rs := p.n.takeReplicaSet(p.cnt, p.r.Len())
	for k := range p.b.sends {
		s := &p.b.sends[k]
		ws := s.walSend
		if ws.refund {
			ws.seq = 0
		}
		rs.add(p.r, s.part, s.answer, ws)
	}
	return rs
}

// takeBack undoes the call's sends after its WAL append failed with err,
// and returns the call's error.
func (p *pass) takeBack(ctx context.Context, enc *walEncoder, err error) error {
	n := p.n
	undone := n.takeBack(ctx, enc.bytes(), p.r)
	n.takenBack.Add(1)
	n.flight.leave(p.flight)
	if ok, held := n.walLogs.allow(time.Now().UnixNano(), walLogEvery); ok {
		n.log.Error("WAL append failed: the call's sends were taken back and it failed; calls that record fail until the log recovers",
			"sends_taken_back", undone, "failed_calls_not_logged", held, "err", err)
	}
	return status.Errorf(codes.Unavailable, "node %s: write-ahead log: %v; nothing of this call was recorded; retry", n.cfg.Name, err)
}
