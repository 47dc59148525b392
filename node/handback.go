package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// This file is rule 7 (partition.go), the sender's side: a node that decided
// for a partition it no longer owns tells the owner, which acquires it again.

// handbackResend is how long a node that told an owner of a partition it
// owes (rule 7) waits for the owner to acquire it before telling it again
// under the same ring: a handback the owner took can still be lost to it
// (a move that began before it and could not ask this node), and a
// partition never acquired from here is lost when this node leaves.
const handbackResend = time.Second

// handbackLoop sends the handbacks of rule 7 apart from the mover, so that a
// slow or unreachable owner never holds up this node's own moves: on each
// wake-up and new ring, after a failure every acquireRetry, and every
// handbackResend while an owner has not acquired what it was told of, it
// tells each owner under the current ring of the partitions this node owes
// it, until ctx is done.
func (n *Node) handbackLoop(ctx context.Context) {
	h := n.ho
	var retry, resend <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.hbKick:
		case <-h.ringChanged():
		case <-retry:
		case <-resend:
		}
		retry, resend = nil, nil
		c := n.clus.Load()
		r := c.ring()
		owedTo := map[string][]uint32{}
		waiting := false // told, not yet acquired
		now := time.Now()
		h.mu.Lock()
		if h.handbackEpoch != r.Epoch() {
			h.handbackEpoch = r.Epoch()
			for p := range h.parts {
				h.parts[p].handbackAt = time.Time{}
			}
		}
		for p := range n.store.Partitions() {
			if !h.owes(p) {
				continue
			}
			if at := h.parts[p].handbackAt; !at.IsZero() && now.Sub(at) < handbackResend {
				waiting = true
				continue
			}
			if o := r.PartitionOwner(p).Name; o != "" && o != c.self.Name {
				owedTo[o] = append(owedTo[o], uint32(p))
			}
		}
		h.mu.Unlock()
		if waiting || len(owedTo) > 0 {
			resend = time.After(handbackResend)
		}
		if len(owedTo) == 0 {
			continue
		}
		if err := n.handback(ctx, r, owedTo); err != nil && ctx.Err() == nil {
			n.log.Debug("handbacks incomplete; retrying", "epoch", r.Epoch(), "err", err)
			retry = time.After(acquireRetry)
		}
	}
}

// handback tells each owner under r of the partitions this node decided for
// and no longer owns (rule 7); a failure is retried with the reconcile.
func (n *Node) handback(ctx context.Context, r *ring.Ring, owedTo map[string][]uint32) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for name, parts := range owedTo {
		n.ho.mu.Lock()
		parts = slices.DeleteFunc(parts, func(p uint32) bool { return !n.ho.owes(int(p)) })
		n.ho.mu.Unlock()
		if len(parts) == 0 {
			continue
		}
		var m ring.Member
		for _, x := range r.Members() {
			if x.Name == name {
				m = x
			}
		}
		wg.Go(func() {
			err := func() error {
				cli, err := n.peers.Peer(m)
				if err != nil {
					return err
				}
				hctx, cancel := context.WithTimeout(ctx, ForwardTimeout)
				defer cancel()
				req := &pb.HandbackRequest{Node: n.cfg.Name, RingEpoch: r.Epoch(), Partitions: parts}
				n.ho.mu.Lock()
				for _, p := range parts {
					req.Generations = append(req.Generations, n.ho.parts[p].gen)
				}
				n.ho.mu.Unlock()
				_, err = cli.Handback(hctx, req)
				return err
			}()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("handing %d partitions back to %s: %w", len(parts), name, err))
				return
			}
			now := time.Now()
			again := true // every partition was told before under this ring
			n.ho.mu.Lock()
			for _, p := range parts {
				again = again && !n.ho.parts[p].handbackAt.IsZero()
				n.ho.parts[p].handbackAt = now
			}
			n.ho.mu.Unlock()
			level := slog.LevelInfo
			if again {
				level = slog.LevelDebug
			}
			n.log.Log(ctx, level, "partitions handed back: decided here under another ring", "to", name, "partitions", parts, "epoch", r.Epoch(), "again", again)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
