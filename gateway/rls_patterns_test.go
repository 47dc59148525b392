package gateway_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// seed004Rules is seed 004's open platform scaled down: per (app, ip) 3
// calls an hour, per (app, user, interface) 2 an hour, in fixed hourly
// windows, and a descriptor's key pattern (which named entries it holds)
// picks the rules.
const seed004Rules = `domains:
  - name: api-ip
    rules:
      - {name: app-ip-hour, algorithm: fixed-window, limit: 3, window: 1h}
  - name: api-user
    rules:
      - {name: app-user-interface-hour, algorithm: fixed-window, limit: 2, window: 1h}
envoy:
  - domain: openapi
    descriptors:
      - {domain: api-ip, key: [app, ip]}
      - {domain: api-user, key: [app, user, interface]}
`

// TestRLSKeyPatterns: rules per key pattern, seed 004's way. One call
// carries the two keys of an API call as two descriptors of named parts;
// each goes to the domain whose pattern it matches, keyed by its values
// joined by U+001F; a descriptor of another shape is not limited; and a
// call one key denies is not counted on the other (all or nothing).
func TestRLSKeyPatterns(t *testing.T) {
	f := newRLSFixture(t, seed004Rules)
	ip := desc("app=shop", "ip=10.0.0.1")
	user := func(u string) *rlsv3.RateLimitResponse {
		return f.ok("openapi", 0, ip, desc("app=shop", "user="+u, "interface=orders.list"))
	}
	const ipKey, aliceKey = "shop\x1f10.0.0.1", "shop\x1falice\x1forders.list"
	for i := range 2 {
		if resp := user("alice"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v, want OK", i+1, resp)
		}
	}
	if a, b := f.used("api-ip", ipKey), f.used("api-user", aliceKey); a != 2 || b != 2 {
		t.Fatalf("after two calls: (app, ip) used %d, (app, user, interface) used %d; want 2 and 2", a, b)
	}

	// Alice's third call this hour: her key denies it, so the (app, ip)
	// send is taken back.
	resp := user("alice")
	next := time.Duration(3_600_000-t0%3_600_000) * time.Millisecond // to the next aligned hour
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].CurrentLimit.GetName() != "app-user-interface-hour" || resp.Statuses[1].DurationUntilReset.AsDuration() != next {
		t.Fatalf("alice's third call: %v; want OVER_LIMIT by app-user-interface-hour, reset in %v", resp, next)
	}
	if a := f.used("api-ip", ipKey); a != 2 {
		t.Fatalf("(app, ip) used %d after a call the user key denied; want 2 (taken back)", a)
	}

	// Bob shares the app and ip: the (app, ip) key's third call is his.
	if resp := user("bob"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bob's call: %v, want OK", resp)
	}
	if resp := user("carol"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[0].CurrentLimit.GetName() != "app-ip-hour" || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("carol's call, (app, ip) at its limit: %v; want OVER_LIMIT by app-ip-hour", resp)
	}
	if c := f.used("api-user", "shop\x1fcarol\x1forders.list"); c != 0 {
		t.Fatalf("carol's key used %d after the ip key denied her call; want 0", c)
	}

	// A descriptor of no known pattern (an extra entry) is not limited.
	resp = f.ok("openapi", 0, desc("app=shop", "ip=10.0.0.1", "user=alice"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("a descriptor of another shape: %v; want OK, not limited", resp)
	}

	// The next hour starts every window afresh.
	f.clk.advance(next)
	if resp := user("alice"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the next hour: %v, want OK", resp)
	}
}
