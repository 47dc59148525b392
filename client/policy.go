package client

import (
	"context"
	"fmt"
	"time"
)

// FailurePolicy says what a check answers when no node can decide it before
// its deadline.
type FailurePolicy int

const (
	// FailOpen admits (Admitted and Degraded true): the sending pipeline
	// keeps working while the limiter does not. The default.
	FailOpen FailurePolicy = iota
	// FailClosed denies (Admitted false, Degraded true).
	FailClosed
)

func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "FailOpen"
	case FailClosed:
		return "FailClosed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// degradedLogEvery spaces the warnings logged while decisions degrade.
const degradedLogEvery = time.Second

// deadline returns the deadline of a call starting at now: the caller's, or
// now+Timeout if that is earlier.
func (c *Client) deadline(ctx context.Context, now time.Time) time.Time {
	d := now.Add(c.cfg.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(d) {
		return dl
	}
	return d
}

// attemptDeadline returns the deadline of an attempt that begins at began,
// of a call with deadline dl. An attempt gets three quarters of the time
// left, so that a node that takes the call and never answers leaves time
// for a retry; once less than lastAttempt is left, it gets all of it.
func attemptDeadline(began, dl time.Time) time.Time {
	left := dl.Sub(began)
	if left < lastAttempt {
		return dl
	}
	return began.Add(left * 3 / 4)
}

// lastAttempt is the time left below which an attempt takes all of it.
const lastAttempt = 20 * time.Millisecond

// retryPauseMin and retryPauseMax bound the pause before a retry, which
// doubles from the first to the last: a node that fails an item at once
// (it lacks a majority, the partition is moving) is asked again a few times
// a second, not in a tight loop.
const retryPauseMin, retryPauseMax = 5 * time.Millisecond, 100 * time.Millisecond

// retryPause returns the pause before retry number k (1, 2, ...).
func retryPause(k int) time.Duration {
	return min(retryPauseMin<<min(k-1, 8), retryPauseMax)
}

// pauseBeforeRetry waits retryPause(k), ending early at dl or when ctx
// ends, and reports whether the call has time and reason left to retry.
func pauseBeforeRetry(ctx context.Context, k int, dl time.Time) bool {
	d := min(retryPause(k), time.Until(dl))
	if d > 0 {
		t := getTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		putTimer(t)
	}
	return ctx.Err() == nil && time.Now().Before(dl)
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
