package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file is the server's side of the wire: requests to the freqring.v1
// services are decoded by their handlers, not by grpc-go, so that
//   - one recipient or domain of a CheckRequest that is not valid UTF-8 fails
//     that item alone (protobuf-go validates proto3 strings and fails the
//     whole message; decodeCheckRequest does not, and view.item fails the
//     item), and
//   - bytes that are not a request are INVALID_ARGUMENT: grpc-go answers a
//     codec error with INTERNAL, written before any handler or interceptor
//     could change it.
// The codec hands a handler's rawRequest the bytes as they came; the
// handlers of decodeInvalid decode them.

// ErrBadRequest reports request bytes that are not a protobuf message of
// the method's request type.
var ErrBadRequest = errors.New("node: undecodable request")

// rawRequest holds a request's bytes, undecoded, with a reference on them.
type rawRequest struct{ data mem.BufferSlice }

// serverCodec is package proto's gRPC codec, except that it fills a
// rawRequest with the bytes as they came. Safe for concurrent use.
type serverCodec struct{ proto encoding.CodecV2 }

func newServerCodec() serverCodec { return serverCodec{encoding.GetCodecV2("proto")} }

func (c serverCodec) Name() string { return c.proto.Name() }

func (c serverCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawRequest); ok {
		data.Ref()
		r.data = data
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// recvDecoded reads one request through recv (a handler's dec or a stream's
// RecvMsg) as raw bytes and decodes it into v: a CheckRequest with
// decodeCheckRequest, others with package proto. Bytes that do not decode
// are INVALID_ARGUMENT.
func recvDecoded(recv func(any) error, v any) error {
	var raw rawRequest
	if err := recv(&raw); err != nil {
		return err
	}
	defer raw.data.Free()
	buf := raw.data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	var err error
	if req, ok := v.(*pb.CheckRequest); ok {
		err = decodeCheckRequest(buf.ReadOnlyData(), req)
	} else if m, ok := v.(proto.Message); ok {
		if err = proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
			err = fmt.Errorf("%w: %s: %v", ErrBadRequest, m.ProtoReflect().Descriptor().Name(), err)
		}
	} else {
		panic(fmt.Sprintf("BUG: request type %T is not a proto message", v))
	}
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// decodeInvalid returns a copy of sd whose handlers decode their requests
// with recvDecoded. A stream's messages then go to check, with the stream's
// context and full method name, which may refuse them (the guard's bind:
// the Peer service's streams, whose messages name their caller).
func decodeInvalid(sd *grpc.ServiceDesc, check func(ctx context.Context, method string, req any) error) *grpc.ServiceDesc {
	c := *sd
	c.Methods = slices.Clone(sd.Methods)
	for i := range c.Methods {
		h := c.Methods[i].Handler
		c.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error {
				if rt := timingOf(ctx); rt != nil {
					start := time.Now()
					defer func() { rt.unmarshal = time.Since(start) }()
				}
				return recvDecoded(dec, v)
			}, ic)
		}
	}
	c.Streams = slices.Clone(sd.Streams)
	for i := range c.Streams {
		h := c.Streams[i].Handler
		method := "/" + sd.ServiceName + "/" + c.Streams[i].StreamName
		c.Streams[i].Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, decodingStream{ServerStream: ss, method: method, check: check})
		}
	}
	return &c
}

// decodingStream is a server stream whose RecvMsg decodes with recvDecoded,
// then lets check refuse the message.
type decodingStream struct {
	grpc.ServerStream
	method string
	check  func(ctx context.Context, method string, req any) error
}

func (s decodingStream) RecvMsg(m any) error {
	if err := recvDecoded(s.ServerStream.RecvMsg, m); err != nil {
		return err
	}
	return s.check(s.Context(), s.method, m)
}

