package docker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/bench"
)

// Load shape: batches of batchSize items of the default domain, recipients
// drawn from a window of consecutive numbers, each with one of a few
// contents, so that the content rules bind within the run. The window
// slides by recipientDrift numbers a second: a recipient is drawn during
// recipients/recipientDrift seconds (10 s), most of its items are denied by
// content-59s (2 per content, at most 8 admitted per recipient), and fresh
// recipients keep being admitted during every step, ring changes included,
// rather than only in the first seconds of the run. It also keeps every
// recipient's count far under recipient-24h's limit, which the
// forgotten-send audit relies on (exact_test.go).
const (
	batchSize      = 100
	recipients     = 2000 // recipients drawn from at any time
	recipientDrift = 200  // new recipients a second
	maxRecipients  = recipients + recipientDrift*int(runBudget/time.Second)
	contents       = 4
	callTimeout    = 2 * time.Second         // deadline of each load call
	hangSlack      = 1500 * time.Millisecond // a call returning later than its deadline plus this has hung
)

// dial returns a client connection to a node's gRPC address. Reconnection
// backoff is short (at most 1 s, gRPC's default grows to 2 min), so that a
// restarted node is seen as soon as it listens.
func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
}

// target is a node the load sends to.
type target struct {
	name string
	cli  pb.LimiterClient
}

// counters are the load's totals since it started.
type counters struct {
	calls, callErrs, decisions, itemErrs, admitted, hung atomic.Int64
	unknown                                              atomic.Int64 // items given up unanswered after giveUp
}

type snapshot struct{ calls, callErrs, decisions, itemErrs, admitted, hung int64 }

func (c *counters) snapshot() snapshot {
	return snapshot{c.calls.Load(), c.callErrs.Load(), c.decisions.Load(), c.itemErrs.Load(), c.admitted.Load(), c.hung.Load()}
}

func (s snapshot) sub(o snapshot) snapshot {
	return snapshot{s.calls - o.calls, s.callErrs - o.callErrs, s.decisions - o.decisions, s.itemErrs - o.itemErrs, s.admitted - o.admitted, s.hung - o.hung}
}

// load sends Check batches round-robin to the current targets from a few
// workers until its context ends, and keeps every admitted send for the
// audit. Like the Go client, it gives every item a request id and sends the
// items that failed retryably again until they are answered (settle). It is
// a stand-in for package bench's driver.
type load struct {
	targets atomic.Pointer[[]target]
	next    atomic.Uint64
	ctr     counters
	hashes  [contents]uint64
	used    [maxRecipients]atomic.Bool // recipients the load sent at least one item to
	t0      time.Time                  // when the load started: the recipient window slides from there

	mu        sync.Mutex   // guards sends, errSample
	sends     []bench.Send // admitted sends, as the nodes decided them
	errSample map[string]int

	wg sync.WaitGroup
}

func newLoad(seed uint64) *load {
	l := &load{errSample: map[string]int{}}
	r := rand.New(rand.NewPCG(seed, 0))
	for i := range l.hashes {
		l.hashes[i] = r.Uint64() | 1 // nonzero: 0 means no content
	}
	l.setTargets(nil)
	return l
}

func (l *load) setTargets(ts []target) { l.targets.Store(&ts) }

// start runs workers until ctx ends; wait waits for them.
func (l *load) start(ctx context.Context, workers int, seed uint64) {
	l.t0 = time.Now()
	for w := range workers {
		r := rand.New(rand.NewPCG(seed, uint64(w)+1))
		l.wg.Go(func() { l.worker(ctx, r) })
	}
}

func (l *load) wait() { l.wg.Wait() }

func (l *load) worker(ctx context.Context, r *rand.Rand) {
	for ctx.Err() == nil {
		if len(*l.targets.Load()) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		req := &pb.CheckRequest{Recipients: make([]string, batchSize), ContentHashes: make([]uint64, batchSize), RequestIds: make([]uint64, batchSize)}
		off := min(int(time.Since(l.t0).Seconds()*recipientDrift), maxRecipients-recipients)
		for i := range batchSize {
			k := off + r.IntN(recipients)
			l.used[k].Store(true)
			req.Recipients[i] = recipientName(k)
			req.ContentHashes[i] = l.hashes[r.IntN(contents)]
			req.RequestIds[i] = r.Uint64() | 1
		}
		l.settle(ctx, req)
	}
}

// settle sends req, then its items that failed retryably (the call failed,
// or the item with UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED or INTERNAL)
// again with the same request ids to the next target, as the Go client
// does, until every item is answered or giveUp has passed; each attempt
// names its deadline (not_after_ms). Items still unanswered then are
// unknown outcomes: recorded or not, nobody knows.
func (l *load) settle(ctx context.Context, req *pb.CheckRequest) {
	end := time.Now().Add(giveUp)
	for {
		ts := *l.targets.Load()
		if len(ts) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
				continue
			}
		}
		tg := ts[l.next.Add(1)%uint64(len(ts))]
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		dl, _ := cctx.Deadline()
		req.NotAfterMs = dl.UnixMilli()
		start := time.Now()
		resp, err := tg.cli.Check(cctx, req)
		took := time.Since(start)
		cancel()
		if ctx.Err() != nil {
			return // the run is over; this call does not count
		}
		l.ctr.calls.Add(1)
		if took > callTimeout+hangSlack {
			l.ctr.hung.Add(1)
		}
		var retry []int
		if err != nil {
			l.ctr.callErrs.Add(1)
			l.noteErr(fmt.Sprintf("call to %s: %s", tg.name, status.Code(err)))
			for i := range req.Recipients {
				retry = append(retry, i)
			}
		} else {
			retry = l.record(req, resp)
		}
		if len(retry) == 0 {
			return
		}
		if time.Now().After(end) {
			l.ctr.unknown.Add(int64(len(retry)))
			return
		}
		req = wire.Pick(req, retry, 0)
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// giveUp bounds how long the load retries an item.
const giveUp = 15 * time.Second

