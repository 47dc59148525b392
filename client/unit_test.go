package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Seeds: []string{"127.0.0.1:7070"}}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no seeds", func(c *Config) { c.Seeds = nil }, "Seeds is empty"},
		{"seed without port", func(c *Config) { c.Seeds = []string{"node-0"} }, `Seeds[0] "node-0" is not host:port`},
		{"negative timeout", func(c *Config) { c.Timeout = -time.Second }, "Timeout -1s out of range [1ms, 10m0s]"},
		{"huge timeout", func(c *Config) { c.Timeout = time.Hour }, "Timeout 1h0m0s out of range"},
		{"policy", func(c *Config) { c.FailurePolicy = 2 }, "FailurePolicy 2 out of range"},
		{"negative batch", func(c *Config) { c.MaxBatch = -1 }, "MaxBatch -1 out of range [1, 10000]"},
		{"huge batch", func(c *Config) { c.MaxBatch = 10_001 }, "MaxBatch 10001 out of range"},
		{"max batch", func(c *Config) { c.MaxBatch = 10_000 }, ""},
		{"long delay", func(c *Config) { c.MaxDelay = time.Second }, "MaxDelay 1s out of range"},
		{"send at once", func(c *Config) { c.MaxDelay = -1 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			err := cfg.withDefaults().validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if tc.want != "" {
				if _, err := New(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("New: got %v, want %q", err, tc.want)
				}
			}
		})
	}
	d := ok.withDefaults()
	if d.Timeout != DefaultTimeout || d.MaxBatch != DefaultMaxBatch || d.MaxInFlight != DefaultMaxInFlight || d.MaxDelay != 0 || d.FailurePolicy != FailOpen || d.Logger == nil || len(d.DialOptions) != 1 {
		t.Fatalf("defaults: %+v", d)
	}
}

// TestLimitsMatchNode pins the item limits the client checks to the node's.
func TestLimitsMatchNode(t *testing.T) {
	if MaxRequestItems != node.MaxBatch || MaxRecipientBytes != node.MaxRecipientBytes || MaxContentBytes != node.MaxContentBytes {
		t.Fatalf("client limits %d/%d/%d, node %d/%d/%d", MaxRequestItems, MaxRecipientBytes, MaxContentBytes,
			node.MaxBatch, node.MaxRecipientBytes, node.MaxContentBytes)
	}
	for _, s := range []string{"", "a", "your code is 1234", strings.Repeat("x", 1000)} {
		if got, want := ContentHash([]byte(s)), node.ContentHash([]byte(s)); got != want {
			t.Fatalf("ContentHash(%q) = %x, node %x", s, got, want)
		}
	}
}

func TestEncodeColumns(t *testing.T) {
	enc := func(ps ...prepared) *pb.CheckRequest {
		return encode(len(ps), func(j int) *prepared { return &ps[j] }, 7, time.Time{})
	}
	plain := prepared{recipient: "a", cost: 1, id: 1}
	req := enc(plain, prepared{recipient: "b", cost: 1, id: 2})
	if req.Domains != nil || req.ContentHashes != nil || req.Costs != nil || req.Modes != nil || req.RingEpoch != 7 || req.NotAfterMs != 0 ||
		!reflect.DeepEqual(req.Recipients, []string{"a", "b"}) || !reflect.DeepEqual(req.RequestIds, []uint64{1, 2}) {
		t.Fatalf("default columns: %v", req)
	}
	req = enc(prepared{recipient: "a", domain: "x", cost: 1, id: 1}, prepared{recipient: "b", domain: "x", cost: 1, id: 2})
	if !reflect.DeepEqual(req.Domains, []string{"x"}) {
		t.Fatalf("one domain: %v", req.Domains)
	}
	req = enc(plain, prepared{recipient: "b", domain: "x", hash: 9, cost: 3, mode: pb.Mode_MODE_PEEK, id: 2})
	if !reflect.DeepEqual(req.Domains, []string{"", "x"}) || !reflect.DeepEqual(req.ContentHashes, []uint64{0, 9}) ||
		!reflect.DeepEqual(req.Costs, []uint32{1, 3}) || !reflect.DeepEqual(req.Modes, []pb.Mode{0, pb.Mode_MODE_PEEK}) {
		t.Fatalf("mixed columns: %v", req)
	}
	dl := time.UnixMilli(1796567998140)
	if req := encode(1, func(int) *prepared { return &plain }, 7, dl); req.NotAfterMs != dl.UnixMilli() {
		t.Fatalf("not_after_ms %d, want the deadline %d", req.NotAfterMs, dl.UnixMilli())
	}
}

