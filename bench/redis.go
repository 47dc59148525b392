package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/freqring/freqring/window"
)

// seedScript is the seed's frequency_limit.lua (seed 000, §3.2.2), one rule
// per call, changed in one respect only: it also returns the Redis time it
// decided at, so that the oracle can replay what it admitted. It counts
// members in [now-W, now] (a closed window, one millisecond stricter than
// freqring's (now-W, now]), records when the count is below the limit, never
// trims old members, and passes the window in milliseconds to EXPIRE, which
// takes seconds: both bugs are the seed's and are kept, so that the bench
// measures the design users run.
const seedScript = `
local key = KEYS[1]
local windowSize = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local nowMicros = redis.call('time')
local nowMillis = math.floor(nowMicros[1] * 1000 + nowMicros[2] / 1000)
local minScore = nowMillis - windowSize
local count = redis.call('ZCOUNT', key, minScore, nowMillis)
if count < limit then
    local uniqueTimestamp = nowMillis
    while redis.call('ZSCORE', key, uniqueTimestamp) do
        uniqueTimestamp = uniqueTimestamp + 1
    end
    redis.call('ZADD', key, nowMillis, uniqueTimestamp)
    redis.call('EXPIRE', key, windowSize)
end
return {count, nowMillis}
`

// mergedScript is the four-key script seed 000's §5.1 suggests: every rule
// of one check in one call, atomically. It trims each ZSET to its window,
// denies if any rule is at its limit, and otherwise records the send in every
// key, with a correct PEXPIRE. KEYS are the rules' keys; ARGV holds each
// rule's window (ms) and limit. Returns {admitted, now, denying key index}.
const mergedScript = `
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for i = 1, #KEYS do
    local w = tonumber(ARGV[2 * i - 1])
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - w)
    if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 * i]) then
        return {0, now, i}
    end
end
for i = 1, #KEYS do
    local member = now
    while redis.call('ZSCORE', KEYS[i], member) do
        member = member + 1
    end
    redis.call('ZADD', KEYS[i], now, member)
    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2 * i - 1]))
end
return {1, now, 0}
`

// RedisMode selects how the Redis target runs the rules.
type RedisMode int

const (
	// RedisMerged runs the four-key script: one call per check.
	RedisMerged RedisMode = iota
	// RedisPerRule runs the seed's script once per rule: four calls per
	// check, each recording on its own (a rule can record a send another
	// rule denies).
	RedisPerRule
)

// RedisTarget runs the seed's ZSET + Lua design on one Redis server. Items of
// a call go in one pipeline.
type RedisTarget struct {
	rdb   *redis.Client
	mode  RedisMode
	rules []window.Rule
	sha   string
	texts []string // template hashes as hex, for content keys
	base  int64    // used_memory before the run
}

// NewRedisTarget connects to the Redis at addr and loads the script for
// mode. rules are the domain's rules, in order.
func NewRedisTarget(ctx context.Context, addr string, mode RedisMode, rules []window.Rule, templates int) (*RedisTarget, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	script := mergedScript
	if mode == RedisPerRule {
		script = seedScript
	}
	sha, err := rdb.ScriptLoad(ctx, script).Result()
	if err != nil {
		rdb.Close()
		return nil, fmt.Errorf("bench: redis %s: %w", addr, err)
	}
	t := &RedisTarget{rdb: rdb, mode: mode, rules: rules, sha: sha}
	for i := range templates {
		t.texts = append(t.texts, strconv.FormatUint(TemplateHash(uint16(i)), 16))
	}
	if t.base, err = t.usedMemory(ctx); err != nil {
		rdb.Close()
		return nil, err
	}
	return t, nil
}

// Name implements Target.
func (t *RedisTarget) Name() string {
	if t.mode == RedisPerRule {
		return "redis-per-rule"
	}
	return "redis-merged"
}