// decodeCheckRequest decodes b into req (reset first) as proto.Unmarshal
// does, with two differences: recipients and domains are not checked for
// UTF-8 (the node fails such an item alone, see view.item), and unknown
// fields are skipped, not kept. Packed and unpacked scalars are both read;
// a known field of the wrong wire type is an unknown field, as in
// protobuf-go. Strings and contents are copied out of b; the recipients all
// into one buffer, one allocation instead of one each, so that a recipient
// string kept after the call keeps that buffer (at most len(b) bytes).
func decodeCheckRequest(b []byte, req *pb.CheckRequest) error {
	req.Reset()
	d := checkDecoder{req: req}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return decodeErr("tag", n)
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: CheckRequest: field number %d out of range", ErrBadRequest, num)
		}
		b = b[n:]
		if num > 10 || !knownType(num, typ) {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return decodeErr("field "+strconv.Itoa(int(num)), n)
			}
			b = b[n:]
			continue
		}
		n, err := d.field(num, typ, b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// checkDecoder is the state of one decodeCheckRequest.
type checkDecoder struct {
	req  *pb.CheckRequest
	rcps []byte // the recipients' bytes; never grown, so never moved
}

// field decodes the value at the start of b of known field num, of a wire
// type knownType accepts, into the request, and returns its length.
func (d *checkDecoder) field(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	req := d.req
	switch num {
	case 1, 2, 3:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, decodeErr(fieldNames[num], n)
		}
		switch num {
		case 1:
			d.recipient(v, len(b))
		case 2:
			req.Domains = append(req.Domains, string(v))
		case 3:
			req.Contents = append(req.Contents, append([]byte{}, v...))
		}
		return n, nil
	case 4:
		return consumeFixed64s(b, typ, &req.ContentHashes, fieldNames[num])
	case 7:
		return consumeFixed64s(b, typ, &req.RequestIds, fieldNames[num])
	case 5:
		return consumeVarints(b, typ, fieldNames[num], func(v uint64) { req.Costs = append(req.Costs, uint32(v)) })
	case 6:
		return consumeVarints(b, typ, fieldNames[num], func(v uint64) { req.Modes = append(req.Modes, pb.Mode(int32(v))) })
	default: // 8, 9, 10
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, decodeErr(fieldNames[num], n)
		}
		switch num {
		case 8:
			req.RingEpoch = v
		case 9:
			req.StreamId = v
		default:
			req.NotAfterMs = int64(v)
		}
		return n, nil
	}
}

// recipient appends recipient v, copied into the one buffer all of the
// request's recipients share; left is how many bytes of the message are
// left from v's field on (the buffer's capacity when it is made: every
// recipient still to come is in them).
func (d *checkDecoder) recipient(v []byte, left int) {
	if len(v) == 0 {
		d.req.Recipients = append(d.req.Recipients, "")
		return
	}
	if d.rcps == nil {
		d.rcps = make([]byte, 0, left)
	}
	start := len(d.rcps)
	d.rcps = append(d.rcps, v...)
	d.req.Recipients = append(d.req.Recipients, unsafe.String(&d.rcps[start], len(v)))
}

var fieldNames = [...]string{1: "recipients", 2: "domains", 3: "contents", 4: "content_hashes", 5: "costs", 6: "modes", 7: "request_ids", 8: "ring_epoch", 9: "stream_id", 10: "not_after_ms"}

// knownType reports whether typ is a wire type field num is read with.
func knownType(num protowire.Number, typ protowire.Type) bool {
	switch num {
	case 1, 2, 3:
		return typ == protowire.BytesType
	case 4, 7:
		return typ == protowire.Fixed64Type || typ == protowire.BytesType
	case 5, 6:
		return typ == protowire.VarintType || typ == protowire.BytesType
	case 8, 9, 10:
		return typ == protowire.VarintType
	}
	return false
}

// consumeFixed64s appends one fixed64 or a packed run of them to col.
func consumeFixed64s(b []byte, typ protowire.Type, col *[]uint64, name string) (int, error) {
	if typ == protowire.Fixed64Type {
		v, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return 0, decodeErr(name, n)
		}
		*col = append(*col, v)
		return n, nil
	}
	p, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, decodeErr(name, n)
	}
	if len(p)%8 != 0 {
		return 0, decodeErr(name, -1)
	}
	*col = slices.Grow(*col, len(p)/8)
	for ; len(p) > 0; p = p[8:] {
		v, _ := protowire.ConsumeFixed64(p)
		*col = append(*col, v)
	}
	return n, nil
}

// consumeVarints passes one varint or a packed run of them to add.
func consumeVarints(b []byte, typ protowire.Type, name string, add func(uint64)) (int, error) {
	if typ == protowire.VarintType {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, decodeErr(name, n)
		}
		add(v)
		return n, nil
	}
	p, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, decodeErr(name, n)
	}
	for len(p) > 0 {
		v, m := protowire.ConsumeVarint(p)
		if m < 0 {
			return 0, decodeErr(name, m)
		}
		add(v)
		p = p[m:]
	}
	return n, nil
}

func decodeErr(what string, n int) error {
	return fmt.Errorf("%w: CheckRequest %s: %v", ErrBadRequest, what, protowire.ParseError(n))
}