func TestPrepare(t *testing.T) {
	for _, tc := range []struct {
		name string
		it   Item
		want string
	}{
		{"empty recipient", Item{}, "Recipient: empty recipient"},
		{"long recipient", Item{Recipient: strings.Repeat("1", 257)}, "Recipient: 257 bytes, more than 256"},
		{"both contents", Item{Recipient: "a", Content: []byte("x"), ContentHash: 1}, "Content and ContentHash: both set"},
		{"big content", Item{Recipient: "a", Content: make([]byte, 64<<10+1)}, "Content: 65537 bytes, more than 65536"},
		{"negative cost", Item{Recipient: "a", Cost: -1}, "Cost: -1 out of range [1, 1000]"},
		{"huge cost", Item{Recipient: "a", Cost: 1001}, "Cost: 1001 out of range"},
		{"mode", Item{Recipient: "a", Mode: 4}, "Mode: unknown mode 4"},
		{"refund without id", Item{Recipient: "a", Mode: Refund}, "RequestID: 0; a Refund names the send"},
		{"recipient not UTF-8", Item{Recipient: "+86\xff"}, `Recipient: "+86\xff" is not valid UTF-8`},
		{"domain not UTF-8", Item{Recipient: "a", Domain: "d\xc3("}, `Domain: "d\xc3(" is not valid UTF-8`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, e := prepare(&tc.it, 4)
			if e == nil || e.Index != 4 || e.Code != codes.InvalidArgument || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("got %v, want item 4 INVALID_ARGUMENT %q", e, tc.want)
			}
		})
	}
	p, e := prepare(&Item{Recipient: "a", Content: []byte("hi"), Mode: RecordOnly, RequestID: 5}, 0)
	if e != nil || p.hash != ContentHash([]byte("hi")) || p.cost != 1 || p.mode != pb.Mode_MODE_RECORD_ONLY || p.id != 5 {
		t.Fatalf("prepared %+v, %v", p, e)
	}
}

func TestItemErrorIndex(t *testing.T) {
	f := func(msg string, i, j int, want string) {
		t.Helper()
		e := (&ItemError{Index: j, Code: codes.InvalidArgument, Message: msg}).at(i, j)
		if e.Index != i || e.Message != want {
			t.Fatalf("at(%d, %d) of %q = %d %q, want %q", i, j, msg, e.Index, e.Message, want)
		}
	}
	f(`domains[1]: unknown domain "x"`, 7, 1, `domains[7]: unknown domain "x"`)
	f(`domains[2]: unknown domain "x"`, 7, 1, `domains[2]: unknown domain "x"`) // not the node's index of this item
	f(`recipient "a[1]": cost 20 above limit`, 7, 1, `recipient "a[1]": cost 20 above limit`)
	f(`Recipient: empty recipient`, 3, 3, `Recipient: empty recipient`)

	errs := ItemErrors{{Index: 1, Code: codes.InvalidArgument, Message: "a"}, {Index: 4, Code: codes.ResourceExhausted, Message: "b"}}
	var err error = errs
	var ie *ItemError
	var all ItemErrors
	if !errors.As(err, &ie) || ie.Index != 1 || !errors.As(err, &all) || len(all) != 2 {
		t.Fatalf("errors.As: %v %v", ie, all)
	}
	if got := err.Error(); got != "client: item 1: a (InvalidArgument) (and 1 more failed items)" {
		t.Fatalf("Error() = %q", got)
	}
}

// TestNewEpochMismatch: a node whose epoch this build does not compute is
// refused, with both epochs in the error.
func TestNewEpochMismatch(t *testing.T) {
	f := startFake(t, &fakeLimiter{epoch: 12345})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := New(ctx, Config{Seeds: []string{f.addr}})
	if !errors.Is(err, ErrEpochMismatch) || !strings.Contains(err.Error(), "0000000000003039") {
		t.Fatalf("New: %v, want ErrEpochMismatch naming epoch 3039", err)
	}
}

// TestNewNoSeed: New gives up when ctx ends, naming the seeds.
func TestNewNoSeed(t *testing.T) {
	addr := "127.0.0.1:" + itoa(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := New(ctx, Config{Seeds: []string{addr}})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("New: %v", err)
	}
}

