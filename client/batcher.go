package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// batcher coalesces the single Checks sent to one member into batch RPCs
// (see loop), each in a goroutine of its own, and hands each caller its
// outcome. It is a group commit: callers queue under a mutex and wake the
// loop only on the first item and on a full batch.
type batcher struct {
	c *Client
	p *peer

	mu     sync.Mutex // guards q and closed
	q      []*pending
	closed bool

	wake chan struct{} // cap 1: the queue went from empty to non-empty, or is full
	quit chan struct{} // closed by close
	once sync.Once

	st *checkStream // the loop's CheckStream to the member; nil until the first batch (stream.go)
}

func newBatcher(c *Client, p *peer) *batcher {
	return &batcher{c: c, p: p, wake: make(chan struct{}, 1), quit: make(chan struct{})}
}

// batcher returns p's batcher, starting it on first use.
func (c *Client) batcher(p *peer) (*batcher, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if p.b == nil {
		if c.peers[p.addr] != p {
			return nil, errMemberLeft // pruned since the caller looked it up
		}
		p.b = newBatcher(c, p)
		c.loops.Add(1)
		go p.b.loop()
	}
	return p.b, nil
}

// pending is a single Check's item queued on a batcher.
type pending struct {
	item     prepared
	node     string    // the member the item was routed to
	deadline time.Time // the attempt's; the batch RPC lasts until the latest
	res      chan outcome
	gone     atomic.Bool // the caller stopped waiting: do not send it
}

// errMemberLeft fails the items queued for a member that left the ring.
var errMemberLeft = errors.New("client: the member left the ring before the item was sent")

// enqueue queues pd. It returns false if the batcher is closed (its member
// left the ring, or the client closed).
func (b *batcher) enqueue(pd *pending) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.q = append(b.q, pd)
	n := len(b.q)
	b.mu.Unlock()
	if n == 1 || n >= b.c.cfg.MaxBatch {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// close stops the loop; queued items fail as retryable (errMemberLeft).
func (b *batcher) close() {
	b.once.Do(func() { close(b.quit) })
}

// queued returns the queue length.
func (b *batcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.q)
}

// loop runs until close. The Client's loops group owns it.
//
// It sends what is queued at once while fewer than Config.MaxInFlight of its
// RPCs are outstanding, so a lone call pays no delay; while the limit is
// reached, items queue, and the next RPC takes all that queued (up to
// MaxBatch) as soon as one returns: the batch size follows the load. A
// positive MaxDelay also makes each batch wait that long for more items. (It
// uses no timer otherwise: Go timers below a millisecond fire a millisecond
// late when the process is idle, which a timer-driven batcher pays on every
// call.)
func (b *batcher) loop() {
	defer b.c.loops.Done()
	maxBatch, delay, maxInFlight := b.c.cfg.MaxBatch, b.c.cfg.MaxDelay, b.c.cfg.MaxInFlight
	inflight := 0
	done := make(chan struct{}, maxInFlight) // an RPC of this batcher returned
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-b.quit:
			b.drain()
			if b.st != nil {
				b.st.cancel() // its calls fail as retryable
			}
			return
		case <-b.wake:
		case <-done:
			inflight--
		}
		for inflight < maxInFlight {
			n := b.queued()
			if n == 0 {
				break
			}
			if n < maxBatch && delay > 0 {
				// Wait for more items, MaxDelay at most.
				timer.Reset(delay)
				for waiting := true; waiting; {
					select {
					case <-timer.C:
						waiting = false
					case <-done:
						inflight--
					case <-b.wake:
						if waiting = b.queued() < maxBatch; !waiting {
							timer.Stop()
						}
					case <-b.quit:
						timer.Stop()
						b.drain()
						if b.st != nil {
							b.st.cancel()
						}
						return
					}
				}
			}
			b.mu.Lock()
			take := min(len(b.q), maxBatch)
			batch := b.q[:take:take]
			b.q = b.q[take:]
			if len(b.q) == 0 {
				b.q = nil
			}
			b.mu.Unlock()
			if b.send(batch, done) {
				inflight++
			}
		}
	}
}

// drain closes the queue and fails what it holds.
func (b *batcher) drain() {
	b.mu.Lock()
	b.closed = true
	q := b.q
	b.q = nil
	b.mu.Unlock()
	for _, pd := range q {
		pd.res <- outcome{err: errMemberLeft}
	}
}

// send sends one batch, without the items whose callers have stopped
// waiting, as a request on the member's CheckStream (a unary Check RPC with
// Config.UnaryChecks, or while the node lacks CheckStream), and reports
// whether it did; the request signals done when it is answered or failed.
// It lasts until the latest of the items' deadlines.
func (b *batcher) send(batch []*pending, done chan<- struct{}) bool {
	now := time.Now()
	live := batch[:0]
	var dl time.Time
	for _, pd := range batch {
		if pd.gone.Load() || !pd.deadline.After(now) {
			continue // its caller has given up; nobody reads the outcome
		}
		live = append(live, pd)
		if pd.deadline.After(dl) {
			dl = pd.deadline
		}
	}
	if len(live) == 0 {
		return false
	}
	if len(live) > 1 {
		b.c.st.coalesced.Add(int64(len(live)))
	}
	if b.c.useStream(b.p) {
		return b.stream(live, dl, done)
	}
	b.unary(live, dl, done)
	return true
}

// unary sends live in one Check RPC, in a goroutine, lasting until dl, and
// signals done when it returns.
func (b *batcher) unary(live []*pending, dl time.Time, done chan<- struct{}) {
	b.c.rpcs.Add(1)
	go func() {
		defer b.c.rpcs.Done()
		defer func() { done <- struct{}{} }() // buffered for every RPC in flight: never blocks
		ctx, cancel := context.WithDeadline(b.c.life, dl)
		defer cancel()
		b.c.rpc(ctx, b.p, live[0].node, len(live), func(j int) *prepared { return &live[j].item }, func(j int, o outcome) {
			if o.ierr != nil {
				o.ierr = o.ierr.at(0, j) // the caller's only item
			}
			live[j].res <- o
		})
	}()
}
