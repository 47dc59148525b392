package bench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/window"
)

// APIFreqringTarget checks the seed 004 workload through the ring-aware
// client: a request of n calls is one CheckBatch of 2n items, each call's
// (app, ip) key in domain api-ip and its (app, user, interface) key in
// domain api-user, which the client splits into one RPC per owner (a request
// of one call: two single Checks, which the client coalesces). The two
// keys of a call are decided independently (they live on different nodes);
// each records its own admitted check. With Refund, a key that admitted a
// call the other key denied is refunded (by its request id, in one more
// CheckBatch), so that it counts, as in the Redis scripts, only allowed
// calls.
type APIFreqringTarget struct {
	*FreqringTarget
	Refund bool
}

// NewAPIFreqringTarget connects a client to the cluster behind seeds, whose
// rules must have the domains api-ip and api-user.
func NewAPIFreqringTarget(ctx context.Context, seeds []string, cfg client.Config) (*APIFreqringTarget, error) {
	ft, err := NewFreqringTarget(ctx, seeds, APIIPDomain, 0, cfg)
	if err != nil {
		return nil, err
	}
	return &APIFreqringTarget{FreqringTarget: ft}, nil
}

// Name implements APITarget.
func (t *APIFreqringTarget) Name() string {
	if t.Refund {
		return "freqring-refund"
	}
	return "freqring"
}

// CheckCalls implements APITarget.
func (t *APIFreqringTarget) CheckCalls(ctx context.Context, calls []Call, out []CallResult) error {
	items := make([]client.Item, 2*len(calls))
	for i, c := range calls {
		items[2*i] = client.Item{Domain: APIIPDomain, Recipient: c.IPKey()}
		items[2*i+1] = client.Item{Domain: APIUserDomain, Recipient: c.UserKey()}
		if t.Refund {
			items[2*i].RequestID, items[2*i+1].RequestID = randID(), randID()
		}
	}
	decs, failed, err := t.decide(ctx, items)
	if err != nil {
		return err
	}
	var refunds []client.Item
	var refundOf []int // item index of each refund
	for i := range calls {
		ip, us := decs[2*i], decs[2*i+1]
		o := CallResult{IPAt: ip.DecidedAt.UnixMilli(), UserAt: us.DecidedAt.UnixMilli(),
			IPRecorded: ip.Recorded && !ip.Degraded, UserRecorded: us.Recorded && !us.Degraded}
		switch {
		case failed[2*i] != nil:
			o.Err = failed[2*i]
		case failed[2*i+1] != nil:
			o.Err = failed[2*i+1]
		case ip.Degraded || us.Degraded:
			o.Degraded = true
		case ip.Admitted && us.Admitted:
			o.Allowed = true
		case !ip.Admitted && !us.Admitted:
			o.DeniedBy = "ip+user"
		case !ip.Admitted:
			o.DeniedBy = "ip"
		default:
			o.DeniedBy = "user"
		}
		if t.Refund && o.DeniedBy != "" {
			for k, rec := range []bool{o.IPRecorded, o.UserRecorded} {
				if rec {
					it := items[2*i+k]
					it.Mode = client.Refund
					refunds = append(refunds, it)
					refundOf = append(refundOf, 2*i+k)
				}
			}
		}
		out[i] = o
	}
	return settleRefunds(ctx, t.decide, refunds, refundOf, out)
}

// refundTries bounds the attempts at one refund (each the client's call,
// with its own retry).
const refundTries = 5

// settleRefunds sends refunds (refundOf[j] is the item index, 2*call+key,
// of refunds[j]) through decide and marks each send taken back as not
// recorded in out.
//
// A refund's answer is definite when it says Refunded, or Duplicate (an
// earlier attempt of this very refund, whose answer the client lost and
// retried, took the send back: the bench refunds each id once), or the
// item failed (refused: nothing changed). A degraded refund (no node
// answered in time) may or may not have been applied: it is sent again
// with the same request id, which a node applies at most once, until its
// answer is definite. One still unknown after refundTries fails its call,
// and its send is left out of the oracle's replay, which must never count
// a send the node may have taken back.
func settleRefunds(ctx context.Context, decide func(context.Context, []client.Item) ([]client.Decision, []error, error), refunds []client.Item, refundOf []int, out []CallResult) error {
	for try := 0; len(refunds) > 0; try++ {
		rdecs, failed, err := decide(ctx, refunds)
		if err != nil {
			return err
		}
		var again []client.Item
		var againOf []int
		for j, d := range rdecs {
			k := refundOf[j]
			switch {
			case failed[j] != nil:
				// Refused (not retryable): the node changed nothing, and
				// the send still counts.
				if out[k/2].Err == nil {
					out[k/2].Err = fmt.Errorf("bench: refund: %w", failed[j])
				}
			case d.Degraded && try+1 < refundTries:
				again = append(again, refunds[j])
				againOf = append(againOf, k)
			case d.Degraded:
				if out[k/2].Err == nil {
					out[k/2].Err = fmt.Errorf("bench: refund of request id %d: no node answered in %d tries", refunds[j].RequestID, refundTries)
				}
				out[k/2].setRecorded(k%2, false) // the oracle must not count a send the node may have taken back
			case d.Refunded || d.Duplicate:
				out[k/2].setRecorded(k%2, false)
			}
		}
		refunds, refundOf = again, againOf
	}
	return nil
}

