package node_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
)

// rawCodec sends a []byte request as it is, bytes a proto marshaller would
// refuse, and decodes responses with package proto.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// serveRaw serves a node on 127.0.0.1 and returns a connection that sends
// raw request bytes.
func serveRaw(t *testing.T) *grpc.ClientConn {
	t.Helper()
	n, err := node.New(node.Config{Name: "wire"})
	if err != nil {
		t.Fatal(err)
	}
	return dialNode(t, serveNode(t, n), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
}

// Case 6 of issue 12: a recipient or domain that is not valid UTF-8 failed
// the whole batch as INTERNAL naming no field; now it fails that item alone
// (INVALID_ARGUMENT, naming field and index) and the others are decided.
func TestInvalidUTF8FailsOnlyItsItem(t *testing.T) {
	conn := serveRaw(t)
	req := &pb.CheckRequest{
		Recipients: []string{"+8613800000001", "+86138000000\x01\x01", "+8613800000003"},
		Domains:    []string{"", "", "DOMAIN"},
	}
	// Wire bytes with the placeholders \x01\x01 and DOMAIN replaced by bytes
	// that are not UTF-8: no Go marshaller would write them.
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("\x01\x01"), []byte("\xff\xfe"), 1)
	b = bytes.Replace(b, []byte("DOMAIN"), []byte("d\xc3\x28ain"), 1)
	resp := new(pb.CheckResponse)
	if err := conn.Invoke(context.Background(), "/freqring.v1.Limiter/Check", b, resp); err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := map[uint32]string{
		1: `recipients[1]: "+86138000000\xff\xfe" is not valid UTF-8`,
		2: `domains[2]: "d\xc3(ain" is not valid UTF-8`,
	}
	if len(resp.Errors) != len(want) {
		t.Fatalf("errors %v, want %d", resp.Errors, len(want))
	}
	for _, e := range resp.Errors {
		if e.Code != uint32(codes.InvalidArgument) || e.Message != want[e.Index] {
			t.Errorf("item %d: code %d %q, want INVALID_ARGUMENT %q", e.Index, e.Code, e.Message, want[e.Index])
		}
	}
	if !resp.Admitted[0] || !resp.Recorded[0] || resp.Recorded[1] || resp.Recorded[2] {
		t.Fatalf("admitted %v recorded %v: want item 0 decided, 1 and 2 not", resp.Admitted, resp.Recorded)
	}
}

// Case 6 of issue 12: bytes that are not a protobuf message were INTERNAL.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	conn := serveRaw(t)
	garbage := []byte{0xff, 0xff, 0xff, 0xff}
	for _, method := range []string{"/freqring.v1.Limiter/Check", "/freqring.v1.Peer/Forward", "/freqring.v1.Limiter/Status", "/freqring.v1.Peer/Acquire"} {
		err := conn.Invoke(context.Background(), method, garbage, new(pb.CheckResponse))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "undecodable request") {
			t.Errorf("%s with garbage: %v, want INVALID_ARGUMENT", method, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, sd := range pb.Limiter_ServiceDesc.Streams { // WatchRing, CheckStream
		method := "/freqring.v1.Limiter/" + sd.StreamName
		st, err := conn.NewStream(ctx, &sd, method)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(garbage); err != nil {
			t.Fatal(err)
		}
		st.CloseSend()
		if err := st.RecvMsg(new(pb.RingResponse)); status.Code(err) != codes.InvalidArgument || err == io.EOF {
			t.Errorf("%s with garbage: %v, want INVALID_ARGUMENT", method, err)
		}
	}
}
