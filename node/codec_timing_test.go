package node

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// BenchmarkDecodeCheckRequest compares the server's decoder with
// proto.Unmarshal on batches of the client's shape (recipients, request
// ids, a content hash each).
func BenchmarkDecodeCheckRequest(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		req := &pb.CheckRequest{RingEpoch: 7}
		for i := range n {
			req.Recipients = append(req.Recipients, fmt.Sprintf("+86138%08d", i))
			req.ContentHashes = append(req.ContentHashes, uint64(i)*0x9e3779b97f4a7c15)
			req.RequestIds = append(req.RequestIds, uint64(i+1))
		}
		wire, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		for _, dec := range []struct {
			name string
			fn   func([]byte, *pb.CheckRequest) error
		}{
			{"node", decodeCheckRequest},
			{"proto", func(w []byte, r *pb.CheckRequest) error { return proto.Unmarshal(w, r) }},
		} {
			b.Run(fmt.Sprintf("%s/items=%d", dec.name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(wire)))
				for b.Loop() {
					var r pb.CheckRequest
					if err := dec.fn(wire, &r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
