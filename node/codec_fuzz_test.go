package node

import (
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// FuzzDecodeCheckRequest: decodeCheckRequest agrees with proto.Unmarshal on
// every input, except that it also accepts recipients and domains that are
// not UTF-8 (and drops unknown fields).
func FuzzDecodeCheckRequest(f *testing.F) {
	for _, req := range []*pb.CheckRequest{
		{Recipients: []string{"a"}},
		{Recipients: []string{"+8613800000001", "b"}, Domains: []string{"fast"}, Contents: [][]byte{[]byte("hi"), nil},
			Costs: []uint32{1, 1000}, Modes: []pb.Mode{pb.Mode_MODE_PEEK, 9}, RequestIds: []uint64{1, 1 << 63}, RingEpoch: 42, StreamId: 7, NotAfterMs: 1796567998140},
		{Recipients: []string{"x"}, ContentHashes: []uint64{7}},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// Unpacked scalars, an unknown field, a known field of the wrong wire type.
	var b []byte
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, 3)
	b = protowire.AppendTag(b, 7, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 9)
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("?"))
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	f.Add(b)
	f.Add([]byte("\x0a\x02\xff\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got pb.CheckRequest
		err := decodeCheckRequest(b, &got)
		var want pb.CheckRequest
		werr := proto.Unmarshal(b, &want)
		want.ProtoReflect().SetUnknown(nil)
		switch {
		case werr == nil && err != nil:
			t.Fatalf("decodeCheckRequest: %v; proto.Unmarshal accepts %x", err, b)
		case werr == nil && !proto.Equal(&got, &want):
			t.Fatalf("decoded %v, proto.Unmarshal %v", &got, &want)
		case werr != nil && err == nil && allUTF8(&got):
			t.Fatalf("accepted %x, which proto.Unmarshal refuses: %v", b, werr)
		}
	})
}

func allUTF8(req *pb.CheckRequest) bool {
	for _, c := range [][]string{req.Recipients, req.Domains} {
		for _, s := range c {
			if !utf8.ValidString(s) {
				return false
			}
		}
	}
	return true
}