// setRecorded sets whether the call's key k (0: ip, 1: user) counts.
func (o *CallResult) setRecorded(k int, rec bool) {
	if k == 0 {
		o.IPRecorded = rec
	} else {
		o.UserRecorded = rec
	}
}

// decide checks items: up to two (a single call's keys) as concurrent
// single Checks, which the client coalesces with other callers' on a
// CheckStream per node, as FreqringTarget does a batch of one; more in one
// CheckBatch. It returns the decisions, each item's failure, and an error
// that fails the whole call.
func (t *APIFreqringTarget) decide(ctx context.Context, items []client.Item) ([]client.Decision, []error, error) {
	decs := make([]client.Decision, len(items))
	failed := make([]error, len(items))
	if len(items) <= 2 {
		var wg sync.WaitGroup
		for i := range items {
			wg.Go(func() { decs[i], failed[i] = t.c.Check(ctx, items[i]) })
		}
		wg.Wait()
		for i, err := range failed {
			if errors.Is(err, client.ErrClosed) {
				return nil, nil, err
			}
			if err != nil {
				decs[i] = client.Decision{}
			}
		}
		return decs, failed, nil
	}
	decs, err := t.c.CheckBatch(ctx, items)
	var bad client.ItemErrors
	if err != nil && !errors.As(err, &bad) {
		return nil, nil, err
	}
	for _, e := range bad {
		failed[e.Index] = e
	}
	return decs, failed, nil
}

// Memory implements APITarget: the nodes' store heap and the keys they own.
func (t *APIFreqringTarget) Memory(ctx context.Context) (int64, int64, error) {
	return t.FreqringTarget.Memory(ctx)
}

func randID() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// apiFixedScript is seed 004's design on Redis: a counter per key and
// aligned window, K = MD5(parts):window number, counted with INCR and
// expired after the window (seed 004: EXPIRE 1 hour). The seed computes the
// hour into the MD5 on the client; here the window number is Redis's, from
// TIME, appended to the MD5 of the parts, so that the key and the decision
// time the oracle replays agree at a window boundary. Both keys of a call
// are checked first and incremented only if both are below their limits
// (seed 004: "check whether the count reached its maximum; if so return,
// else insert"), in one script: atomic, and denied calls are not counted.
// KEYS are the keys' MD5s; ARGV each key's window (ms) and limit. Returns
// {allowed, now, denying key index}.
const apiFixedScript = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local keys = {}
for i = 1, #KEYS do
    local w = tonumber(ARGV[2 * i - 1])
    keys[i] = KEYS[i] .. ':' .. math.floor(now / w)
    local c = tonumber(redis.call('GET', keys[i]) or '0')
    if c >= tonumber(ARGV[2 * i]) then
        return {0, now, i}
    end
end
for i = 1, #KEYS do
    if redis.call('INCR', keys[i]) == 1 then
        redis.call('PEXPIRE', keys[i], tonumber(ARGV[2 * i - 1]))
    end
end
return {1, now, 0}
`

// apiHashScript is seed 003's sliding window as a Redis Hash of sub-window
// counters: field k counts the sends of sub-window [kB, (k+1)B). For each
// key it reads the fields (HGETALL), sums those still inside the window by
// window/counter.go's definition (field k counts at now while
// (k+1)B-1+W > now) and deletes the others (HDEL); if every key is below its
// limit it increments the current field of each (HINCRBY) and sets the
// key's expiry (PEXPIRE W+B). Seed 003 increments first and counts denied
// attempts; here, as in freqring, a denied call is not counted, and both
// keys are decided in one script (atomic). ARGV holds each key's window
// (ms), limit and sub-window width (ms). Returns {allowed, now, denying key}.
const apiHashScript = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for i = 1, #KEYS do
    local w = tonumber(ARGV[3 * i - 2])
    local b = tonumber(ARGV[3 * i])
    local h = redis.call('HGETALL', KEYS[i])
    local sum = 0
    local dead = {}
    for j = 1, #h, 2 do
        local k = tonumber(h[j])
        if (k + 1) * b - 1 + w > now then
            sum = sum + tonumber(h[j + 1])
        else
            dead[#dead + 1] = h[j]
        end
    end
    if #dead > 0 then
        redis.call('HDEL', KEYS[i], unpack(dead))
    end
    if sum >= tonumber(ARGV[3 * i - 1]) then
        return {0, now, i}
    end
end
for i = 1, #KEYS do
    local w = tonumber(ARGV[3 * i - 2])
    local b = tonumber(ARGV[3 * i])
    redis.call('HINCRBY', KEYS[i], math.floor(now / b), 1)
    redis.call('PEXPIRE', KEYS[i], w + b)
end
return {1, now, 0}
`

