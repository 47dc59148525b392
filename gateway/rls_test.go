package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/gateway"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

// rlsFixture is a real node serving gRPC on 127.0.0.1 with the RLS
// registered through node.Config.Services, and an Envoy RLS client: the
// go-control-plane types Envoy's filter sends, standing in for Envoy.
type rlsFixture struct {
	t       testing.TB
	n       *node.Node
	clk     *testClock
	rls     rlsv3.RateLimitServiceClient
	limiter pb.LimiterClient
	conn    *grpc.ClientConn
	serving atomic.Bool
}

func newRLSFixture(t testing.TB, rulesYAML string) *rlsFixture {
	t.Helper()
	rs, err := rules.Parse("test", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	f := &rlsFixture{t: t, clk: &testClock{}}
	f.clk.ns.Store(t0 * 1e6)
	f.serving.Store(true)
	register := func(r grpc.ServiceRegistrar, n *node.Node) {
		rls, err := gateway.NewRLS(gateway.RLSConfig{Checker: n, Rules: n.RuleSet, Serving: func() bool { return f.serving.Load() && n.Serving() }})
		if err != nil {
			t.Fatal(err)
		}
		rls.Register(r)
	}
	n, err := node.New(node.Config{Rules: rs, Clock: f.clk, SweepInterval: -1, Services: []func(grpc.ServiceRegistrar, *node.Node){register}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.n = n
	t.Cleanup(func() { n.Close() })
	srv, _ := n.NewGRPCServer()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	f.rls = rlsv3.NewRateLimitServiceClient(cc)
	f.limiter = pb.NewLimiterClient(cc)
	f.conn = cc
	return f
}

// desc is a descriptor of "key=value" entries.
func desc(entries ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func (f *rlsFixture) call(domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
}

func (f *rlsFixture) ok(domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	f.t.Helper()
	resp, err := f.call(domain, hits, ds...)
	if err != nil {
		f.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN || len(resp.Statuses) != len(ds) {
		f.t.Fatalf("answer %v: overall UNKNOWN or not one status per descriptor", resp)
	}
	return resp
}

// used peeks at the recipient's count under its domain's first rule.
func (f *rlsFixture) used(domain, recipient string) uint32 { return f.usedBy(domain, recipient, 0) }

// usedBy peeks at the recipient's count under its domain's rule k.
func (f *rlsFixture) usedBy(domain, recipient string, k int) uint32 {
	f.t.Helper()
	resp, err := f.limiter.Check(context.Background(), &pb.CheckRequest{Recipients: []string{recipient}, Domains: []string{domain}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
	if err != nil || len(resp.Errors) > 0 {
		f.t.Fatalf("peek %s: %v %v", recipient, err, resp.GetErrors())
	}
	return resp.Used[k]
}

func headers(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		m[h.Key] = h.Value
	}
	return m
}

func wantCode(t testing.TB, err error, code codes.Code, substr string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), substr) {
		t.Fatalf("error %v, want %s containing %q", err, code, substr)
	}
}

// TestRLSAdmitsThenOverLimit: the conventional mapping (Envoy domain =
// freqring domain, entries recipient and content) admits up to the limit,
// then answers OVER_LIMIT exactly at it, with the rule's name, limit,
// remaining, the exact time until it admits and the rate-limit headers.
func TestRLSAdmitsThenOverLimit(t *testing.T) {
	f := newRLSFixture(t, testRules)
	for i := range 3 {
		resp := f.ok("default", 0, desc("recipient=+100", "content=m"+string(rune('a'+i))))
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK ||
			st.CurrentLimit.GetName() != "recipient-1m" || st.CurrentLimit.GetRequestsPerUnit() != 3 ||
			st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.LimitRemaining != uint32(2-i) ||
			st.DurationUntilReset.AsDuration() != 0 {
			t.Fatalf("send %d: %v", i, resp)
		}
		if h := headers(resp); h["RateLimit-Policy"] != `"recipient-1m";q=3;w=60` || h["RateLimit"] != `"recipient-1m";r=`+string(rune('0'+2-i))+";t=0" || h["Retry-After"] != "" {
			t.Fatalf("send %d headers: %v", i, h)
		}
		f.clk.advance(10*time.Second + 300*time.Millisecond)
	}
	// 30.9 s after the first send: it leaves the window 29.1 s from now.
	resp := f.ok("default", 0, desc("recipient=+100", "content=md"))
	st := resp.Statuses[0]
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		st.CurrentLimit.GetName() != "recipient-1m" || st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() != 29_100*time.Millisecond {
		t.Fatalf("fourth send: %v", resp)
	}
	if h := headers(resp); h["RateLimit"] != `"recipient-1m";r=0;t=30` || h["Retry-After"] != "30" {
		t.Fatalf("fourth send headers: %v", h)
	}
	if got := f.used("default", "+100"); got != 3 {
		t.Fatalf("used %d after a denied call, want 3", got)
	}
	f.clk.advance(29_100*time.Millisecond - time.Millisecond)
	if resp := f.ok("default", 0, desc("recipient=+100")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1 ms before the reset: %v", resp)
	}
	f.clk.advance(time.Millisecond)
	if resp := f.ok("default", 0, desc("recipient=+100")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("at the reset: %v", resp)
	}
}

// TestRLSHitsAddend: the request's hits_addend is each descriptor's cost
// unless the descriptor sets its own; an explicit 0 peeks; a cost that
// reaches the limit exactly is admitted and the next send is not; more
// than 1000 is refused naming the field.
func TestRLSHitsAddend(t *testing.T) {
	f := newRLSFixture(t, testRules)
	if resp := f.ok("default", 2, desc("recipient=h")); resp.Statuses[0].LimitRemaining != 1 || f.used("default", "h") != 2 {
		t.Fatalf("request hits_addend 2: %v", resp)
	}
	zero := desc("recipient=h")
	zero.HitsAddend = wrapperspb.UInt64(0)
	if resp := f.ok("default", 5, zero); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 || f.used("default", "h") != 2 {
		t.Fatalf("descriptor hits_addend 0 (a peek): %v", resp)
	}
	one := desc("recipient=h")
	one.HitsAddend = wrapperspb.UInt64(1)
	if resp := f.ok("default", 7, one); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("descriptor hits_addend 1 over the request's 7, reaching the limit: %v", resp)
	}
	if resp := f.ok("default", 0, desc("recipient=h")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("one past the limit: %v", resp)
	}
	_, err := f.call("default", 1001, desc("recipient=i"))
	wantCode(t, err, codes.InvalidArgument, "hits_addend: 1001 is more than 1000")
	big := desc("recipient=i")
	big.HitsAddend = wrapperspb.UInt64(1 << 40)
	_, err = f.call("default", 0, desc("recipient=i"), big)
	wantCode(t, err, codes.InvalidArgument, "descriptors[1].hits_addend: 1099511627776 is more than 1000")
	if got := f.used("default", "i"); got != 0 {
		t.Fatalf("a refused call recorded %d sends", got)
	}
}

// TestRLSSeveralDescriptors: each descriptor gets its status; an unmapped
// one is OK without a limit; when one is OVER_LIMIT the others' sends are
// taken back, so the node counts only what Envoy forwards.
func TestRLSSeveralDescriptors(t *testing.T) {
	f := newRLSFixture(t, testRules)
	f.ok("fast", 2, desc("recipient=b")) // b is at its limit of 2
	resp := f.ok("default", 0, desc("recipient=a"), desc("generic_key=other"), desc("recipient=c", "content=x"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[1].CurrentLimit != nil || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK ||
		f.used("default", "a") != 1 || f.used("default", "c") != 1 {
		t.Fatalf("three descriptors, all OK: %v", resp)
	}
	// a and c in default, then b in fast: Envoy's domain picks the mapping,
	// so b is checked in domain fast through a second Envoy domain.
	resp = f.ok("fast", 0, desc("recipient=d"), desc("recipient=b"), desc("recipient=e"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[2].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[1].CurrentLimit.GetName() != "r-2-1500ms" || resp.Statuses[1].DurationUntilReset.AsDuration() != 1500*time.Millisecond {
		t.Fatalf("one descriptor over its limit: %v", resp)
	}
	if h := headers(resp); h["RateLimit"] != `"r-2-1500ms";r=0;t=2` || h["Retry-After"] != "2" {
		t.Fatalf("headers name the denying descriptor's rule: %v", h)
	}
	if d, e := f.used("fast", "d"), f.used("fast", "e"); d != 0 || e != 0 {
		t.Fatalf("the admitted descriptors of a call answered OVER_LIMIT still count %d and %d sends; want them taken back", d, e)
	}
}

// TestRLSNegativeHits: is_negative_hits takes back the send that the
// descriptor's request id recorded; a repeat or an unknown id changes
// nothing and is OK; without a request id entry it is refused. A repeated
// request id is refused (ALREADY_EXISTS), and counts once more only after
// its send was taken back.
func TestRLSNegativeHits(t *testing.T) {
	f := newRLSFixture(t, testRules)
	f.ok("default", 0, desc("recipient=n", "content=hello", "request_id=req-1"))
	f.ok("default", 0, desc("recipient=n", "request_id=req-2"))
	if got := f.used("default", "n"); got != 2 {
		t.Fatalf("used %d, want 2", got)
	}
	// A repeat of req-1 is refused: an OK would let Envoy forward it uncounted.
	_, err := f.call("default", 0, desc("recipient=n", "content=hello", "request_id=req-1"))
	wantCode(t, err, codes.AlreadyExists, "descriptors[0]: request id")
	if got := f.used("default", "n"); got != 2 {
		t.Fatalf("a repeated request id: used %d, want 2", got)
	}
	neg := desc("recipient=n", "content=hello", "request_id=req-1")
	neg.IsNegativeHits = true
	for i := range 2 {
		resp := f.ok("default", 0, neg)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 || f.used("default", "n") != 1 {
			t.Fatalf("negative hits %d: %v, used %d", i, resp, f.used("default", "n"))
		}
	}
	unknown := desc("recipient=n", "request_id=never")
	unknown.IsNegativeHits = true
	if resp := f.ok("default", 0, unknown); resp.OverallCode != rlsv3.RateLimitResponse_OK || f.used("default", "n") != 1 {
		t.Fatalf("negative hits of an unknown id: %v", resp)
	}
	// A new attempt under the refunded id counts again, once.
	if resp := f.ok("default", 0, desc("recipient=n", "content=hello", "request_id=req-1")); resp.OverallCode != rlsv3.RateLimitResponse_OK || f.used("default", "n") != 2 {
		t.Fatalf("a new attempt after the refund: %v, used %d; want OK and 2", resp, f.used("default", "n"))
	}
	noID := desc("recipient=n")
	noID.IsNegativeHits = true
	_, err = f.call("default", 0, noID)
	wantCode(t, err, codes.InvalidArgument, `descriptors[0].is_negative_hits: a refund takes back the send a request id recorded`)
	// The id is the mapping's domain, content and entry value hashed: other
	// content names another id, which recorded nothing.
	other := desc("recipient=n", "content=other", "request_id=req-2")
	other.IsNegativeHits = true
	if resp := f.ok("default", 0, other); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("negative hits with other content: %v", resp)
	}
	if got := f.used("default", "n"); got != 2 {
		t.Fatalf("refused or empty refunds changed the count to %d, want 2", got)
	}
}

// TestRLSRequestIDs: request ids and the roll-back. A roll-back never
// takes back a send an earlier call recorded; a new attempt after a
// roll-back counts; a call denied by a peek takes back its one recorded
// send; one x-request-id may name items of two domains.
func TestRLSRequestIDs(t *testing.T) {
	f := newRLSFixture(t, testRules+`envoy:
  - domain: mesh
    descriptors:
      - {match: {tier: slow}, domain: default, key: user, request_id: rid}
      - {match: {tier: fast}, domain: fast, key: user, request_id: rid}
`)
	used := func(domain, r string) uint32 {
		t.Helper()
		return f.used(domain, r)
	}
	// A call denied in part repeats an id that an earlier, forwarded call
	// recorded: that send stays counted.
	f.ok("mesh", 0, desc("tier=fast", "user=a", "rid=X"))
	f.ok("mesh", 2, desc("tier=fast", "user=b"))
	_, err := f.call("mesh", 0, desc("tier=fast", "user=a", "rid=X"), desc("tier=fast", "user=b"))
	wantCode(t, err, codes.AlreadyExists, "descriptors[0]: request id")
	if got := used("fast", "a"); got != 1 {
		t.Fatalf("a counts %d sends after a refused repeat; the forwarded first call's send must stay: want 1", got)
	}
	// Rolled back, then retried under the same id once b admits: counted.
	if resp := f.ok("mesh", 0, desc("tier=fast", "user=c", "rid=Y"), desc("tier=fast", "user=b")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || used("fast", "c") != 0 {
		t.Fatalf("denied call: %v, c counts %d", resp, used("fast", "c"))
	}
	f.clk.advance(1500 * time.Millisecond)
	if resp := f.ok("mesh", 0, desc("tier=fast", "user=c", "rid=Y"), desc("tier=fast", "user=b")); resp.OverallCode != rlsv3.RateLimitResponse_OK || used("fast", "c") != 1 {
		t.Fatalf("retry after the roll-back: %v, c counts %d; want OK and 1", resp, used("fast", "c"))
	}
	// One recording descriptor beside a peek over its limit: taken back.
	f.ok("mesh", 2, desc("tier=fast", "user=d"))
	peek := desc("tier=fast", "user=d")
	peek.HitsAddend = wrapperspb.UInt64(0)
	if resp := f.ok("mesh", 0, desc("tier=fast", "user=e"), peek); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || used("fast", "e") != 0 {
		t.Fatalf("record beside a denying peek: %v, e counts %d; want OVER_LIMIT and 0", resp, used("fast", "e"))
	}
	// One x-request-id, one user, two domains: two items, both counted.
	if resp := f.ok("mesh", 0, desc("tier=slow", "user=u", "rid=R"), desc("tier=fast", "user=u", "rid=R")); resp.OverallCode != rlsv3.RateLimitResponse_OK ||
		used("default", "u") != 1 || used("fast", "u") != 1 {
		t.Fatalf("one id in two domains: %v", resp)
	}
}

// TestRLSBadCalls: a call that cannot be translated is INVALID_ARGUMENT
// naming the domain, descriptor, entry or field and the value, and records
// nothing.
func TestRLSBadCalls(t *testing.T) {
	f := newRLSFixture(t, testRules)
	override := desc("recipient=z")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: 2}
	for _, tc := range []struct {
		name   string
		domain string
		ds     []*commonv3.RateLimitDescriptor
		want   string
	}{
		{"unknown domain", "nope", []*commonv3.RateLimitDescriptor{desc("recipient=z")}, `domain "nope": not an Envoy domain of the rules (have default, fast)`},
		{"no descriptors", "default", nil, "descriptors: none"},
		{"empty recipient", "default", []*commonv3.RateLimitDescriptor{desc("recipient=z"), desc("content=c", "recipient=")}, "descriptors[1].entries[1] (recipient): value is empty"},
		{"long recipient", "default", []*commonv3.RateLimitDescriptor{desc("recipient=" + strings.Repeat("z", 257))}, "descriptors[0]: recipient key from recipient is 257 bytes, more than 256"},
		{"limit override", "default", []*commonv3.RateLimitDescriptor{override}, "descriptors[0].limit: per-request limit overrides are not supported"},
		{"empty request id", "default", []*commonv3.RateLimitDescriptor{desc("recipient=z", "request_id=")}, "descriptors[0].entries[1] (request_id): value is empty"},
	} {
		_, err := f.call(tc.domain, 0, tc.ds...)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT containing %q", tc.name, err, tc.want)
		}
	}
	if got := f.used("default", "z"); got != 0 {
		t.Fatalf("refused calls recorded %d sends", got)
	}
}

// rawCodec sends a request's bytes as they are (an Envoy that does not
// check UTF-8), and decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}
func (rawCodec) Name() string { return "proto" }

// TestRLSInvalidUTF8: a call whose domain, entry key or entry value is not
// valid UTF-8 (which protobuf refuses to decode, so that grpc-go answered
// INTERNAL) is INVALID_ARGUMENT naming the descriptor, the entry and its
// key; nothing is recorded, and the next call is decided.
func TestRLSInvalidUTF8(t *testing.T) {
	f := newRLSFixture(t, testRules)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"recipient", &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{desc("recipient=z"), desc("content=c", "recipient=z@@")}},
			`descriptors[1].entries[1] (recipient): value "zz\xff" is not valid UTF-8`},
		{"content", &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{desc("recipient=z", "content=@@")}},
			`descriptors[0].entries[1] (content): value "z\xff" is not valid UTF-8`},
		{"key", &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{desc("recipient=z", "@@=c")}},
			`descriptors[0].entries[1]: key "z\xff" is not valid UTF-8`},
		{"domain", &rlsv3.RateLimitRequest{Domain: "@@", Descriptors: []*commonv3.RateLimitDescriptor{desc("recipient=z")}},
			`domain "z\xff" is not valid UTF-8`},
	} {
		b, err := proto.Marshal(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("@@"), []byte("z\xff"))
		var resp rlsv3.RateLimitResponse
		err = f.conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", b, &resp, grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT containing %s", tc.name, err, tc.want)
		}
	}
	if got := f.used("default", "z"); got != 0 {
		t.Fatalf("refused calls recorded %d sends", got)
	}
	f.ok("default", 0, desc("recipient=z"))
}

