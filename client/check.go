package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// defaultDomain is the domain of an item that names none (node.DefaultDomain).
const defaultDomain = "default"

// Mode says what a check does with an item.
type Mode int

const (
	// CheckAndRecord admits the item if every rule allows it, and records it
	// if admitted. The zero value.
	CheckAndRecord Mode = iota
	// Peek decides as CheckAndRecord would and changes nothing.
	Peek
	// RecordOnly records the item without checking it: check with Peek,
	// send, then record.
	RecordOnly
)

func (m Mode) String() string {
	switch m {
	case CheckAndRecord:
		return "CheckAndRecord"
	case Peek:
		return "Peek"
	case RecordOnly:
		return "RecordOnly"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Item is one message to check.
type Item struct {
	Domain    string // rule set; "" means "default"
	Recipient string // who receives the message, 1 to 256 bytes; routes the item
	// Content is the message content; the client hashes it (ContentHash) and
	// sends only the hash. Empty means no content: content rules do not apply.
	// At most 64 KiB.
	Content []byte
	// ContentHash is the content's 64-bit hash, for callers that have it
	// (ContentHash(content)); 0 means none. Set at most one of Content and
	// ContentHash.
	ContentHash uint64
	Cost        int  // sends the item counts as; 0 means 1; [1, 1000]
	Mode        Mode // zero value: CheckAndRecord
	// RequestID identifies the item across retries: a node answers a repeat
	// of a recorded id with the first decision and does not record it again.
	// 0 means the client draws a random nonzero id for the call (and reuses it
	// for the call's retry). Set it to keep an item idempotent across calls
	// too, for example when the caller retries after ErrClosed or a crash.
	RequestID uint64
}

// Decision is the answer for one item.
type Decision struct {
	Admitted bool // the message may be sent; always true for RecordOnly
	Recorded bool // the node recorded the send
	// Degraded means no node decided the item before the call's deadline:
	// Admitted is the FailurePolicy's answer (true for FailOpen) and nothing
	// else is set but DecidedAt. A caller that wants the other policy for one
	// call reads Degraded.
	Degraded bool
	// Duplicate means the node had already recorded an item with this
	// request id and recipient (an earlier attempt whose answer was lost, or
	// an earlier call with the same Item.RequestID): the answer is the first
	// decision (admitted and recorded, DecidedAt its time; Rules as of now)
	// and nothing was recorded again.
	Duplicate  bool
	DeniedBy   string        // the rule that denied the item (the one with the longest RetryAfter); "" if admitted
	RetryAfter time.Duration // until the item would be admitted; 0 if admitted
	// DecidedAt is the node's clock at the decision (millisecond precision),
	// or the client's clock for a degraded answer.
	DecidedAt time.Time
	Rules     []RuleState // every rule of the item's domain, in the domain's order
	Node      string      // the node the client asked, which answered (or forwarded); "" if degraded
}

// RuleState is one rule's state for an item after its decision.
type RuleState struct {
	Name       string
	Limit      int
	Window     time.Duration
	Used       int           // sends of the rule's scope in the window, this one included if recorded
	Remaining  int           // Limit - Used, at least 0
	RetryAfter time.Duration // until this rule admits the item; 0 if it does
}

// ItemError is an item the caller got wrong: the client or the node refused
// it (INVALID_ARGUMENT: empty recipient, unknown domain, cost out of range;
// RESOURCE_EXHAUSTED: the recipient's record is full). It is not recorded,
// and the FailurePolicy does not apply: retrying it cannot help.
type ItemError struct {
	Index   int        // the item's index in the call (0 for Check)
	Code    codes.Code // a gRPC code
	Message string     // names the field and the value
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("client: item %d: %s (%v)", e.Index, e.Message, e.Code)
}

// at returns e as item i of the caller's call, for an error a node reported
// as item j of its request: a message that starts with a column name and
// "[j]" (the node's style: "domains[3]: unknown domain ...") gets "[i]".
func (e *ItemError) at(i, j int) *ItemError {
	msg := e.Message
	if b := strings.IndexByte(msg, '['); b > 0 && isWord(msg[:b]) {
		if rest, ok := strings.CutPrefix(msg[b+1:], strconv.Itoa(j)+"]"); ok {
			msg = msg[:b+1] + strconv.Itoa(i) + "]" + rest
		}
	}
	return &ItemError{Index: i, Code: e.Code, Message: msg}
}

func isWord(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_') {
			return false
		}
	}
	return true
}