// APIRedisTarget runs the seed 004 workload on one Redis server, one script
// per call, a request's calls in one pipeline: seed 004's fixed hourly
// counters (rules of algorithm fixed-window) or seed 003's hash of
// sub-window counters (sliding-counter).
type APIRedisTarget struct {
	rdb    *redis.Client
	rules  APIRules
	sha    string
	prefix string
	args   []any
	base   int64
}

// NewAPIRedisTarget connects to the Redis at addr and loads the script of
// the rules' algorithm (both rules must have the same one).
func NewAPIRedisTarget(ctx context.Context, addr string, rules APIRules) (*APIRedisTarget, error) {
	if err := rules.Validate(); err != nil {
		return nil, err
	}
	if rules.IP.Algorithm != rules.User.Algorithm {
		return nil, fmt.Errorf("bench: redis api target: the rules' algorithms differ (%v, %v)", rules.IP.Algorithm, rules.User.Algorithm)
	}
	if a := rules.IP.Algorithm; a != window.FixedWindow && a != window.SlidingCounter {
		return nil, fmt.Errorf("bench: redis api target: algorithm %v has no Redis design in the seeds (fixed-window: seed 004's, sliding-counter: seed 003's)", a)
	}
	if rules.IP.Borrow > 0 || rules.User.Borrow > 0 {
		return nil, fmt.Errorf("bench: redis api target: borrow %d, %d: the seeds' Redis designs do not borrow", rules.IP.Borrow, rules.User.Borrow)
	}
	t := &APIRedisTarget{rules: rules}
	script := apiFixedScript
	t.prefix = "api4:"
	t.args = []any{rules.IP.WindowMillis(), rules.IP.Limit, rules.User.WindowMillis(), rules.User.Limit}
	if rules.IP.Algorithm == window.SlidingCounter {
		script = apiHashScript
		t.prefix = "api3:"
		width := func(r window.Rule) int64 {
			n := r.Buckets
			if n == 0 {
				n = window.DefaultBuckets
			}
			return r.WindowMillis() / int64(n)
		}
		t.args = []any{rules.IP.WindowMillis(), rules.IP.Limit, width(rules.IP), rules.User.WindowMillis(), rules.User.Limit, width(rules.User)}
	}
	t.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	var err error
	if t.sha, err = t.rdb.ScriptLoad(ctx, script).Result(); err != nil {
		t.rdb.Close()
		return nil, fmt.Errorf("bench: redis %s: %w", addr, err)
	}
	if t.base, err = (&RedisTarget{rdb: t.rdb}).usedMemory(ctx); err != nil {
		t.rdb.Close()
		return nil, err
	}
	return t, nil
}

// Name implements APITarget.
func (t *APIRedisTarget) Name() string {
	if t.rules.IP.Algorithm == window.SlidingCounter {
		return "redis-hash-003"
	}
	return "redis-fixed-004"
}

func md5Key(prefix string, parts ...string) string {
	h := md5.New()
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte(KeySep))
		}
		h.Write([]byte(p))
	}
	return prefix + hex.EncodeToString(h.Sum(nil))
}

// CheckCalls implements APITarget.
func (t *APIRedisTarget) CheckCalls(ctx context.Context, calls []Call, out []CallResult) error {
	pipe := t.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		app := AppName(c.App)
		keys := []string{
			md5Key(t.prefix+"ip:", app, IPName(c.IP)),
			md5Key(t.prefix+"user:", app, InterfaceName(c.Interface), UserName(c.User)),
		}
		cmds[i] = pipe.EvalSha(ctx, t.sha, keys, t.args...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("bench: redis: %w", err)
	}
	for i := range calls {
		v, err := cmds[i].Slice()
		if err != nil || len(v) < 3 {
			out[i] = CallResult{Err: fmt.Errorf("bench: redis reply %v: %v", v, err)}
			continue
		}
		a, _ := v[0].(int64)
		at, _ := v[1].(int64)
		by, _ := v[2].(int64)
		o := CallResult{Allowed: a == 1, IPAt: at, UserAt: at, IPRecorded: a == 1, UserRecorded: a == 1}
		switch by {
		case 1:
			o.DeniedBy = "ip"
		case 2:
			o.DeniedBy = "user"
		}
		out[i] = o
	}
	return nil
}

// Memory implements APITarget: used_memory above what it was when the
// target connected, and the number of its keys (SCAN of its prefix; a
// fixed window's keys of past windows count until they expire).
func (t *APIRedisTarget) Memory(ctx context.Context) (int64, int64, error) {
	used, err := (&RedisTarget{rdb: t.rdb}).usedMemory(ctx)
	if err != nil {
		return 0, 0, err
	}
	var n int64
	iter := t.rdb.Scan(ctx, 0, t.prefix+"*", 10_000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return used - t.base, n, iter.Err()
}

// Close implements APITarget.
func (t *APIRedisTarget) Close() error { return t.rdb.Close() }
