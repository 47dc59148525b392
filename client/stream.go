package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// streamRetry is how long a batcher sends unary Checks to a node that
// answered CheckStream with UNIMPLEMENTED (an older version) before it tries
// the stream again.
const streamRetry = time.Minute

// useStream reports whether requests to p go on CheckStreams: not with
// Config.UnaryChecks, nor for streamRetry after p answered UNIMPLEMENTED.
func (c *Client) useStream(p *peer) bool {
	return !c.cfg.UnaryChecks && time.Now().UnixNano() >= p.noStream.Load()
}

// streamUnimplemented notes that p answered CheckStream UNIMPLEMENTED (an
// older version): single checks and batches go to it as unary Checks for
// streamRetry.
func (c *Client) streamUnimplemented(p *peer) {
	p.noStream.Store(time.Now().Add(streamRetry).UnixNano())
	c.log.Info("node does not implement CheckStream: single checks and batches go as unary Checks", "addr", p.addr, "for", streamRetry)
}

// openCheckStream opens a CheckStream to p that lasts until cancel is
// called or the client closes. bound arranges for its argument to be called
// when the wait for a connection must end, and returns a stop that reports
// whether it was in time; past it, the opening fails with
// context.DeadlineExceeded.
func (c *Client) openCheckStream(p *peer, bound func(func()) (stop func() bool)) (grpc.BidiStreamingClient[pb.CheckRequest, pb.CheckResponse], context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(c.life)
	stop := bound(cancel) // bounds the wait for a connection, not the stream
	s, err := p.cli.CheckStream(ctx)
	if !stop() && err == nil {
		err = context.DeadlineExceeded
	}
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("client: opening a CheckStream to %s: %w", p.addr, err)
	}
	return s, cancel, nil
}

// checkStream is one CheckStream call to a member. Its batcher's loop
// sends requests on it, each naming its call by stream_id; a receiver
// goroutine (in Client.rpcs) reads the answers, which may come in any
// order, and hands each to its call. A call not answered by its deadline
// fails as retryable; a stream that breaks fails every call it holds as
// retryable, or sends them again as unary Checks if the node does not
// implement CheckStream.
type checkStream struct {
	b      *batcher
	s      grpc.BidiStreamingClient[pb.CheckRequest, pb.CheckResponse]
	cancel context.CancelFunc // ends the call

	mu    sync.Mutex             // guards calls and dead
	calls map[uint64]*streamCall // sent and not yet answered, by stream_id
	dead  bool                   // the receiver saw the stream end
	last  uint64                 // the last stream_id sent; the loop's only
}

// streamCall is one request on a checkStream, until it is answered,
// expires or its stream fails: whichever takes it out of calls completes it.
type streamCall struct {
	live  []*pending
	dl    time.Time
	timer *time.Timer // expires the call at dl; set under checkStream.mu
	done  chan<- struct{}
}

// stream sends live as one request on the member's stream, opening it
// first if there is none or it broke, and reports whether it did (if not,
// it has failed the items as retryable).
func (b *batcher) stream(live []*pending, dl time.Time, done chan<- struct{}) bool {
	if b.st == nil || b.st.isDead() {
		st, err := b.openStream(dl)
		if err != nil {
			b.failAll(live, err)
			return false
		}
		b.st = st
	}
	cs := b.st
	cs.last++
	id := cs.last
	req := encode(len(live), func(j int) *prepared { return &live[j].item }, b.c.Ring().Epoch(), dl)
	req.StreamId = id
	call := &streamCall{live: live, dl: dl, done: done}
	cs.mu.Lock()
	if cs.dead {
		cs.mu.Unlock()
		if time.Now().UnixNano() < b.p.noStream.Load() {
			// The node answered the stream UNIMPLEMENTED before this
			// request was registered: nothing was sent.
			b.unary(live, dl, done)
			return true
		}
		b.failAll(live, fmt.Errorf("client: CheckStream to %s (%s) broke", live[0].node, b.p.addr))
		return false
	}
	cs.calls[id] = call
	call.timer = time.AfterFunc(time.Until(dl), func() { cs.expire(id) }) // set under mu: whoever takes the call sees it
	cs.mu.Unlock()
	b.c.st.rpcs.Add(1)
	b.c.st.streamed.Add(1)
	// A failed Send means a broken stream: the receiver's Recv fails next
	// and fails every call, this one included.
	_ = cs.s.Send(req)
	return true
}

