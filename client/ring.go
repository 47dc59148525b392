package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// Timings of the ring watch and the seed rounds of New.
const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
	// asyncRefreshTimeout bounds a refresh started by a response that carried
	// another epoch (no caller waits on it).
	asyncRefreshTimeout = 2 * time.Second
	// asyncRefreshGap spaces those refreshes: while nodes disagree on the
	// ring (for a gossip round or two after a change), responses alternate
	// between their epochs, and each would ask for the ring again.
	asyncRefreshGap = 50 * time.Millisecond
)

// flight is one Ring fetch that concurrent refreshes share.
type flight struct {
	done chan struct{}
	err  error
}

// refreshRequest asks the refresh loop to fetch the ring from addr, whose
// node answered with epoch.
type refreshRequest struct {
	addr  string
	epoch uint64
}

// bootstrap asks every seed for the ring at once, in rounds with backoff,
// until one answers with a ring this build places identically, or ctx ends.
func (c *Client) bootstrap(ctx context.Context) (*ring.Ring, error) {
	type answer struct {
		seed string
		r    *ring.Ring
		err  error
	}
	backoff := backoffMin
	for round := 1; ; round++ {
		// A round ends when every seed has answered or failed; a seed that
		// does not answer at all must not hold the others' next round.
		rctx, cancel := context.WithTimeout(ctx, max(4*c.cfg.Timeout, 2*time.Second))
		answers := make(chan answer, len(c.cfg.Seeds))
		for _, s := range c.cfg.Seeds {
			go func() {
				p, err := c.peer(s)
				if err != nil {
					answers <- answer{s, nil, err}
					return
				}
				resp, err := p.cli.Ring(rctx, &pb.RingRequest{})
				if err != nil {
					answers <- answer{s, nil, err}
					return
				}
				r, err := ringOf(resp)
				answers <- answer{s, r, err}
			}()
		}
		var errs []error
		var found *ring.Ring
		var mismatch error
		for range c.cfg.Seeds { // every goroutine of the round has sent when this ends
			a := <-answers
			switch {
			case a.err == nil && found == nil:
				found = a.r
				cancel() // the others need not finish
			case errors.Is(a.err, ErrEpochMismatch):
				mismatch = a.err
			case a.err != nil:
				errs = append(errs, fmt.Errorf("seed %s: %w", a.seed, a.err))
			}
		}
		cancel()
		switch {
		case found != nil:
			return found, nil
		case mismatch != nil:
			return nil, mismatch // retrying cannot help
		}
		c.log.Warn("no seed answered the Ring RPC", "round", round, "err", errors.Join(errs...))
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("client: no seed of %v answered with a ring before ctx ended (%w): %w", c.cfg.Seeds, ctx.Err(), errors.Join(errs...))
		case <-t.C:
		}
		backoff = min(2*backoff, backoffMax)
	}
}

// ringOf builds the ring a node described, and checks that this build
// computes the node's epoch from it.
func ringOf(resp *pb.RingResponse) (*ring.Ring, error) {
	if resp.Placement == nil {
		return nil, fmt.Errorf("client: node %s sent a ring without placement parameters", resp.Node)
	}
	if len(resp.Members) == 0 || resp.Epoch == 0 {
		return nil, fmt.Errorf("client: node %s has an empty ring (epoch %d, %d members)", resp.Node, resp.Epoch, len(resp.Members))
	}
	ms := make([]ring.Member, len(resp.Members))
	for i, m := range resp.Members {
		ms[i] = ring.Member{Name: m.Name, Addr: m.Addr}
	}
	pl := resp.Placement
	r, err := ring.New(ms, ring.Config{PartitionCount: int(pl.PartitionCount), ReplicationFactor: int(pl.ReplicationFactor), Load: pl.Load})
	if err != nil {
		return nil, fmt.Errorf("client: ring of node %s: %w", resp.Node, err)
	}
	if r.Epoch() != resp.Epoch {
		return nil, fmt.Errorf("%w: node %s reports epoch %016x for %d members (partitions %d, replication %d, load %g); this client computes %016x from the same: the node and this client place keys differently (another version of package ring?)",
			ErrEpochMismatch, resp.Node, resp.Epoch, len(ms), pl.PartitionCount, pl.ReplicationFactor, pl.Load, r.Epoch())
	}
	return r, nil
}