// TestRLSEnvoySection: an envoy section maps another Envoy domain, with
// match entries and a key of two entries, and follows a reload; a content
// rule does not bind a descriptor without content.
func TestRLSEnvoySection(t *testing.T) {
	const section = testRules + `  - name: sms
    rules:
      - {name: per-template, scope: recipient+content, limit: 1, window: 1m}
      - {name: per-user, scope: recipient, limit: 4, window: 1m}
envoy:
  - domain: mesh
    descriptors:
      - match: {generic_key: sms}
        domain: sms
        key: [tenant, user]
        content: template
      - domain: fast
        key: remote_address
`
	f := newRLSFixture(t, testRules)
	_, err := f.call("mesh", 0, desc("generic_key=sms", "tenant=t1", "user=u"))
	wantCode(t, err, codes.InvalidArgument, `domain "mesh": not an Envoy domain`)
	rs, err := rules.Parse("reloaded", []byte(section))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.n.Reload(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	resp := f.ok("mesh", 0, desc("generic_key=sms", "tenant=t1", "user=u"))
	if st := resp.Statuses[0]; st.CurrentLimit.GetName() != "per-user" || st.LimitRemaining != 3 {
		t.Fatalf("without content the recipient rule binds: %v", resp)
	}
	if got := f.usedBy("sms", "t1\x1fu", 1); got != 1 {
		t.Fatalf("key of tenant and user: used %d, want 1", got)
	}
	resp = f.ok("mesh", 0, desc("generic_key=sms", "tenant=t1", "user=u", "template=otp"))
	if st := resp.Statuses[0]; st.CurrentLimit.GetName() != "per-template" || st.LimitRemaining != 0 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Fatalf("with content the content rule binds: %v", resp)
	}
	resp = f.ok("mesh", 0, desc("generic_key=email", "tenant=t1", "user=u"), desc("remote_address=10.0.0.1"), desc("remote_address=10.0.0.1", "path=/x"))
	if resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetName() != "r-2-1500ms" || resp.Statuses[2].CurrentLimit != nil {
		t.Fatalf("match values and extra entries decide which descriptors are limited: %v", resp)
	}
	_, err = f.call("default", 0, desc("recipient=x"))
	wantCode(t, err, codes.InvalidArgument, `domain "default": not an Envoy domain of the rules (have mesh)`)
}