// ItemErrors lists the failed items of a CheckBatch call, by index. Their
// decisions are the zero Decision (not admitted). errors.As finds it, and
// each *ItemError in it.
type ItemErrors []*ItemError

func (es ItemErrors) Error() string {
	switch len(es) {
	case 0:
		return "client: no item errors"
	case 1:
		return es[0].Error()
	}
	return fmt.Sprintf("%v (and %d more failed items)", es[0], len(es)-1)
}

// Unwrap returns the item errors, for errors.Is and errors.As.
func (es ItemErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// ContentHash returns the hash nodes give a message content: xxhash64 (seed
// 0) of its bytes, never 0; 0 for an empty content.
func ContentHash(content []byte) uint64 {
	if len(content) == 0 {
		return 0
	}
	return max(ring.Hash(content), 1)
}

// prepared is a validated item, as it goes on the wire.
type prepared struct {
	recipient, domain string
	hash              uint64
	cost              uint32
	mode              pb.Mode
	id                uint64
}

// prepare validates item i and encodes it.
func prepare(it *Item, i int) (prepared, *ItemError) {
	bad := func(format string, args ...any) (prepared, *ItemError) {
		return prepared{}, &ItemError{Index: i, Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case it.Recipient == "":
		return bad("Recipient: empty recipient")
	case len(it.Recipient) > MaxRecipientBytes:
		return bad("Recipient: %d bytes, more than %d", len(it.Recipient), MaxRecipientBytes)
	case len(it.Content) > 0 && it.ContentHash != 0:
		return bad("Content and ContentHash: both set; set at most one")
	case len(it.Content) > MaxContentBytes:
		return bad("Content: %d bytes, more than %d", len(it.Content), MaxContentBytes)
	}
	cost := it.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 1 || cost > MaxCost {
		return bad("Cost: %d out of range [1, %d] (0 means 1)", it.Cost, MaxCost)
	}
	var mode pb.Mode
	switch it.Mode {
	case CheckAndRecord:
		mode = pb.Mode_MODE_CHECK_AND_RECORD
	case Peek:
		mode = pb.Mode_MODE_PEEK
	case RecordOnly:
		mode = pb.Mode_MODE_RECORD_ONLY
	default:
		return bad("Mode: unknown mode %d", int(it.Mode))
	}
	h := it.ContentHash
	if len(it.Content) > 0 {
		h = ContentHash(it.Content)
	}
	return prepared{recipient: it.Recipient, domain: it.Domain, hash: h, cost: uint32(cost), mode: mode, id: it.RequestID}, nil
}

// encode builds the request for n items; a column whose entries are all the
// default is left empty, one whose entries are all equal has one entry.
func encode(n int, at func(int) *prepared, epoch uint64) *pb.CheckRequest {
	req := &pb.CheckRequest{RingEpoch: epoch, Recipients: make([]string, n), RequestIds: make([]uint64, n)}
	first := at(0)
	sameDomain, hashes, costs, modes := true, false, false, false
	for j := range n {
		p := at(j)
		req.Recipients[j], req.RequestIds[j] = p.recipient, p.id
		sameDomain = sameDomain && p.domain == first.domain
		hashes = hashes || p.hash != 0
		costs = costs || p.cost != 1
		modes = modes || p.mode != pb.Mode_MODE_CHECK_AND_RECORD
	}
	switch {
	case !sameDomain:
		req.Domains = make([]string, n)
	case first.domain != "":
		req.Domains = []string{first.domain}
	}
	if hashes {
		req.ContentHashes = make([]uint64, n)
	}
	if costs {
		req.Costs = make([]uint32, n)
	}
	if modes {
		req.Modes = make([]pb.Mode, n)
	}
	for j := range n {
		p := at(j)
		if len(req.Domains) == n {
			req.Domains[j] = p.domain
		}
		if hashes {
			req.ContentHashes[j] = p.hash
		}
		if costs {
			req.Costs[j] = p.cost
		}
		if modes {
			req.Modes[j] = p.mode
		}
	}
	return req
}

// outcome is what one attempt got for one item: a decision, the caller's
// error (ierr, with Index the item's position in the RPC), or a retryable
// failure (err).
type outcome struct {
	dec  Decision
	ierr *ItemError
	err  error
}

// errMemberLeft fails the items queued for a member that left the ring.
var errMemberLeft = errors.New("client: the member left the ring before the item was sent")

// callerFault reports whether an item failed with code because of the item
// itself, so that neither a retry nor the failure policy applies.
func callerFault(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.OutOfRange, codes.FailedPrecondition, codes.NotFound:
		return true
	}
	return false
}

// rpc sends n items to p in one Check RPC and emits each item's outcome.
// node names the member p is, for Decision.Node and errors. A response with
// another ring epoch than the client's asks for a refresh from p.
func (c *Client) rpc(ctx context.Context, p *peer, node string, n int, at func(int) *prepared, emit func(int, outcome)) {
	req := encode(n, at, c.Ring().Epoch())
	c.st.rpcs.Add(1)
	resp, err := p.cli.Check(ctx, req)
	if err != nil {
		var o outcome
		if st := status.Convert(err); st.Code() == codes.InvalidArgument {
			// The request as a whole was refused: retrying it cannot help.
			o.ierr = &ItemError{Code: st.Code(), Message: fmt.Sprintf("node %s refused the request: %s", node, st.Message())}
		} else {
			o.err = fmt.Errorf("client: Check RPC to %s (%s): %w", node, p.addr, err)
		}
		for j := range n {
			emit(j, o)
		}
		return
	}
	if resp.RingEpoch != 0 && resp.RingEpoch != c.Ring().Epoch() {
		c.requestRefresh(p.addr, resp.RingEpoch)
	}
	if len(resp.Duplicates) > 0 {
		c.st.duplicates.Add(int64(len(resp.Duplicates)))
	}
	decode(resp, n, at, node, emit)
}

// decode emits the outcome of each of n items from resp.
func decode(resp *pb.CheckResponse, n int, at func(int) *prepared, node string, emit func(int, outcome)) {
	failed, dup, err := checkResponse(resp, n)
	if err != nil {
		o := outcome{err: fmt.Errorf("client: malformed response from %s: %w", node, err)}
		for j := range n {
			emit(j, o)
		}
		return
	}
	var rules []RuleState
	if len(resp.Used) > 0 {
		rules = make([]RuleState, len(resp.Used)) // one array for the batch, sliced per item
	}
	var lastName string // the domain of the previous item, and its rules
	var dom *pb.Domain
	off := 0
	for j := range n {
		k := int(resp.RuleCounts[j])
		if failed != nil && failed[j] != nil {
			off += k
			e := failed[j]
			code := codes.Code(e.Code)
			if callerFault(code) {
				emit(j, outcome{ierr: &ItemError{Index: j, Code: code, Message: e.Message}})
			} else {
				emit(j, outcome{err: fmt.Errorf("client: node %s: %s (%v)", node, e.Message, code)})
			}
			continue
		}
		if d := at(j).domain; dom == nil || d != lastName {
			lastName = d
			if d == "" {
				d = defaultDomain
			}
			dom = resp.Domains[d]
		}
		dec := Decision{
			Admitted: resp.Admitted[j], Recorded: resp.Recorded[j], Duplicate: dup != nil && dup[j],
			RetryAfter: time.Duration(resp.RetryAfterMs[j]) * time.Millisecond,
			DecidedAt:  time.UnixMilli(resp.DecidedAtMs[j]),
			Node:       node,
		}
		if k > 0 {
			rs := rules[off : off+k : off+k]
			for r := range rs {
				rs[r] = RuleState{
					Used: int(resp.Used[off+r]), Remaining: int(resp.Remaining[off+r]),
					RetryAfter: time.Duration(resp.RuleRetryAfterMs[off+r]) * time.Millisecond,
				}
				if dom != nil && r < len(dom.Rules) {
					rule := dom.Rules[r]
					rs[r].Name, rs[r].Limit, rs[r].Window = rule.Name, int(rule.Limit), time.Duration(rule.WindowMs)*time.Millisecond
				}
			}
			dec.Rules = rs
		}
		if by := resp.DeniedBy[j]; by >= 0 && dom != nil && int(by) < len(dom.Rules) {
			dec.DeniedBy = dom.Rules[by].Name
		}
		off += k
		emit(j, outcome{dec: dec})
	}
}

// checkResponse checks the shape of a response to n items and returns its
// item errors by index (nil if none) and which items are duplicates (nil if
// none).
func checkResponse(resp *pb.CheckResponse, n int) (failed []*pb.ItemError, dup []bool, err error) {
	for _, col := range []struct {
		name string
		len  int
	}{
		{"admitted", len(resp.Admitted)}, {"recorded", len(resp.Recorded)}, {"denied_by", len(resp.DeniedBy)},
		{"retry_after_ms", len(resp.RetryAfterMs)}, {"decided_at_ms", len(resp.DecidedAtMs)}, {"rule_counts", len(resp.RuleCounts)},
	} {
		if col.len != n {
			return nil, nil, fmt.Errorf("%s has %d entries for %d items", col.name, col.len, n)
		}
	}
	total := 0
	for _, k := range resp.RuleCounts {
		total += int(k)
	}
	if len(resp.Used) != total || len(resp.Remaining) != total || len(resp.RuleRetryAfterMs) != total {
		return nil, nil, fmt.Errorf("per-rule columns have %d, %d, %d entries, rule_counts add up to %d",
			len(resp.Used), len(resp.Remaining), len(resp.RuleRetryAfterMs), total)
	}
	if len(resp.Errors) > 0 {
		failed = make([]*pb.ItemError, n)
		for _, e := range resp.Errors {
			if int(e.Index) >= n {
				return nil, nil, fmt.Errorf("error for item %d of %d", e.Index, n)
			}
			failed[e.Index] = e
		}
	}
	if len(resp.Duplicates) > 0 {
		dup = make([]bool, n)
		for _, i := range resp.Duplicates {
			if int(i) >= n {
				return nil, nil, fmt.Errorf("duplicate item %d of %d", i, n)
			}
			dup[i] = true
		}
	}
	return failed, dup, nil
}

// deadline returns the deadline of a call starting at now: the caller's, or
// now+Timeout if that is earlier.
func (c *Client) deadline(ctx context.Context, now time.Time) time.Time {
	d := now.Add(c.cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(d) {
		return dl
	}
	return d
}

// attemptDeadline returns the deadline of attempt 0 or 1 of a call with
// deadline dl. The first attempt gets three quarters of the time left, so
// that a node that takes the call and never answers leaves time for the
// retry; the retry gets the rest.
func attemptDeadline(attempt int, began, dl time.Time) time.Time {
	if attempt > 0 {
		return dl
	}
	return began.Add(dl.Sub(began) * 3 / 4)
}

// refreshForRetry refreshes the ring before a retry, within half the time
// the call has left. It asks members other than avoid (whose node failed)
// first.
func (c *Client) refreshForRetry(ctx context.Context, dl time.Time, avoid string, began time.Time) {
	rctx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	defer cancel()
	if err := c.refresh(rctx, "", avoid, began); err != nil && !c.closed.Load() {
		c.log.Debug("ring refresh before a retry failed", "err", err)
	}
}

// degrade answers an item that no node decided by the failure policy.
func (c *Client) degrade(cause error) Decision {
	c.st.degraded.Add(1)
	c.degradedSince.Add(1)
	now := time.Now()
	if last := c.lastDegradedLog.Load(); now.UnixNano()-last >= int64(degradedLogEvery) && c.lastDegradedLog.CompareAndSwap(last, now.UnixNano()) {
		c.log.Warn("no node decided in time: answering by the failure policy",
			"policy", c.cfg.FailurePolicy, "degraded", c.degradedSince.Swap(0), "cause", cause)
	}
	return Decision{Admitted: c.cfg.FailurePolicy == FailOpen, Degraded: true, DecidedAt: now}
}

// Check decides one item on its recipient's owner. Concurrent Checks for
// one node share a Check RPC (see Config.MaxBatch, MaxDelay).
//
// The call ends by ctx's deadline or Timeout after it starts, whichever is
// earlier, or when ctx is canceled. If the owner does not answer (connection
// failure, UNAVAILABLE, the attempt's deadline, any failure that is not the
// item's fault), the client refreshes its ring and sends the item once more,
// with the same request id, to the owner under the new ring. If that fails
// too, or the call ends first, Check answers by the failure policy
// (Decision.Degraded) with a nil error.
//
// The error is an *ItemError for a bad item (not subject to the policy), or
// ErrClosed.
func (c *Client) Check(ctx context.Context, it Item) (Decision, error) {
	if c.closed.Load() {
		return Decision{}, ErrClosed
	}
	c.st.calls.Add(1)
	c.st.items.Add(1)
	pi, ierr := prepare(&it, 0)
	if ierr != nil {
		c.st.itemErrors.Add(1)
		return Decision{}, ierr
	}
	if pi.id == 0 {
		pi.id = c.newID()
	}
	dl := c.deadline(ctx, time.Now())
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	var cause error
	var avoid string
	var began time.Time
	for attempt := range 2 {
		if attempt > 0 {
			if ctx.Err() != nil {
				break
			}
			c.st.retries.Add(1)
			c.refreshForRetry(ctx, dl, avoid, began)
		}
		began = time.Now()
		var o outcome
		o, avoid = c.checkOnce(ctx, &pi, attemptDeadline(attempt, began, dl))
		switch {
		case o.ierr != nil:
			c.st.itemErrors.Add(1)
			return Decision{}, o.ierr
		case o.err == nil:
			return o.dec, nil
		case c.closed.Load():
			return Decision{}, ErrClosed
		}
		cause = o.err
	}
	return c.degrade(cause), nil
}

// pending is a single Check's item queued on a batcher.
type pending struct {
	item     prepared
	node     string    // the member the item was routed to
	deadline time.Time // the attempt's; the batch RPC lasts until the latest
	res      chan outcome
	gone     atomic.Bool // the caller stopped waiting: do not send it
}

// checkOnce is one attempt of Check: it queues the item on its owner's
// batcher and waits for the outcome until the attempt's deadline adl. It
// returns the owner's address.
func (c *Client) checkOnce(ctx context.Context, pi *prepared, adl time.Time) (outcome, string) {
	if err := ctx.Err(); err != nil {
		return outcome{err: err}, ""
	}
	m := c.Ring().OwnerString(pi.recipient)
	if m.Addr == "" {
		return outcome{err: errors.New("client: the ring is empty")}, ""
	}
	p, err := c.peer(m.Addr)
	if err != nil {
		return outcome{err: err}, m.Addr
	}
	b, err := c.batcher(p)
	if err != nil {
		return outcome{err: err}, m.Addr
	}
	pd := &pending{item: *pi, node: m.Name, deadline: adl, res: make(chan outcome, 1)}
	if !b.enqueue(pd) {
		return outcome{err: errMemberLeft}, m.Addr
	}
	t := time.NewTimer(time.Until(adl))
	defer t.Stop()
	select {
	case o := <-pd.res:
		return o, m.Addr
	case <-t.C:
		pd.gone.Store(true)
		return outcome{err: fmt.Errorf("client: %s (%s) did not answer before the attempt's deadline", m.Name, m.Addr)}, m.Addr
	case <-ctx.Done():
		pd.gone.Store(true)
		return outcome{err: ctx.Err()}, m.Addr
	}
}

// CheckBatch decides items, sending one Check RPC per owner (more for an
// owner of more than 10,000 items) in parallel, and returns their decisions
// in order. Deadline, retry and failure policy are those of Check, per item:
// items whose owner answered keep their decisions, the others are retried
// once after a ring refresh, and those still undecided at the deadline are
// answered by the policy.
//
// A bad item does not stop the others: the error is then ItemErrors, which
// lists the failed items by index; their decisions are the zero Decision.
// The error is ErrClosed (and the decisions nil) if the client is closed.
//
//	decs, err := c.CheckBatch(ctx, items)
//	var bad client.ItemErrors
//	if errors.As(err, &bad) {
//		for _, e := range bad {
//			log.Printf("item %d (%s): %s", e.Index, items[e.Index].Recipient, e.Message)
//		}
//	} else if err != nil {
//		return err // ErrClosed
//	}
func (c *Client) CheckBatch(ctx context.Context, items []Item) ([]Decision, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	c.st.calls.Add(1)
	c.st.items.Add(int64(len(items)))
	decs := make([]Decision, len(items))
	ps := make([]prepared, len(items))
	todo := make([]int, 0, len(items))
	var errs ItemErrors
	for i := range items {
		p, ierr := prepare(&items[i], i)
		if ierr != nil {
			errs = append(errs, ierr)
			continue
		}
		if p.id == 0 {
			p.id = c.newID()
		}
		ps[i] = p
		todo = append(todo, i)
	}
	dl := c.deadline(ctx, time.Now())
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	var cause error
	var avoid string
	var began time.Time
	for attempt := 0; attempt < 2 && len(todo) > 0; attempt++ {
		if attempt > 0 {
			if ctx.Err() != nil {
				break
			}
			c.st.retries.Add(int64(len(todo)))
			c.refreshForRetry(ctx, dl, avoid, began)
		}
		began = time.Now()
		actx, acancel := context.WithDeadline(ctx, attemptDeadline(attempt, began, dl))
		todo, cause, avoid = c.sendBatch(actx, ps, todo, decs, &errs)
		acancel()
		if len(todo) > 0 && c.closed.Load() {
			return nil, ErrClosed
		}
	}
	for _, i := range todo {
		decs[i] = c.degrade(cause)
	}
	if len(errs) > 0 {
		c.st.itemErrors.Add(int64(len(errs)))
		slices.SortFunc(errs, func(a, b *ItemError) int { return a.Index - b.Index })
		return decs, errs
	}
	return decs, nil
}

// sendBatch is one attempt of CheckBatch for the items todo: one RPC per
// owner and chunk, in parallel. It fills decs and errs and returns the items
// to retry, the cause of their failure and the address of a member that
// failed.
func (c *Client) sendBatch(ctx context.Context, ps []prepared, todo []int, decs []Decision, errs *ItemErrors) (retry []int, cause error, failed string) {
	rt := c.cur.Load()
	type group struct {
		m   ring.Member
		idx []int
	}
	var groups []*group
	if len(rt.members) > 0 {
		byOwner := make([]*group, len(rt.members))
		for _, i := range todo {
			o := rt.ownerIndex(ps[i].recipient)
			g := byOwner[o]
			if g == nil {
				g = &group{m: rt.members[o]}
				byOwner[o] = g
				groups = append(groups, g)
			}
			g.idx = append(g.idx, i)
		}
	} else {
		groups = []*group{{idx: todo}} // fails below: no member
	}
	var mu sync.Mutex // guards retry, cause, failed and errs
	fail := func(idx []int, err error, addr string) {
		mu.Lock()
		retry = append(retry, idx...)
		cause, failed = err, addr
		mu.Unlock()
	}
	send := func(m ring.Member, idx []int) {
		if m.Addr == "" {
			fail(idx, errors.New("client: the ring is empty"), "")
			return
		}
		p, err := c.peer(m.Addr)
		if err != nil {
			fail(idx, err, m.Addr)
			return
		}
		c.rpc(ctx, p, m.Name, len(idx), func(j int) *prepared { return &ps[idx[j]] }, func(j int, o outcome) {
			i := idx[j]
			switch {
			case o.ierr != nil:
				mu.Lock()
				*errs = append(*errs, o.ierr.at(i, j))
				mu.Unlock()
			case o.err != nil:
				fail([]int{i}, o.err, m.Addr)
			default:
				decs[i] = o.dec // each i belongs to one RPC
			}
		})
	}
	var wg sync.WaitGroup
	var last func()
	for _, g := range groups {
		for chunk := range slices.Chunk(g.idx, MaxRequestItems) {
			if last != nil {
				wg.Go(last)
			}
			last = func() { send(g.m, chunk) }
		}
	}
	if last != nil {
		last() // the last RPC in this goroutine
	}
	wg.Wait()
	slices.Sort(retry)
	return retry, cause, failed
}
