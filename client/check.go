package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/freqring/freqring/ring"
)

// Check decides one item on its recipient's owner. Concurrent Checks for
// one node share a Check RPC (see Config.MaxBatch, MaxDelay).
//
// The call ends by ctx's deadline or Timeout after it starts, whichever is
// earlier, or when ctx is canceled. If the owner does not answer (connection
// failure, UNAVAILABLE, the attempt's deadline, any failure that is not the
// item's fault), the client refreshes its ring and sends the item again,
// with the same request id, to the owner under the new ring, until a node
// answers or the call ends: an item whose first attempt was recorded but
// whose answer was lost gets that answer (Decision.Duplicate), not a
// degraded one. If the call ends first, Check answers by the failure policy
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
		c.st.itemFailed(ierr)
		return Decision{}, ierr
	}
	if pi.id == 0 {
		pi.id = c.newID()
	}
	// No context is derived for the deadline: each attempt's timer ends
	// at or before dl, which spares a context and its timer per call.
	dl := c.deadline(ctx, time.Now())
	var cause error
	var avoid string
	var began time.Time
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if !pauseBeforeRetry(ctx, attempt, dl) {
				break
			}
			c.st.retries.Add(1)
			c.refreshForRetry(ctx, dl, avoid, began)
		}
		began = time.Now()
		var o outcome
		o, avoid = c.checkOnce(ctx, &pi, attemptDeadline(began, dl))
		switch {
		case o.ierr != nil:
			c.st.itemFailed(o.ierr)
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
	t := getTimer(time.Until(adl))
	defer putTimer(t)
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

// CheckBatch decides items, sending one request per owner (more for an
// owner of more than 10,000 items) in parallel, each on one of a pool of
// CheckStreams to its owner (see Config.UnaryChecks), and returns their decisions
// in order. Deadline, retry and failure policy are those of Check, per item:
// items whose owner answered keep their decisions, the others are retried
// after a ring refresh until the deadline, and those still undecided then
// are answered by the policy.
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
	for attempt := 0; len(todo) > 0; attempt++ {
		if attempt > 0 {
			if !pauseBeforeRetry(ctx, attempt, dl) {
				break
			}
			c.st.retries.Add(int64(len(todo)))
			c.refreshForRetry(ctx, dl, avoid, began)
		}
		began = time.Now()
		actx, acancel := context.WithDeadline(ctx, attemptDeadline(began, dl))
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
		c.st.itemFailed(errs...)
		slices.SortFunc(errs, func(a, b *ItemError) int { return a.Index - b.Index })
		return decs, errs
	}
	return decs, nil
}

// sendBatch is one attempt of CheckBatch for the items todo: one request per
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
		c.batchRPC(ctx, p, m.Name, len(idx), func(j int) *prepared { return &ps[idx[j]] }, func(j int, o outcome) {
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

// attemptTimers holds stopped timers for checkOnce, one per waiting call
// instead of one allocated per call. Since Go 1.23 a stopped or reset timer
// delivers no stale tick, so a reused timer fires only for its new wait.
var attemptTimers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// getTimer returns a timer that fires after d.
func getTimer(d time.Duration) *time.Timer {
	t := attemptTimers.Get().(*time.Timer)
	t.Reset(d)
	return t
}

// putTimer stops t and keeps it for reuse; its channel must not be read
// after.
func putTimer(t *time.Timer) {
	t.Stop()
	attemptTimers.Put(t)
}
