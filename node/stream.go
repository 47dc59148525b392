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

// received is one message read from a check stream, or the error that ended it.
type received struct {
	req *pb.CheckRequest
	err error
}

// CheckStream answers Limiter.CheckStream: it reads requests through recv
// and decides each in a goroutine of its own through the same pass as Check
// (check), at most Limits.MaxStreamRequests at once, and sends each answer
// through send as soon as it is decided, with the request's stream_id. A
// request that Check would fail whole is answered with failed set. It
// returns when recv fails (io.EOF: the caller closed its side; the error is
// then nil), when ctx ends, or when the node shuts down (UNAVAILABLE), each
// time after the requests it read are answered. send is called by one
// goroutine at a time.
func (n *Node) CheckStream(ctx context.Context, recv func() (*pb.CheckRequest, error), send func(*pb.CheckResponse) error) error {
	if !n.ready.Load() {
		return status.Error(codes.Unavailable, "node is not serving: recovering or shut down")
	}
	done := make(chan struct{}) // closed when the handler returns: the reader stops
	defer close(done)
	in := make(chan received)
	go func() {
		// The reader: gRPC allows one receiver per stream. It ends with the
		// stream (the handler's return cancels ctx, which fails recv).
		for {
			req, err := recv()
			select {
			case in <- received{req, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	slots := make(chan struct{}, n.cfg.Limits.MaxStreamRequests)
	var sendMu sync.Mutex // serializes send; guards sendErr
	var sendErr error
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-n.stopping:
			wg.Wait()
			return errStreamStopping
		}
		var r received
		select {
		case r = <-in:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-n.stopping:
			wg.Wait()
			return errStreamStopping
		}
		if r.err != nil {
			wg.Wait()
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			return r.err
		}
		wg.Go(func() {
			defer func() { <-slots }()
			resp := n.streamed(ctx, r.req)
			sendMu.Lock()
			defer sendMu.Unlock()
			if sendErr == nil {
				sendErr = send(resp) // a failed send breaks the stream: recv fails next
			}
		})
	}
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