// prefix keeps the two modes' keys apart on one server.
func (t *RedisTarget) prefix() string {
	if t.mode == RedisPerRule {
		return "frs:"
	}
	return "frm:"
}

// keys returns the ZSET keys of item it, one per rule.
func (t *RedisTarget) keys(dst []string, it Item) []string {
	rcp := RecipientName(it.Recipient)
	p := t.prefix()
	for _, r := range t.rules {
		if r.Scope == window.ScopeRecipient {
			dst = append(dst, p+"{"+rcp+"}:"+r.Name)
		} else {
			dst = append(dst, p+"{"+rcp+"}:"+t.texts[it.Template]+":"+r.Name)
		}
	}
	return dst
}

// Check implements Target.
func (t *RedisTarget) Check(ctx context.Context, items []Item, out []Result) error {
	pipe := t.rdb.Pipeline()
	per := 1
	if t.mode == RedisPerRule {
		per = len(t.rules)
	}
	cmds := make([]*redis.Cmd, 0, len(items)*per)
	var args []any
	for _, r := range t.rules {
		args = append(args, r.WindowMillis(), r.Limit)
	}
	var keys []string
	for _, it := range items {
		keys = t.keys(keys[:0], it)
		if t.mode == RedisMerged {
			cmds = append(cmds, pipe.EvalSha(ctx, t.sha, append([]string(nil), keys...), args...))
			continue
		}
		for i, r := range t.rules {
			cmds = append(cmds, pipe.EvalSha(ctx, t.sha, []string{keys[i]}, r.WindowMillis(), r.Limit))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("bench: redis: %w", err)
	}
	for i := range items {
		out[i] = Result{Admitted: true}
		for k := range per {
			v, err := cmds[i*per+k].Slice()
			if err != nil || len(v) < 2 {
				out[i] = Result{Err: fmt.Errorf("bench: redis reply %v: %v", v, err)}
				break
			}
			a, _ := v[0].(int64)
			at, _ := v[1].(int64)
			out[i].At = at
			if t.mode == RedisMerged {
				out[i].Admitted = a == 1
			} else if a >= int64(t.rules[k].Limit) {
				out[i].Admitted = false
			}
		}
	}
	return nil
}

func (t *RedisTarget) usedMemory(ctx context.Context) (int64, error) {
	info, err := t.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("bench: redis INFO has no used_memory")
}

// Memory implements Target: used_memory above what it was when the target
// connected, and the number of distinct recipients with a key (counted by
// SCAN of the recipient-scope keys of the first recipient rule).
func (t *RedisTarget) Memory(ctx context.Context) (int64, int64, error) {
	used, err := t.usedMemory(ctx)
	if err != nil {
		return 0, 0, err
	}
	var first string
	for _, r := range t.rules {
		if r.Scope == window.ScopeRecipient {
			first = r.Name
			break
		}
	}
	var n int64
	iter := t.rdb.Scan(ctx, 0, t.prefix()+"{*}:"+first, 10_000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return used - t.base, n, iter.Err()
}

// Close implements Target.
func (t *RedisTarget) Close() error { return t.rdb.Close() }

// LocalRedis is a redis-server the bench started on 127.0.0.1.
type LocalRedis struct {
	Addr string
	cmd  *exec.Cmd
	dir  string
}

// StartRedis starts Debian's redis-server on 127.0.0.1 with no persistence
// and waits until it answers.
func StartRedis(ctx context.Context) (*LocalRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("bench: redis-server not found (apt-get install redis-server): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "freqring-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
		"--dir", dir, "--protected-mode", "yes")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	r := &LocalRedis{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd, dir: dir}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rdb.Ping(ctx).Err(); err == nil {
			return r, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.Stop()
			return nil, fmt.Errorf("bench: redis-server on %s did not answer in 10 s", r.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server and removes its directory.
func (r *LocalRedis) Stop() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
	os.RemoveAll(r.dir)
}