// TestRLSUnavailable: while the node does not serve, or when it fails, the
// call is UNAVAILABLE (so that Envoy's failure_mode_deny applies), never
// an answer.
func TestRLSUnavailable(t *testing.T) {
	f := newRLSFixture(t, testRules)
	f.serving.Store(false)
	_, err := f.call("default", 0, desc("recipient=u"))
	wantCode(t, err, codes.Unavailable, "not serving")

	rs, _ := rules.Parse("test", []byte(testRules))
	for _, fail := range []gateway.Checker{
		checkFunc(func(*pb.CheckRequest) (*pb.CheckResponse, error) {
			return nil, status.Error(codes.ResourceExhausted, "store full")
		}),
		checkFunc(func(r *pb.CheckRequest) (*pb.CheckResponse, error) { return answer(r, false, codes.Unavailable), nil }),
		checkFunc(func(*pb.CheckRequest) (*pb.CheckResponse, error) { return nil, errors.New("no status") }),
	} {
		s, err := gateway.NewRLS(gateway.RLSConfig{Checker: fail, Rules: func() *rules.Set { return rs }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "default", Descriptors: []*commonv3.RateLimitDescriptor{desc("recipient=u")}})
		wantCode(t, err, codes.Unavailable, "freqring: ")
	}
	if _, err := gateway.NewRLS(gateway.RLSConfig{Rules: func() *rules.Set { return rs }}); err == nil {
		t.Fatal("NewRLS without a Checker")
	}
}

