package client

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// maxIdleBatchStreams bounds the idle CheckStreams a peer keeps for
// CheckBatch's requests; a stream returned to a full pool is closed. Each
// counts as one of the node's concurrent calls per connection
// (node.Limits.MaxStreams, 256 by default).
const maxIdleBatchStreams = 64

// batchStream is a CheckStream that carries one CheckBatch request at a
// time: the caller sends the request and reads its answer itself, so no
// goroutine hands answers over and none need matching.
type batchStream struct {
	s      grpc.BidiStreamingClient[pb.CheckRequest, pb.CheckResponse]
	cancel context.CancelFunc // ends the call
	last   uint64             // the last stream_id sent
}

// batchStreams is a peer's pool of idle batchStreams.
type batchStreams struct {
	mu     sync.Mutex // guards idle and closed
	idle   []*batchStream
	closed bool // the peer is closed: streams returned are closed
}

// take returns an idle stream, or nil if there is none.
func (ps *batchStreams) take() *batchStream {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.idle) == 0 {
		return nil
	}
	bs := ps.idle[len(ps.idle)-1]
	ps.idle = ps.idle[:len(ps.idle)-1]
	return bs
}

// put keeps bs for the next request, or closes it if the pool is full or
// closed.
func (ps *batchStreams) put(bs *batchStream) {
	ps.mu.Lock()
	if !ps.closed && len(ps.idle) < maxIdleBatchStreams {
		ps.idle = append(ps.idle, bs)
		bs = nil
	}
	ps.mu.Unlock()
	if bs != nil {
		bs.cancel()
	}
}

// drop closes every idle stream; with closing set the pool keeps none
// after.
func (ps *batchStreams) drop(closing bool) {
	ps.mu.Lock()
	idle := ps.idle
	ps.idle = nil
	ps.closed = ps.closed || closing
	ps.mu.Unlock()
	for _, bs := range idle {
		bs.cancel()
	}
}

// batchRPC sends n items to p in one request, on one of p's CheckStreams
// unless Config.UnaryChecks is set or p does not implement CheckStream (then
// as a unary Check), and emits each item's outcome, as rpc does.
func (c *Client) batchRPC(ctx context.Context, p *peer, node string, n int, at func(int) *prepared, emit func(int, outcome)) {
	if !c.useStream(p) {
		c.rpc(ctx, p, node, n, at, emit)
		return
	}
	dl, _ := ctx.Deadline()
	req := encode(n, at, c.Ring().Epoch(), dl)
	resp, err := c.streamCheck(ctx, p, req)
	if status.Code(err) == codes.Unimplemented {
		c.streamUnimplemented(p) // an older node: nothing was decided
		c.rpc(ctx, p, node, n, at, emit)
		return
	}
	c.st.rpcs.Add(1)
	c.st.streamed.Add(1)
	if err == nil && resp.Failed != nil {
		err = status.Error(codes.Code(resp.Failed.Code), resp.Failed.Message)
	}
	if err != nil {
		o := refused(status.Convert(err), node, fmt.Errorf("client: CheckStream to %s (%s): %w", node, p.addr, err))
		emitAll(n, emit, o)
		return
	}
	c.answered(p, node, resp, n, at, emit)
}

// streamCheck sends req on an idle stream of p's pool, or a new one, and
// reads its answer, until ctx ends. A stream that answered goes back to the
// pool. A stream taken from the pool that fails before ctx ends was
// probably broken while idle (its connection was lost): the pool is emptied
// and req goes once more, on a new stream; a request decided before the
// break is answered from the node's idempotency table, as any retry is.
func (c *Client) streamCheck(ctx context.Context, p *peer, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	for attempt := 0; ; attempt++ {
		var bs *batchStream
		if attempt == 0 {
			bs = p.streams.take()
		}
		reused := bs != nil
		if bs == nil {
			s, cancel, err := c.openCheckStream(p, func(f func()) func() bool { return context.AfterFunc(ctx, f) })
			if err != nil {
				return nil, ctxErr(ctx, err)
			}
			bs = &batchStream{s: s, cancel: cancel}
		}
		resp, err := bs.call(ctx, req, &p.streams)
		if err == nil {
			return resp, nil
		}
		if reused && ctx.Err() == nil && status.Code(err) != codes.Unimplemented {
			p.streams.drop(false)
			continue
		}
		return nil, ctxErr(ctx, err)
	}
}

// call sends req on bs and reads its answer, until ctx ends. It returns bs
// to pool after an answer read before ctx ended, and closes it otherwise:
// its state is then unknown.
func (bs *batchStream) call(ctx context.Context, req *pb.CheckRequest, pool *batchStreams) (*pb.CheckResponse, error) {
	bs.last++
	req.StreamId = bs.last
	stop := context.AfterFunc(ctx, bs.cancel)
	err := bs.s.Send(req)
	resp := new(pb.CheckResponse)
	if err == nil {
		err = bs.s.RecvMsg(resp)
	} else {
		// A failed Send (io.EOF) leaves the reason to Recv.
		_, err = bs.s.Recv()
		if err == nil {
			err = status.Error(codes.Internal, "the node answered a request it could not have read")
		}
	}
	if err == nil && resp.StreamId != req.StreamId {
		err = status.Errorf(codes.Internal, "answer to stream_id %d for request %d", resp.StreamId, req.StreamId)
	}
	if !stop() || err != nil {
		bs.cancel()
		return resp, err
	}
	pool.put(bs)
	return resp, nil
}

// ctxErr is err, or ctx's error as a status if ctx ended (a stream then
// fails with Canceled, where a unary call reports DeadlineExceeded).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return err
}
