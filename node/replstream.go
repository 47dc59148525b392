package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is Peer.ReplicateStream: the Replicate calls of an owner to one
// backup on one stream, without a unary call's stream setup, headers and
// handler goroutine per call. With single checks, an owner makes about one
// Replicate call per check: as unary calls they raised the median latency
// of a 3-node cluster's checks several times over, even with asynchronous
// replication, which waits for none of them (measured with freqring
// bench --batch 1 --rate 20000; git history of the README).

// noStreamFor is how long an owner whose backup answered ReplicateStream
// with UNIMPLEMENTED (an older version) replicates to it by unary calls
// before it tries a stream again (the backup may have been upgraded).
const noStreamFor = time.Minute

// replicaStreamer is a Peer that carries Replicate calls on a stream: the
// gRPC one (an in-process LocalNetwork peer makes unary calls).
type replicaStreamer interface {
	ReplicateStream(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[pb.ReplicateRequest, pb.ReplicateAck], error)
}

// serveReplicateStream answers Peer.ReplicateStream: it reads requests through
// recv and answers each through send with a ReplicateAck of its call_id, as
// Replicate would answer it. It records each request's sends in stream
// order on the goroutine that reads them (memory work); when they must
// reach the WAL, a goroutine of their own waits for it and then answers, at
// most Limits.MaxStreamRequests at once, so acks may come out of order. It
// returns when recv fails (io.EOF: the caller closed its side; the error is
// then nil), when ctx ends, or when the node shuts down (UNAVAILABLE), each
// time after answering every request it began to record (serveStream); one
// it reads as it returns is neither recorded nor answered, and the stream's
// end fails it on the owner. A call that fails ends no other, but anything
// that breaks the stream (a request above the node's size limit, a call
// its owner stops waiting for) fails every call waiting on it. send is
// called by one goroutine at a time.
func (n *Node) serveReplicateStream(ctx context.Context, recv func() (*pb.ReplicateRequest, error), send func(*pb.ReplicateAck) error) error {
	return serveStream(ctx, n.stopping, n.cfg.Limits.MaxStreamRequests, recv, send, func(req *pb.ReplicateRequest, reply func(*pb.ReplicateAck)) {
		st := n.startStages(CallReplicate, ctx)
		enc, err := n.recordReplicated(req)
		st.lap(StageApply)
		if enc == nil {
			reply(replicateAck(req.CallId, err))
			return
		}
		go func() {
			if lerr := n.logReplicated(ctx, enc, &st); err == nil {
				err = lerr
			}
			st.restart()
			reply(replicateAck(req.CallId, err))
			st.lap(StageRespond)
		}()
	})
}

// replicateAck is the ack of call id: its code and message are err's
// status, OK for nil.
func replicateAck(id uint64, err error) *pb.ReplicateAck {
	a := &pb.ReplicateAck{CallId: id}
	if err != nil {
		st := status.Convert(err)
		a.Code, a.Message = uint32(st.Code()), st.Message()
	}
	return a
}

// replStream is an owner's ReplicateStream to one backup: each call is a
// request with a call id, matched with its ack by that id. Safe for
// concurrent use.
type replStream struct {
	st     grpc.BidiStreamingClient[pb.ReplicateRequest, pb.ReplicateAck]
	cancel context.CancelFunc
	sendMu sync.Mutex // serializes Send

	mu    sync.Mutex // guards the fields below
	next  uint64     // last call id
	calls map[uint64]chan *pb.ReplicateAck
	err   error         // why the stream ended; set once, before done closes
	done  chan struct{} // closed when the stream has ended
}