// TestRLSMatchesReference replays seeded random Envoy calls (one to three
// descriptors over six recipients; hits 1 or 2, or an explicit 0 that
// peeks; half of them with a request id; the clock moving 0 to 700 ms
// between calls; some calls repeated: a denied one, which is a new attempt,
// or one answered OK, whose ids are refused) and checks every descriptor's
// code and remaining against a brute-force sliding window that counts only
// the sends of calls answered OK, item by item in call order: the
// all-or-nothing calls, the roll-back, request ids and the window's edges
// are exact.
func TestRLSMatchesReference(t *testing.T) {
	const rulesYAML = `domains:
  - name: d
    rules:
      - {name: three-per-2s, scope: recipient, limit: 3, window: 2s}
      - {name: roomy, scope: recipient, limit: 1000, window: 1h}
`
	const limit, window = 3, int64(2000)
	f := newRLSFixture(t, rulesYAML)
	rng := rand.New(rand.NewPCG(15, 3))
	type send struct{ at, cost int64 }
	hist := map[string][]send{} // the sends of calls answered OK
	now := int64(t0)
	var lastDenied, lastOK []refItem // calls to repeat; lastOK only with a recorded id
	repeats, refused, rolledBack := 0, 0, 0
	for call := range 600 {
		var items []refItem
		switch x := rng.IntN(100); {
		case x < 12 && lastDenied != nil:
			items, lastDenied = lastDenied, nil
			repeats++
		case x < 20 && lastOK != nil:
			items, lastOK = lastOK, nil
			_, err := f.call("d", 0, descsOf(items)...)
			wantCode(t, err, codes.AlreadyExists, "request id")
			refused++
			continue
		default:
			for i := range 1 + rng.IntN(3) {
				it := refItem{r: "r" + strconv.Itoa(rng.IntN(6)), cost: int64(rng.IntN(3))}
				if rng.IntN(2) == 0 {
					it.id = "id-" + strconv.Itoa(call) + "-" + strconv.Itoa(i)
				}
				items = append(items, it)
			}
		}
		var pending []struct {
			r string
			s send
		}
		wantOK := true
		want := make([]rlsv3.RateLimitResponse_Code, len(items))
		wantRemaining := make([]uint32, len(items))
		for i, it := range items {
			used := int64(0)
			for _, s := range hist[it.r] {
				if now-s.at < window {
					used += s.cost
				}
			}
			for _, p := range pending {
				if p.r == it.r {
					used += p.s.cost
				}
			}
			cost := max(it.cost, 1)
			if used+cost <= limit {
				want[i] = rlsv3.RateLimitResponse_OK
				if it.cost > 0 {
					pending = append(pending, struct {
						r string
						s send
					}{it.r, send{now, cost}})
					used += cost
				}
			} else {
				want[i] = rlsv3.RateLimitResponse_OVER_LIMIT
				wantOK = false
			}
			wantRemaining[i] = uint32(max(limit-used, 0))
		}
		resp := f.ok("d", 0, descsOf(items)...)
		if got := resp.OverallCode == rlsv3.RateLimitResponse_OK; got != wantOK {
			t.Fatalf("call %d at +%d ms: overall %v, want OK=%v\n%v", call, now-t0, resp.OverallCode, wantOK, resp)
		}
		for i, st := range resp.Statuses {
			if st.Code != want[i] || st.LimitRemaining != wantRemaining[i] {
				t.Fatalf("call %d at +%d ms descriptor %d: %v remaining %d, want %v remaining %d", call, now-t0, i, st.Code, st.LimitRemaining, want[i], wantRemaining[i])
			}
		}
		if wantOK {
			for _, p := range pending {
				hist[p.r] = append(hist[p.r], p.s)
			}
			for _, it := range items {
				if it.id != "" && it.cost > 0 {
					lastOK = items
				}
			}
		} else {
			lastDenied = items
			if len(pending) > 0 {
				rolledBack++
			}
		}
		step := int64(rng.IntN(701))
		now += step
		f.clk.advance(time.Duration(step) * time.Millisecond)
	}
	if repeats < 10 || refused < 10 || rolledBack < 10 {
		t.Fatalf("the replay repeated %d denied calls, refused %d repeated ids and rolled back %d calls; want at least 10 of each", repeats, refused, rolledBack)
	}
}

// refItem is a descriptor of TestRLSMatchesReference.
type refItem struct {
	r    string // recipient
	cost int64  // hits_addend; 0 peeks
	id   string // request_id entry; "" for none
}

// descsOf is the descriptors of a reference replay's items.
func descsOf(items []refItem) []*commonv3.RateLimitDescriptor {
	ds := make([]*commonv3.RateLimitDescriptor, len(items))
	for i, it := range items {
		if it.id != "" {
			ds[i] = desc("recipient="+it.r, "request_id="+it.id)
		} else {
			ds[i] = desc("recipient=" + it.r)
		}
		ds[i].HitsAddend = wrapperspb.UInt64(uint64(it.cost))
	}
	return ds
}
