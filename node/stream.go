package node

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is Limiter.CheckStream: Check for callers that send many small
// requests (a client coalescing single checks), without a unary call's
// stream setup, headers and handler goroutine per request.

// errStreamStopping ends check streams when the node shuts down.
var errStreamStopping = status.Error(codes.Unavailable, "node is shutting down: send to the new owners")

// CheckStream answers Limiter.CheckStream: it reads requests through recv
// and decides each in a goroutine of its own through the same pass as Check
// (check), at most Limits.MaxStreamRequests at once, each once it has its
// turn at the node's item gate (memlimit.go; the stream reads no more
// meanwhile), and sends each answer
// through send as soon as it is decided, with the request's stream_id. A
// request that Check would fail whole is answered with failed set. It
// returns when recv fails (io.EOF: the caller closed its side; the error is
// then nil), when ctx ends, or when the node shuts down (UNAVAILABLE), each
// time after answering every request it began to decide (serveStream). send
// is called by one goroutine at a time.
func (n *Node) CheckStream(ctx context.Context, recv func() (*pb.CheckRequest, error), send func(*pb.CheckResponse) error) error {
	if !n.ready.Load() {
		return status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	return serveStream(ctx, n.stopping, n.cfg.Limits.MaxStreamRequests, recv, send, func(req *pb.CheckRequest, reply func(*pb.CheckResponse)) {
		st := n.startStages(CallCheck, ctx)
		release, err := n.gate.acquire(ctx, n.stopping, len(req.Recipients))
		if err != nil {
			st := status.Convert(err)
			reply(&pb.CheckResponse{StreamId: req.StreamId, Failed: &pb.RequestError{Code: uint32(st.Code()), Message: st.Message()}})
			return
		}
		go func() {
			defer release()
			st.lap(StageQueue)
			resp := n.streamed(ctx, req)
			st.restart()
			reply(resp)
			st.lap(StageRespond)
		}()
	})
}

// serveStream is the loop of a stream handler (CheckStream,
// ReplicateStream). A goroutine of its own reads requests through recv
// (gRPC allows one receiver per stream) and hands each to take, on that
// goroutine, with one of limit slots held until take's work calls reply
// with the request's answer, once, which take may do itself or leave to a
// goroutine it starts; while every slot is held it reads no more (HTTP/2
// flow control then holds the sender back). reply sends the answer through
// send, one call at a time; after a failed send (which breaks the stream:
// recv fails next) it sends nothing more. serveStream returns when recv
// fails (io.EOF: the caller closed its side; the error is then nil), when
// ctx ends, or when stopping is closed (errStreamStopping), each time after
// every request taken is answered; a request read as it returns is not
// taken. Its return ends the stream (gRPC cancels ctx), which ends the
// reader.
func serveStream[Req, Resp any](ctx context.Context, stopping <-chan struct{}, limit int, recv func() (Req, error), send func(Resp) error, take func(req Req, reply func(Resp))) error {
	var (
		mu      sync.Mutex // guards closed
		closed  bool       // serveStream is returning: nothing more is taken
		wg      sync.WaitGroup
		sendMu  sync.Mutex // serializes send; guards sendErr
		sendErr error
	)
	slots := make(chan struct{}, limit)
	ended := make(chan error, 1) // the reader's last recv error
	go func() {
		for {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			req, err := recv()
			if err != nil {
				ended <- err
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				return
			}
			wg.Add(1)
			mu.Unlock()
			take(req, func(resp Resp) {
				defer wg.Done()
				defer func() { <-slots }()
				sendMu.Lock()
				defer sendMu.Unlock()
				if sendErr == nil {
					sendErr = send(resp)
				}
			})
		}
	}()
	var err error
	select {
	case err = <-ended:
		if errors.Is(err, io.EOF) {
			err = nil
		}
	case <-ctx.Done():
		err = status.FromContextError(ctx.Err()).Err()
	case <-stopping:
		err = errStreamStopping
	}
	mu.Lock()
	closed = true
	mu.Unlock()
	wg.Wait()
	return err
}

// streamed decides one request of a check stream.
func (n *Node) streamed(ctx context.Context, req *pb.CheckRequest) *pb.CheckResponse {
	resp, err := n.check(ctx, req, true)
	if err != nil {
		st := status.Convert(err)
		resp = &pb.CheckResponse{Failed: &pb.RequestError{Code: uint32(st.Code()), Message: st.Message()}}
	}
	resp.StreamId = req.StreamId
	return resp
}