// TestRetryReusesRequestID: an item that fails with UNAVAILABLE is sent once
// more, after a ring refresh, with the same nonzero request id; an item of
// the caller's fault is not retried.
func TestRetryReusesRequestID(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	f := startFake(t, &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		failed := map[int]*pb.ItemError{}
		for i, r := range req.Recipients {
			switch {
			case r == "bad":
				failed[i] = &pb.ItemError{Code: uint32(codes.InvalidArgument), Message: "domains[" + itoa(i) + "]: unknown domain"}
			case calls == 1 && r != "ok":
				failed[i] = &pb.ItemError{Code: uint32(codes.Unavailable), Message: "owner did not answer"}
			}
		}
		return admitAll(req, failed), nil
	}})
	cl := newClient(t, Config{Rand: rand.NewPCG(1, 2)}, f.addr)
	refreshes := cl.Stats().RingRefreshes

	d, err := cl.Check(context.Background(), Item{Recipient: "r1"})
	if err != nil || !d.Admitted || d.Degraded || d.Node != "fake" || len(d.Rules) != 1 || d.Rules[0] != (RuleState{Name: "r", Limit: 10, Window: time.Minute, Used: 1, Remaining: 9}) {
		t.Fatalf("Check: %+v, %v", d, err)
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].RequestIds[0] == 0 || reqs[1].RequestIds[0] != reqs[0].RequestIds[0] {
		t.Fatalf("requests %v: want two with the same nonzero id", reqs)
	}
	if s := cl.Stats(); s.Retries != 1 || s.RingRefreshes != refreshes+1 || s.RPCs != 2 || s.Degraded != 0 {
		t.Fatalf("stats %+v", s)
	}

	// A batch: "ok" is decided at once, "bad" is the caller's error, "r2"
	// and "r3" are retried with their ids; r3 brings its own.
	mu.Lock()
	calls = 0
	mu.Unlock()
	decs, err := cl.CheckBatch(context.Background(), []Item{{Recipient: "ok"}, {Recipient: "r2"}, {Recipient: "bad"}, {Recipient: "r3", RequestID: 99}})
	var ie ItemErrors
	if !errors.As(err, &ie) || len(ie) != 1 || ie[0].Index != 2 || ie[0].Code != codes.InvalidArgument || ie[0].Message != "domains[2]: unknown domain" {
		t.Fatalf("CheckBatch error %v", err)
	}
	for i, d := range decs {
		if want := i != 2; d.Admitted != want || d.Degraded {
			t.Fatalf("decision %d: %+v", i, d)
		}
	}
	reqs = f.requests()[2:]
	if len(reqs) != 2 || !reflect.DeepEqual(reqs[1].Recipients, []string{"r2", "r3"}) ||
		reqs[1].RequestIds[0] != reqs[0].RequestIds[1] || reqs[1].RequestIds[1] != 99 || reqs[0].RequestIds[3] != 99 {
		t.Fatalf("batch requests %v", reqs)
	}
}

// TestHungNodeDegrades: a node that takes calls and never answers costs each
// call its deadline, not more; the answer is the policy's.
func TestHungNodeDegrades(t *testing.T) {
	f := startFake(t, &fakeLimiter{check: func(ctx context.Context, _ *pb.CheckRequest) (*pb.CheckResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	const timeout = 200 * time.Millisecond
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			cl := newClient(t, Config{Timeout: timeout, FailurePolicy: policy}, f.addr)
			start := time.Now()
			d, err := cl.Check(context.Background(), Item{Recipient: "a"})
			took := time.Since(start)
			if err != nil || !d.Degraded || d.Admitted != (policy == FailOpen) || d.Node != "" || d.Rules != nil {
				t.Fatalf("Check: %+v, %v", d, err)
			}
			if took < timeout || took > timeout+slack {
				t.Fatalf("Check took %v, want %v (+%v)", took, timeout, slack)
			}

			// A caller's earlier deadline wins.
			ctx, cancel := context.WithTimeout(context.Background(), timeout/4)
			start = time.Now()
			decs, err := cl.CheckBatch(ctx, []Item{{Recipient: "a"}, {Recipient: "b"}})
			took = time.Since(start)
			cancel()
			if err != nil || len(decs) != 2 || !decs[1].Degraded || decs[1].Admitted != (policy == FailOpen) {
				t.Fatalf("CheckBatch: %+v, %v", decs, err)
			}
			if took > timeout/4+slack {
				t.Fatalf("CheckBatch took %v, want %v (+%v)", took, timeout/4, slack)
			}
			// The single Check is retried until its deadline (each attempt
			// takes 3/4 of the time left, the last all of it below 20 ms,
			// after a pause): at least once, and the pauses and shares of
			// 200 ms leave room for at most a handful. The batch's two items
			// are retried only if the first attempt left time before the
			// caller's 50 ms deadline, which a busy machine may not.
			if s := cl.Stats(); s.Degraded != 3 || s.Retries < 1 || s.Retries > 12 {
				t.Fatalf("stats %+v: want 3 degraded, and 1 to 12 retries", s)
			}
		})
	}
}