// install makes r the ring calls route by, unless it has the current epoch,
// and closes the connections of members that left. It reports whether the
// ring changed.
func (c *Client) install(r *ring.Ring, source string) bool {
	c.installMu.Lock()
	defer c.installMu.Unlock()
	var old *ring.Ring
	if rt := c.cur.Load(); rt != nil {
		old = rt.r
	}
	if old != nil && old.Epoch() == r.Epoch() {
		return false
	}
	c.cur.Store(newRoutes(r))
	c.st.ringChanges.Add(1)
	oldEpoch := uint64(0)
	if old != nil {
		oldEpoch = old.Epoch()
	}
	c.log.Info("ring changed", "epoch", r.Epoch(), "old_epoch", oldEpoch, "members", r.Len(), "from", source)

	keep := make(map[string]bool, r.Len())
	for _, m := range r.Members() {
		keep[m.Addr] = true
	}
	var gone []*peer
	c.mu.Lock()
	for addr, p := range c.peers {
		if !keep[addr] {
			gone = append(gone, p)
			delete(c.peers, addr)
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	for _, p := range gone {
		p.close()
	}
	return true
}

// ringChanged returns a channel closed at the next ring change.
func (c *Client) ringChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Ring returns the ring the client routes by now. It is never nil.
func (c *Client) Ring() *ring.Ring { return c.cur.Load().r }

// routes is a ring with its partition table flattened to member indexes, so
// that a batch groups its items by owner without hashing addresses.
type routes struct {
	r       *ring.Ring
	members []ring.Member // sorted by name
	owner   []int32       // partition -> index in members
}

func newRoutes(r *ring.Ring) *routes {
	rt := &routes{r: r, members: r.Members(), owner: make([]int32, r.Config().PartitionCount)}
	index := make(map[string]int32, len(rt.members))
	for i, m := range rt.members {
		index[m.Name] = int32(i)
	}
	for p := range rt.owner {
		rt.owner[p] = index[r.PartitionOwner(p).Name]
	}
	return rt
}

// ownerIndex returns the index in members of the owner of recipient. The
// ring must not be empty.
func (rt *routes) ownerIndex(recipient string) int {
	return int(rt.owner[rt.r.PartitionString(recipient)])
}

// watchLoop keeps a WatchRing stream open to some member and installs every
// ring it sends. When the stream breaks it reconnects, to another member if
// there is one, with jittered exponential backoff (reset by a stream that
// delivered a ring).
func (c *Client) watchLoop() {
	defer c.loops.Done()
	backoff := backoffMin
	last := ""
	for {
		addr := c.pickAddr(last)
		got, err := c.watch(addr)
		if c.life.Err() != nil {
			return
		}
		c.log.Debug("ring watch ended", "addr", addr, "received", got, "err", err)
		if got {
			backoff = backoffMin
		}
		t := time.NewTimer(jitter(backoff))
		select {
		case <-c.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, backoffMax)
		last = addr
	}
}

// watch follows the WatchRing stream of the node at addr until it breaks.
func (c *Client) watch(addr string) (received bool, err error) {
	p, err := c.peer(addr)
	if err != nil {
		return false, err
	}
	stream, err := p.cli.WatchRing(c.life, &pb.RingRequest{})
	if err != nil {
		return false, err
	}
	c.watching.Store(&addr)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		received = true
		r, err := ringOf(resp)
		if err != nil {
			c.log.Error("ignoring a ring from the watch", "addr", addr, "err", err)
			continue
		}
		c.install(r, "watch "+addr)
	}
}

// pickAddr returns a random member address other than avoid, or a random
// seed if there is none.
func (c *Client) pickAddr(avoid string) string {
	var cands []string
	for _, m := range c.Ring().Members() {
		if m.Addr != avoid {
			cands = append(cands, m.Addr)
		}
	}
	if len(cands) == 0 {
		cands = c.cfg.Seeds
	}
	return cands[rand.IntN(len(cands))]
}

// requestRefresh asks the refresh loop, without waiting, to fetch the ring
// from the node at addr, which answered with epoch.
func (c *Client) requestRefresh(addr string, epoch uint64) {
	select {
	case c.refreshReq <- refreshRequest{addr, epoch}:
	default: // one is pending; it will do
	}
}

// refreshLoop serves requestRefresh.
func (c *Client) refreshLoop() {
	defer c.loops.Done()
	for {
		var req refreshRequest
		select {
		case <-c.life.Done():
			return
		case req = <-c.refreshReq:
		}
		if c.Ring().Epoch() == req.epoch {
			continue // the watch was faster
		}
		ctx, cancel := context.WithTimeout(c.life, asyncRefreshTimeout)
		if err := c.refresh(ctx, req.addr, "", time.Time{}); err != nil && c.life.Err() == nil {
			c.log.Debug("ring refresh failed", "err", err)
		}
		cancel()
		t := time.NewTimer(asyncRefreshGap)
		select {
		case <-c.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refresh fetches the ring with a Ring RPC and installs it. It asks prefer
// first (if not ""), then the members in random order with avoid last, then
// the seeds; each try gets half the time left. Concurrent refreshes share one
// fetch. A refresh whose caller's attempt began before the last successful
// fetch began (since) is skipped: that ring is as fresh as one fetched now.
func (c *Client) refresh(ctx context.Context, prefer, avoid string, since time.Time) error {
	if !since.IsZero() && c.lastRefresh.Load() >= since.UnixNano() {
		return nil
	}
	c.flightMu.Lock()
	if f := c.flight; f != nil {
		c.flightMu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	c.flight = f
	c.flightMu.Unlock()

	f.err = c.fetchRing(ctx, prefer, avoid)

	c.flightMu.Lock()
	c.flight = nil
	c.flightMu.Unlock()
	close(f.done)
	return f.err
}

// fetchRing is the work of refresh.
func (c *Client) fetchRing(ctx context.Context, prefer, avoid string) error {
	start := time.Now()
	c.st.ringRefreshes.Add(1)
	var cands []string
	seen := map[string]bool{}
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			cands = append(cands, a)
		}
	}
	add(prefer)
	ms := c.Ring().Members()
	rand.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	for _, m := range ms {
		if m.Addr != avoid {
			add(m.Addr)
		}
	}
	add(avoid)
	for _, s := range c.cfg.Seeds {
		add(s)
	}
	var errs []error
	for i, addr := range cands {
		if ctx.Err() != nil {
			break
		}
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < len(cands)-1 {
			tctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		}
		err := c.fetchFrom(tctx, addr)
		cancel()
		if err == nil {
			for { // keep the latest start
				last := c.lastRefresh.Load()
				if last >= start.UnixNano() || c.lastRefresh.CompareAndSwap(last, start.UnixNano()) {
					break
				}
			}
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if errors.Is(err, ErrClosed) {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return fmt.Errorf("client: ring refresh: %w", errors.Join(errs...))
}

// fetchFrom asks the node at addr for the ring and installs it.
func (c *Client) fetchFrom(ctx context.Context, addr string) error {
	p, err := c.peer(addr)
	if err != nil {
		return err
	}
	resp, err := p.cli.Ring(ctx, &pb.RingRequest{})
	if err != nil {
		return err
	}
	r, err := ringOf(resp)
	if err != nil {
		return err
	}
	c.install(r, "refresh "+addr)
	return nil
}

// jitter returns a random duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