// retryable reports whether an item that failed with code is sent again.
func retryable(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Internal:
		return true
	}
	return false
}

// record counts the decisions and errors of one response, keeps its
// admitted sends, and returns the items to send again.
func (l *load) record(req *pb.CheckRequest, resp *pb.CheckResponse) (retry []int) {
	failed := make(map[uint32]bool, len(resp.Errors))
	for _, e := range resp.Errors {
		failed[e.Index] = true
		if retryable(codes.Code(e.Code)) {
			retry = append(retry, int(e.Index))
		}
	}
	slices.Sort(retry)
	l.ctr.itemErrs.Add(int64(len(resp.Errors)))
	l.ctr.decisions.Add(int64(len(req.Recipients) - len(failed)))
	var admitted []bench.Send
	for i := range req.Recipients {
		if failed[uint32(i)] || i >= len(resp.Admitted) || !resp.Admitted[i] {
			continue
		}
		admitted = append(admitted, bench.Send{Domain: "default", Recipient: req.Recipients[i], Content: req.ContentHashes[i], At: resp.DecidedAtMs[i], Checked: true})
	}
	l.ctr.admitted.Add(int64(len(admitted)))
	l.mu.Lock()
	l.sends = append(l.sends, admitted...)
	for _, e := range resp.Errors {
		l.errSample[fmt.Sprintf("item: %s: %s", codes.Code(e.Code), shorten(e.Message))]++
	}
	l.mu.Unlock()
	return retry
}

func (l *load) noteErr(s string) {
	l.mu.Lock()
	l.errSample[s]++
	l.mu.Unlock()
}

// takeErrors returns the error kinds seen since the last call, most
// frequent first, and forgets them.
func (l *load) takeErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k, n := range l.errSample {
		out = append(out, fmt.Sprintf("%d× %s", n, k))
	}
	clear(l.errSample)
	slices.SortFunc(out, func(a, b string) int {
		var na, nb int
		fmt.Sscan(a, &na)
		fmt.Sscan(b, &nb)
		return nb - na
	})
	return out
}

// shorten drops the variable parts of an item error (recipients, epochs,
// addresses) so that errors of one kind group together.
func shorten(msg string) string {
	msg = quotedRE.ReplaceAllString(msg, `"…"`)
	msg = addrRE.ReplaceAllString(msg, "ADDR")
	msg = numberRE.ReplaceAllString(msg, "N")
	if len(msg) > 140 {
		msg = msg[:140] + "…"
	}
	return msg
}

var (
	quotedRE = regexp.MustCompile(`"[^"]*"`)
	addrRE   = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)
	numberRE = regexp.MustCompile(`\b\d{6,}\b`)
)

// recipientName is the phone number of the load's recipient k.
func recipientName(k int) string { return fmt.Sprintf("+86138%08d", k) }

// usedRecipients returns every recipient the load sent an item to.
func (l *load) usedRecipients() []string {
	var out []string
	for k := range l.used {
		if l.used[k].Load() {
			out = append(out, recipientName(k))
		}
	}
	return out
}

// admittedSends returns a copy of every admitted send so far.
func (l *load) admittedSends() []bench.Send {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sends)
}

// ringView is what one node answered to Limiter.Ring, or why it did not.
type ringView struct {
	members []string // name@addr, sorted
	epoch   uint64
	err     error
}

// probe asks node addr for its health and its ring, within timeout.
func probe(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) ringView {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return ringView{err: err}
	}
	if h.Status != healthpb.HealthCheckResponse_SERVING {
		return ringView{err: fmt.Errorf("health %s", h.Status)}
	}
	r, err := pb.NewLimiterClient(conn).Ring(ctx, &pb.RingRequest{})
	if err != nil {
		return ringView{err: err}
	}
	v := ringView{epoch: r.Epoch}
	for _, m := range r.Members {
		v.members = append(v.members, m.Name+"@"+m.Addr)
	}
	slices.Sort(v.members)
	return v
}

// errNotConverged is returned by waitRing when its deadline passes.
var errNotConverged = errors.New("rings did not converge")

// waitRing polls every node of conns until each is SERVING and reports the
// ring want (name@addr, sorted) with one epoch, and returns the time that
// took since start. It gives up after timeout with errNotConverged and each
// node's last answer.
func waitRing(ctx context.Context, start time.Time, conns map[string]*grpc.ClientConn, want []string, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		views := map[string]ringView{}
		ok := true
		var epoch uint64
		for name, conn := range conns {
			v := probe(ctx, conn, 500*time.Millisecond)
			views[name] = v
			if v.err != nil || !slices.Equal(v.members, want) || (epoch != 0 && v.epoch != epoch) {
				ok = false
			}
			epoch = v.epoch
		}
		if ok {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var b strings.Builder
			for name, v := range views {
				fmt.Fprintf(&b, "\n  %s: members %v epoch %016x err %v", name, v.members, v.epoch, v.err)
			}
			return time.Since(start), fmt.Errorf("%w within %v on %v (want %v):%s", errNotConverged, timeout, keys(conns), want, b.String())
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