// openReplStream opens a ReplicateStream through p that lives until ctx
// ends or the stream breaks. Opening takes at most timeout (a connection
// still being made holds it).
func openReplStream(ctx context.Context, p replicaStreamer, timeout time.Duration) (*replStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	giveUp := time.AfterFunc(timeout, cancel)
	st, err := p.ReplicateStream(sctx)
	if !giveUp.Stop() && err == nil {
		err = status.Errorf(codes.DeadlineExceeded, "no stream in %v", timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	rs := &replStream{st: st, cancel: cancel, calls: map[uint64]chan *pb.ReplicateAck{}, done: make(chan struct{})}
	go rs.receive()
	return rs, nil
}

// receive hands each ack to its call until the stream breaks.
func (rs *replStream) receive() {
	for {
		a, err := rs.st.Recv()
		if err != nil {
			rs.end(err)
			return
		}
		rs.mu.Lock()
		c := rs.calls[a.CallId]
		delete(rs.calls, a.CallId)
		rs.mu.Unlock()
		if c != nil { // nil: a call that gave up waiting
			c <- a
		}
	}
}

// end ends the stream with err, which every call waiting on it and every
// later one returns.
func (rs *replStream) end(err error) {
	rs.mu.Lock()
	if rs.err == nil {
		rs.err = err
		close(rs.done)
	}
	rs.mu.Unlock()
	rs.cancel()
}

// ended reports whether the stream has ended.
func (rs *replStream) ended() bool {
	select {
	case <-rs.done:
		return true
	default:
		return false
	}
}

// call sends req as the next call and waits for its ack: nil when the
// backup has the sends, else the status it answered, or the stream's error
// if the stream ends first; sent is false when the request never left (the
// stream had ended). A call not answered within timeout ends the
// stream (the backup is stuck, or the connection): that call and every
// call waiting fail with DEADLINE_EXCEEDED, and the next opens a new one.
func (rs *replStream) call(req *pb.ReplicateRequest, timeout time.Duration) (sent bool, err error) {
	c := make(chan *pb.ReplicateAck, 1)
	rs.mu.Lock()
	if rs.err != nil {
		rs.mu.Unlock()
		return false, rs.err
	}
	rs.next++
	id := rs.next
	rs.calls[id] = c
	rs.mu.Unlock()
	// The timer also bounds a Send that flow control blocks.
	watchdog := time.AfterFunc(timeout, func() {
		rs.end(status.Errorf(codes.DeadlineExceeded, "replication stream: no ack in %v", timeout))
	})
	defer watchdog.Stop()
	req.CallId = id
	rs.sendMu.Lock()
	err = rs.st.Send(req)
	rs.sendMu.Unlock()
	sent = err == nil
	if err != nil && !errors.Is(err, io.EOF) { // io.EOF: the stream ended, and Recv says why
		rs.end(status.Errorf(codes.Unavailable, "replication stream: %v", err))
	}
	select {
	case a := <-c:
		return true, ackError(a)
	case <-rs.done:
		select {
		case a := <-c: // answered as the stream ended
			return true, ackError(a)
		default:
		}
		rs.mu.Lock()
		delete(rs.calls, id)
		rs.mu.Unlock()
		return sent, rs.err
	}
}

// ackError returns the status an ack carries, nil for OK.
func ackError(a *pb.ReplicateAck) error {
	if a.Code == 0 {
		return nil
	}
	return status.Error(codes.Code(a.Code), a.Message)
}

// replicateOnStream makes the Replicate call req to the replicator's backup
// on its stream, opening one if it has none. ok is false when it has no
// stream to use: the peer is not a replicaStreamer, the replicator was
// retired (its backup moved: closeStream), or the backup answered
// UNIMPLEMENTED within noStreamFor; the caller then makes a unary call. A
// call that never reached the backup (its stream had ended) is made once
// more on a new stream, as gRPC retries a unary call that never left.
func (rp *replicator) replicateOnStream(p Peer, req *pb.ReplicateRequest) (ok bool, err error) {
	sp, isStreamer := p.(replicaStreamer)
	if !isStreamer {
		return false, nil
	}
	for try := 0; ; try++ {
		st, use, oerr := rp.stream(sp)
		if !use || oerr != nil {
			return use, oerr
		}
		sent, err := st.call(req, ForwardTimeout)
		switch {
		case status.Code(err) == codes.Unimplemented:
			rp.stMu.Lock()
			rp.noStreamUntil = time.Now().Add(noStreamFor)
			rp.stMu.Unlock()
			return false, nil
		case !sent && try == 0:
			continue
		}
		return true, err
	}
}

// stream returns the replicator's open stream, opening one through sp if
// it has none (without holding stMu: opening may wait ForwardTimeout for a
// connection); use is false when the replicator must make unary calls.
func (rp *replicator) stream(sp replicaStreamer) (st *replStream, use bool, err error) {
	rp.stMu.Lock()
	st = rp.st
	switch {
	case rp.retired || time.Now().Before(rp.noStreamUntil):
		rp.stMu.Unlock()
		return nil, false, nil
	case st != nil && !st.ended():
		rp.stMu.Unlock()
		return st, true, nil
	}
	rp.stMu.Unlock()
	opened, err := openReplStream(rp.n.moverCtx, sp, ForwardTimeout)
	if err != nil {
		return nil, true, fmt.Errorf("opening a replication stream to %s (%s): %w", rp.member.Name, rp.member.Addr, err)
	}
	rp.stMu.Lock()
	defer rp.stMu.Unlock()
	switch {
	case rp.retired:
		opened.end(errRetired)
		return nil, false, nil
	case rp.st != nil && rp.st != st && !rp.st.ended(): // a concurrent call opened one first
		opened.end(errRetired)
		return rp.st, true, nil
	}
	rp.st = opened
	return opened, true, nil
}

// errRetired ends the streams of a replicator that no longer serves.
var errRetired = status.Error(codes.Unavailable, "replication stream closed: its backup moved")

// closeStream retires the replicator, whose backup moved (a new address):
// it ends its stream, if any, and opens no other; calls still queued on it
// go to the old address as unary calls, as before streams.
func (rp *replicator) closeStream() {
	rp.stMu.Lock()
	defer rp.stMu.Unlock()
	rp.retired = true
	if rp.st != nil {
		rp.st.end(errRetired)
	}
}