// TestCloseInFlight: Close ends calls in flight with ErrClosed, stops every
// goroutine of the client, and later calls fail with ErrClosed.
func TestCloseInFlight(t *testing.T) {
	arrived := make(chan struct{}, 1)
	f := startFake(t, &fakeLimiter{check: func(ctx context.Context, _ *pb.CheckRequest) (*pb.CheckResponse, error) {
		arrived <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	cl := newClient(t, Config{Timeout: time.Minute}, f.addr)
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Check(context.Background(), Item{Recipient: "a"})
		errc <- err
	}()
	<-arrived
	start := time.Now()
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Check in flight: %v, want ErrClosed", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close and the call in flight took %v", took)
	}
	if _, err := cl.Check(context.Background(), Item{Recipient: "a"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Check after Close: %v", err)
	}
	if _, err := cl.CheckBatch(context.Background(), []Item{{Recipient: "a"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("CheckBatch after Close: %v", err)
	}
	if err := cl.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if g := clientGoroutines(); g != "" {
		t.Fatalf("goroutines left after Close:\n%s", g)
	}
}

// TestStaleEpochRefreshes: a response with another ring epoch than the
// client's makes the client fetch the ring from that node at once, without
// waiting for its watch (which here never sends a change).
func TestStaleEpochRefreshes(t *testing.T) {
	f := startFake(t, &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		return admitAll(req, nil), nil
	}})
	watched := f.watchSent()
	cl := newClient(t, Config{}, f.addr)
	await(t, watched, "the ring watch")
	old := cl.Ring().Epoch()
	rings := f.ringCalls()
	// The node's ring gains a member (the client never dials it: every item
	// below is owned by the fake under both rings, or forwarded by it).
	epoch := f.setExtra(ring.Member{Name: "other", Addr: "127.0.0.1:1"})
	if epoch == old {
		t.Fatal("the new ring has the old epoch")
	}
	d, err := cl.Check(context.Background(), Item{Recipient: "a"})
	if err != nil || d.Degraded {
		t.Fatalf("Check: %+v, %v", d, err)
	}
	waitClientEpoch(t, cl, epoch)
	if s := cl.Stats(); s.RingRefreshes != 1 || f.ringCalls() != rings+1 || cl.Ring().Len() != 2 {
		t.Fatalf("stats %+v, %d Ring RPCs after the change, %d members", s, f.ringCalls()-rings, cl.Ring().Len())
	}
}

// TestMaxBatch: concurrent single Checks are coalesced into RPCs of at most
// MaxBatch items.
func TestMaxBatch(t *testing.T) {
	f := startFake(t, &fakeLimiter{check: func(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
		return admitAll(req, nil), nil
	}})
	cl := newClient(t, Config{MaxBatch: 4, MaxDelay: 50 * time.Millisecond, Timeout: patient}, f.addr)
	var wg sync.WaitGroup
	for k := range 10 {
		wg.Go(func() {
			if d, err := cl.Check(context.Background(), Item{Recipient: recipient(k)}); err != nil || !d.Admitted || d.Degraded {
				t.Errorf("Check %d: %+v, %v", k, d, err)
			}
		})
	}
	wg.Wait()
	items := 0
	for _, req := range f.requests() {
		if len(req.Recipients) > 4 {
			t.Fatalf("an RPC of %d items, MaxBatch 4", len(req.Recipients))
		}
		items += len(req.Recipients)
	}
	if items != 10 || len(f.requests()) < 3 {
		t.Fatalf("%d items in %d RPCs", items, len(f.requests()))
	}
}

// TestItemErrorIndexByField: with the field the node named (ItemError.Field),
// only that field's index is renumbered.
func TestItemErrorIndexByField(t *testing.T) {
	e := (&ItemError{Index: 1, Code: codes.InvalidArgument, Message: "costs[1]: cost 5000 out of range", Field: "costs"}).at(7, 1)
	if e.Message != "costs[7]: cost 5000 out of range" || e.Field != "costs" || e.Index != 7 {
		t.Fatalf("at(7, 1) = %+v", e)
	}
	e = (&ItemError{Index: 1, Code: codes.InvalidArgument, Message: "domains[1]: x", Field: "costs"}).at(7, 1)
	if e.Message != "domains[1]: x" {
		t.Fatalf("a message whose first word is not the field: %q", e.Message)
	}
}