// failAll fails the items of a batch that was not sent, as retryable.
func (b *batcher) failAll(live []*pending, err error) {
	for _, pd := range live {
		pd.res <- outcome{err: err}
	}
}

// openStream opens a CheckStream to the batcher's member and starts its
// receiver. The opening waits for the connection until dl at most.
func (b *batcher) openStream(dl time.Time) (*checkStream, error) {
	s, cancel, err := b.c.openCheckStream(b.p, func(f func()) func() bool { return time.AfterFunc(time.Until(dl), f).Stop })
	if err != nil {
		return nil, err
	}
	cs := &checkStream{b: b, s: s, cancel: cancel, calls: map[uint64]*streamCall{}}
	b.c.rpcs.Add(1)
	go cs.receive()
	return cs, nil
}

func (cs *checkStream) isDead() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.dead
}

// take removes and returns call id, or nil if another path completed it.
func (cs *checkStream) take(id uint64) *streamCall {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	call := cs.calls[id]
	if call != nil {
		delete(cs.calls, id)
	}
	return call
}

// receive reads answers until the stream ends, then fails what is left.
func (cs *checkStream) receive() {
	defer cs.b.c.rpcs.Done()
	c := cs.b.c
	for {
		resp, err := cs.s.Recv()
		if err != nil {
			cs.fail(err)
			return
		}
		call := cs.take(resp.StreamId)
		if call == nil {
			continue // expired: its callers were answered
		}
		call.timer.Stop()
		live := call.live
		node := live[0].node
		emit := func(j int, o outcome) {
			if o.ierr != nil {
				o.ierr = o.ierr.at(0, j) // the caller's only item
			}
			live[j].res <- o
		}
		if f := resp.Failed; f != nil {
			st := status.New(codes.Code(f.Code), f.Message)
			o := refused(st, node, fmt.Errorf("client: CheckStream to %s (%s): %w", node, cs.b.p.addr, st.Err()))
			emitAll(len(live), emit, o)
		} else {
			c.answered(cs.b.p, node, resp, len(live), func(j int) *prepared { return &live[j].item }, emit)
		}
		call.done <- struct{}{}
	}
}

// expire fails call id, unanswered at its deadline, as retryable.
func (cs *checkStream) expire(id uint64) {
	call := cs.take(id)
	if call == nil {
		return
	}
	node := call.live[0].node
	cs.b.failAll(call.live, fmt.Errorf("client: %s (%s) did not answer a CheckStream request before its deadline", node, cs.b.p.addr))
	call.done <- struct{}{}
}

// fail ends the stream after err: its calls fail as retryable, or, if the
// node does not implement CheckStream, go again as unary Checks, as do the
// batcher's next batches for streamRetry.
func (cs *checkStream) fail(err error) {
	b := cs.b
	unimplemented := status.Code(err) == codes.Unimplemented
	if unimplemented {
		// Before the stream is marked dead: a batch that finds it dead
		// then goes as a unary Check (see stream), not as a failure.
		b.c.streamUnimplemented(b.p)
	}
	cs.mu.Lock()
	cs.dead = true
	calls := cs.calls
	cs.calls = nil
	cs.mu.Unlock()
	cs.cancel()
	if unimplemented {
		b.c.st.rpcs.Add(-int64(len(calls))) // not taken: they go as unary Checks, counted there
		b.c.st.streamed.Add(-int64(len(calls)))
	}
	for _, call := range calls { // taken out of calls here: expire finds none of them
		call.timer.Stop()
		if unimplemented {
			b.unary(call.live, call.dl, call.done) // nothing was decided
			continue
		}
		node := call.live[0].node
		b.failAll(call.live, fmt.Errorf("client: CheckStream to %s (%s): %w", node, b.p.addr, err))
		call.done <- struct{}{}
	}
}
