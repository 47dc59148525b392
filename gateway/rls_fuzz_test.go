package gateway

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

const fuzzRules = `domains:
  - name: default
    rules:
      - {name: r, scope: recipient, limit: 3, window: 1m}
  - name: sms
    rules:
      - {name: c, scope: recipient+content, limit: 1, window: 1m}
envoy:
  - domain: default
    descriptors:
      - {key: recipient, content: content, request_id: request_id}
  - domain: mesh
    descriptors:
      - {match: {generic_key: sms}, domain: sms, key: [tenant, user], content: template, request_id: rid}
      - {key: remote_address}
`

// FuzzTranslateRLS feeds arbitrary RateLimitRequest bytes to translate: it
// never panics, and it either refuses the call with INVALID_ARGUMENT or
// returns a request the node accepts the shape of: one status slot per
// descriptor, items only for matched ones, each with a recipient of 1 to
// 256 bytes of valid UTF-8, a known domain, a cost of 1 to 1000 and a
// refund only with a request id.
func FuzzTranslateRLS(f *testing.F) {
	rs, err := rules.Parse("fuzz", []byte(fuzzRules))
	if err != nil {
		f.Fatal(err)
	}
	entry := func(k, v string) *commonv3.RateLimitDescriptor_Entry {
		return &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{entry("recipient", "a"), entry("content", "x")}}}},
		{Domain: "default", HitsAddend: 3, Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{entry("recipient", "a"), entry("request_id", "q")}, IsNegativeHits: true, HitsAddend: wrapperspb.UInt64(0)}}},
		{Domain: "mesh", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{entry("generic_key", "sms"), entry("tenant", "t"), entry("user", "u"), entry("template", "otp")}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{entry("remote_address", "10.0.0.1")}, HitsAddend: wrapperspb.UInt64(1001)},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{entry("path", "/")}},
		}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		before := proto.Clone(&r)
		c, err := translate(rs, &r)
		if !proto.Equal(before, &r) {
			t.Fatal("translate changed its request")
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
				t.Fatalf("error %v is not INVALID_ARGUMENT with a message", err)
			}
			return
		}
		req := c.req
		if len(c.index) != len(r.Descriptors) {
			t.Fatalf("%d index entries for %d descriptors", len(c.index), len(r.Descriptors))
		}
		items := 0
		for i, k := range c.index {
			if k < 0 {
				continue
			}
			if k != items {
				t.Fatalf("descriptor %d is item %d, want %d", i, k, items)
			}
			items++
		}
		if len(req.Recipients) != items || len(req.Domains) != items || len(req.Contents) != items || len(req.Costs) != items || len(req.Modes) != items ||
			(req.RequestIds != nil && len(req.RequestIds) != items) {
			t.Fatalf("columns do not have %d entries: %v", items, req)
		}
		for k, rec := range req.Recipients {
			if rec == "" || len(rec) > maxRecipientBytes || !utf8.ValidString(rec) {
				t.Fatalf("item %d recipient %q", k, rec)
			}
			if rs.Domain(req.Domains[k]) == nil {
				t.Fatalf("item %d domain %q", k, req.Domains[k])
			}
			if req.Costs[k] < 1 || req.Costs[k] > MaxCost {
				t.Fatalf("item %d cost %d", k, req.Costs[k])
			}
			if req.Modes[k] == pb.Mode_MODE_REFUND && (req.RequestIds == nil || req.RequestIds[k] == 0) {
				t.Fatalf("item %d is a refund without a request id", k)
			}
		}
	})
}

// FuzzDecodeRLS feeds arbitrary bytes to decodeRLS as a server's codec
// would: it never panics, and it either decodes them as proto.Unmarshal
// does or refuses them with INVALID_ARGUMENT and a message, naming the
// field when a string of bytes in wire format is not valid UTF-8.
func FuzzDecodeRLS(f *testing.F) {
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "recipient", Value: "a"}}}}},
		{Domain: "mesh", HitsAddend: 2, Descriptors: []*commonv3.RateLimitDescriptor{{}, {Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "@@"}, {Key: "@@"}}}}},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(bytes.ReplaceAll(b, []byte("@@"), []byte("\xff\xfe")))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dec := func(v any) error {
			if err := proto.Unmarshal(b, v.(proto.Message)); err != nil {
				return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
			}
			return nil
		}
		var got rlsv3.RateLimitRequest
		err := decodeRLS(dec, &got)
		var want rlsv3.RateLimitRequest
		wantErr := proto.Unmarshal(b, &want)
		switch {
		case err == nil && wantErr == nil:
			if !proto.Equal(&got, &want) {
				t.Fatalf("decoded %v, want %v", &got, &want)
			}
		case err == nil:
			t.Fatalf("decoded what proto.Unmarshal refuses: %v", wantErr)
		case wantErr == nil:
			t.Fatalf("refused what proto.Unmarshal decodes: %v", err)
		case status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "":
			t.Fatalf("error %v is not INVALID_ARGUMENT with a message", err)
		case strings.Contains(wantErr.Error(), "invalid UTF-8") && proto.Unmarshal(b, &emptypb.Empty{}) == nil && !strings.Contains(err.Error(), "is not valid UTF-8"):
			t.Fatalf("error %v does not name the string that is not UTF-8", err)
		}
	})
}
