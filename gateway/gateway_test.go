package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/gateway"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

const testRules = `domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 3, window: 1m}
      - {name: recipient-24h, scope: recipient, limit: 50, window: 24h}
      - {name: content-59s, scope: recipient+content, limit: 5, window: 59s}
  - name: fast
    rules:
      - {name: r-2-1500ms, scope: recipient, limit: 2, window: 1500ms}
`

// t0 is the test clock's start, unix ms.
const t0 = 1_790_000_000_000

// testClock is a settable clock, unix ns.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() int64              { return c.ns.Load() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fixture is a real node behind an httptest server.
type fixture struct {
	t   testing.TB
	n   *node.Node
	clk *testClock
	srv *httptest.Server
}

func newFixture(t testing.TB, legacy bool) *fixture {
	t.Helper()
	return newFixtureRules(t, testRules, legacy)
}

// newFixtureRules is newFixture on other rules.
func newFixtureRules(t testing.TB, rulesYAML string, legacy bool) *fixture {
	t.Helper()
	rs, err := rules.Parse("test", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	clk := &testClock{}
	clk.ns.Store(t0 * 1e6)
	n, err := node.New(node.Config{Rules: rs, Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := gateway.New(gateway.Config{Checker: n, Serving: n.Serving, LegacyHeaders: legacy})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{t: t, n: n, clk: clk, srv: srv}
}

// post sends body to /v1/check with content type ct; it returns the
// response with its body read into b.
func (f *fixture) post(ct, body string) (*http.Response, []byte) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+gateway.CheckPath, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp, b
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

func wantHeaders(t testing.TB, resp *http.Response, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
}

// TestCheckAdmitsThenDenies: three sends of distinct content are admitted
// with the binding rule's headers counting down; the fourth, exactly at the
// limit of recipient-1m, is a 429 with Retry-After the rest of the minute,
// rounded up, the draft and legacy headers, and the decision in a
// problem+json body.
func TestCheckAdmitsThenDenies(t *testing.T) {
	f := newFixture(t, true)
	for i := range 3 {
		resp, b := f.post("application/json", `{"recipient":"+100","content":"m`+string(rune('a'+i))+`"}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("send %d: %d %s", i, resp.StatusCode, b)
		}
		d := decode[gateway.Decision](t, b)
		if !d.Admitted || !d.Recorded || d.Recipient != "+100" || len(d.Rules) != 3 || d.Rules[0].Used != uint32(i+1) || !d.DecidedAt.Equal(time.UnixMilli(t0+int64(i)*10_300)) {
			t.Fatalf("send %d: %+v", i, d)
		}
		wantHeaders(t, resp, map[string]string{
			"Content-Type":     "application/json",
			"RateLimit-Policy": `"recipient-1m";q=3;w=60`,
			"RateLimit":        `"recipient-1m";r=` + string(rune('0'+2-i)) + ";t=0",
			"Retry-After":      "",
		})
		f.clk.advance(10*time.Second + 300*time.Millisecond)
	}
	// 30.9 s after the first send: it leaves the window 29.1 s from now.
	resp, b := f.post("application/json", `{"recipient":"+100","content":"md"}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fourth send: %d %s", resp.StatusCode, b)
	}
	p := decode[gateway.Problem](t, b)
	if p.Status != 429 || p.Type != gateway.TypeRateLimited || p.Decision == nil || p.Admitted || p.Recorded ||
		p.DeniedBy != "recipient-1m" || p.RetryAfterMs != 29_100 || p.Rules[0].Remaining != 0 || p.Rules[0].Used != 3 {
		t.Fatalf("429 body: %s", b)
	}
	wantHeaders(t, resp, map[string]string{
		"Content-Type":          "application/problem+json",
		"Retry-After":           "30",
		"RateLimit-Policy":      `"recipient-1m";q=3;w=60`,
		"RateLimit":             `"recipient-1m";r=0;t=30`,
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "30",
	})
	// Retry-After is exact: 1 ms before it the item is still denied, at it admitted.
	f.clk.advance(29_100*time.Millisecond - time.Millisecond)
	if resp, b := f.post("application/json", `{"recipient":"+100","content":"md","mode":"peek"}`); resp.StatusCode != 429 {
		t.Fatalf("1 ms before Retry-After: %d %s", resp.StatusCode, b)
	}
	f.clk.advance(time.Millisecond)
	if resp, b := f.post("application/json", `{"recipient":"+100","content":"md"}`); resp.StatusCode != 200 {
		t.Fatalf("at Retry-After: %d %s", resp.StatusCode, b)
	}
}

// TestBindingRuleNeedsContent: on the default rules, an item without
// content is bound by a recipient rule, not by a content rule of smaller
// limit that does not apply to it; with content, the content rule binds.
func TestBindingRuleNeedsContent(t *testing.T) {
	f := newFixtureRules(t, string(rules.DefaultYAML()), false)
	if resp, b := f.post("application/json", `{"recipient":"a"}`); resp.Header.Get("RateLimit") != `"recipient-1m";r=14;t=0` {
		t.Fatalf("without content: %v %s", resp.Header, b)
	}
	if resp, b := f.post("application/json", `{"recipient":"a","content":"x"}`); resp.Header.Get("RateLimit") != `"content-59s";r=1;t=0` {
		t.Fatalf("with content: %v %s", resp.Header, b)
	}
}

// TestCheckWithoutLegacyHeaders: X-RateLimit-* only behind the option.
func TestCheckWithoutLegacyHeaders(t *testing.T) {
	f := newFixture(t, false)
	resp, b := f.post("application/json", `{"recipient":"a"}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Limit") != "" || resp.Header.Get("RateLimit") == "" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
}

// TestCheckModes: peek changes nothing, record records without checking
// (past the limit), cost counts, a retry with the same request id is not
// recorded twice, and a refund frees its send.
func TestCheckModes(t *testing.T) {
	f := newFixture(t, false)
	used := func() uint32 {
		resp, b := f.post("application/json", `{"recipient":"r","domain":"fast","mode":"peek"}`)
		d := decode[gateway.Problem](t, b)
		if d.Decision == nil || d.Recorded {
			t.Fatalf("peek: %d %s", resp.StatusCode, b)
		}
		return d.Rules[0].Used
	}
	for range 3 {
		if used() != 0 {
			t.Fatal("peek recorded")
		}
	}
	for i := range 3 {
		resp, b := f.post("application/json", `{"recipient":"r","domain":"fast","mode":"record"}`)
		if resp.StatusCode != 200 || !decode[gateway.Decision](t, b).Recorded {
			t.Fatalf("record %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := used(); got != 2 {
		t.Fatalf("used %d after 3 records past a limit of 2, want 2 (the log holds limit sends)", got)
	}
	if resp, b := f.post("application/json", `{"recipient":"r","domain":"fast"}`); resp.StatusCode != 429 {
		t.Fatalf("check after records past the limit: %d %s; want 429", resp.StatusCode, b)
	}
	f.clk.advance(1500 * time.Millisecond)
	const sent = `{"recipient":"s","domain":"fast","cost":2,"request_id":"18446744073709551615"}`
	for i := range 2 { // the retry is answered with the first decision
		resp, b := f.post("application/json", sent)
		d := decode[gateway.Decision](t, b)
		if resp.StatusCode != 200 || d.Rules[0].Used != 2 || d.Duplicate != (i == 1) {
			t.Fatalf("send %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if resp, b := f.post("application/json", `{"recipient":"s","domain":"fast","cost":1,"request_id":"18446744073709551615"}`); resp.StatusCode != 409 || !strings.Contains(string(b), `"detail":"request_id:`) {
		t.Fatalf("same id, other cost: %d %s; want 409 naming request_id", resp.StatusCode, b)
	}
	if resp, b := f.post("application/json", `{"recipient":"s","domain":"fast","cost":2,"mode":"refund","request_id":"7"}`); resp.StatusCode != 404 {
		t.Fatalf("refund of an unknown id: %d %s; want 404", resp.StatusCode, b)
	}
	// A refund of a cost-1 send frees it. (s's cost-2 send fills the limit-2
	// log whole, so its refund frees nothing: a full log cannot tell whether
	// it dropped older sends, and window.Remove keeps it full; see
	// removeFull.)
	f.post("application/json", `{"recipient":"t","domain":"fast","request_id":"9"}`)
	resp, b := f.post("application/json", `{"recipient":"t","domain":"fast","mode":"refund","request_id":"9"}`)
	if d := decode[gateway.Decision](t, b); resp.StatusCode != 200 || !d.Refund || !d.Refunded || d.Rules[0].Used != 0 {
		t.Fatalf("refund: %d %s", resp.StatusCode, b)
	}
}

// TestCheckBatch: a batch is answered 200 with one result per item, a
// denial and an item error among them.
func TestCheckBatch(t *testing.T) {
	f := newFixture(t, false)
	resp, b := f.post("application/json; charset=utf-8", `{"items":[
		{"recipient":"x","domain":"fast","cost":2},
		{"recipient":"x","domain":"fast"},
		{"recipient":"y","domain":"nope"},
		{"recipient":"y"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
	}
	out := decode[gateway.BatchResponse](t, b)
	r := out.Results
	if len(r) != 4 || r[0].Decision == nil || !r[0].Admitted || r[1].Decision == nil || r[1].Admitted || r[1].DeniedBy != "r-2-1500ms" ||
		r[1].RetryAfterMs != 1500 || r[2].Error == nil || r[2].Error.Status != 400 || !strings.HasPrefix(r[2].Error.Detail, `items[2].domain: unknown domain "nope"`) ||
		r[3].Decision == nil || !r[3].Admitted || r[3].Rules[0].Name != "recipient-1m" {
		t.Fatalf("batch: %s", b)
	}
}

// TestCheckBadRequests: each kind of bad input gets its status and a
// problem+json detail naming the field and the value, and records nothing.
func TestCheckBadRequests(t *testing.T) {
	f := newFixture(t, false)
	big := `{"recipient":"b","content":"` + strings.Repeat("x", gateway.DefaultMaxBodyBytes) + `"}`
	for _, tc := range []struct {
		name, ct, body string
		code           int
		detail         string
	}{
		{"bad JSON", "application/json", `{"recipient":`, 400, "body: truncated JSON"},
		{"syntax", "application/json", `{"recipient" "b"}`, 400, "body: invalid JSON at byte 14"},
		{"wrong content type", "text/plain", `{"recipient":"b"}`, 415, `Content-Type "text/plain": want application/json`},
		{"no content type", "", `{"recipient":"b"}`, 415, `Content-Type "": want application/json`},
		{"unknown domain", "application/json", `{"recipient":"b","domain":"sms"}`, 400, `domain: unknown domain "sms"`},
		{"oversized body", "application/json", big, 413, "body: more than 1048576 bytes"},
		{"unknown field", "application/json", `{"recipient":"b","costs":2}`, 400, "costs: unknown field"},
		{"cost zero", "application/json", `{"items":[{"recipient":"a"},{"recipient":"a"},{"recipient":"b","cost":0}]}`, 400, "items[2].cost: 0 out of range [1, 1000]"},
		{"cost fraction", "application/json", `{"recipient":"b","cost":1.5}`, 400, "cost: 1.5 is not an integer"},
		{"cost string", "application/json", `{"recipient":"b","cost":"x"}`, 400, "cost: a JSON string, want a number"},
		{"mode", "application/json", `{"recipient":"b","mode":"allow"}`, 400, `mode: "allow" is not one of check, peek, record, refund`},
		{"request id number", "application/json", `{"recipient":"b","request_id":12}`, 400, "request_id: a JSON number, want a decimal string"},
		{"request id", "application/json", `{"recipient":"b","request_id":"-1"}`, 400, `request_id: "-1" is not a decimal integer`},
		{"no recipient", "application/json", `{"domain":"fast"}`, 400, "recipient: missing or empty"},
		{"long recipient", "application/json", `{"recipient":"` + strings.Repeat("r", 300) + `"}`, 400, "recipient: 300 bytes, more than 256"},
		{"empty batch", "application/json", `{"items":[]}`, 400, "items: empty"},
		{"mixed", "application/json", `{"items":[{"recipient":"a"}],"recipient":"b"}`, 400, "recipient: beside items"},
		{"trailing", "application/json", `{"recipient":"b"} {}`, 400, "body: trailing data"},
		{"array", "application/json", `[1]`, 400, "body: a JSON array, want an object"},
		{"refund without id", "application/json", `{"recipient":"b","mode":"refund"}`, 400, "request_id"},
	} {
		resp, b := f.post(tc.ct, tc.body)
		p := decode[gateway.Problem](t, b)
		if resp.StatusCode != tc.code || p.Status != tc.code || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.HasPrefix(p.Detail, tc.detail) || p.Title != http.StatusText(tc.code) || p.Type == "" {
			t.Errorf("%s: %d %s; want %d with detail %q...", tc.name, resp.StatusCode, b, tc.code, tc.detail)
		}
	}
	resp, b := f.post("application/json", `{"recipient":"b","mode":"peek"}`)
	if d := decode[gateway.Decision](t, b); resp.StatusCode != 200 || d.Rules[0].Used != 0 {
		t.Fatalf("after bad requests: %s; want nothing recorded for b", b)
	}
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+gateway.CheckPath, nil)
	if resp, err := f.srv.Client().Do(req); err != nil || resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %v %v", resp, err)
	}
}

// TestCheckNotServing: 503 with Retry-After once the node stops serving.
func TestCheckNotServing(t *testing.T) {
	f := newFixture(t, false)
	f.n.Close()
	resp, b := f.post("application/json", `{"recipient":"a"}`)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || decode[gateway.Problem](t, b).Type != gateway.TypeUnavailable {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// TestCheckInvalidUTF8FailsItsItem: a recipient, domain or content that is
// not valid UTF-8 (a raw byte, or a lone surrogate escape) fails its item
// alone with a 400 naming the field and index, never merging into U+FFFD;
// the other items are decided, and a node's error for an item after a
// failed one names that item's index in the body. A single such item is a
// 400.
func TestCheckInvalidUTF8FailsItsItem(t *testing.T) {
	f := newFixture(t, false)
	resp, b := f.post("application/json", "{\"items\":["+
		`{"recipient":"a"},`+
		"{\"recipient\":\"x\xff\"},"+
		`{"recipient":"x\ud800"},`+
		`{"recipient":"x\udc00"},`+
		"{\"recipient\":\"c\",\"domain\":\"fast\xc3\"},"+
		"{\"recipient\":\"c\",\"content\":\"hi\xfe\"},"+
		`{"recipient":"b"},`+
		`{"recipient":"c","domain":"nope"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	r := decode[gateway.BatchResponse](t, b).Results
	if len(r) != 8 {
		t.Fatalf("%d results: %s", len(r), b)
	}
	for i, want := range map[int]string{
		1: `items[1].recipient: "x\xff" is not valid UTF-8 (byte 0xff at offset 1)`,
		2: `items[2].recipient: "x\xed\xa0\x80" is not valid UTF-8 (lone surrogate \ud800 at offset 1)`,
		3: `items[3].recipient: "x\xed\xb0\x80" is not valid UTF-8 (lone surrogate \udc00 at offset 1)`,
		4: `items[4].domain: "fast\xc3" is not valid UTF-8 (byte 0xc3 at offset 4)`,
		5: `items[5].content: "hi\xfe" is not valid UTF-8 (byte 0xfe at offset 2)`,
		7: `items[7].domain: unknown domain "nope"`,
	} {
		if r[i].Decision != nil || r[i].Error == nil || r[i].Error.Status != 400 || r[i].Error.Type != gateway.TypeInvalid || !strings.HasPrefix(r[i].Error.Detail, want) {
			t.Errorf("result %d: %+v, want a 400 with detail %s...", i, r[i].Error, want)
		}
	}
	for _, i := range []int{0, 6} {
		if r[i].Error != nil || r[i].Decision == nil || !r[i].Admitted || r[i].Recipient != []string{0: "a", 6: "b"}[i] {
			t.Errorf("result %d: %s", i, b)
		}
	}
	// Nothing was recorded for the failed items: "x" and U+FFFD stay unused.
	for _, rcp := range []string{"x", "x\ufffd", "c"} {
		resp, b := f.post("application/json", `{"recipient":"`+rcp+`","mode":"peek"}`)
		if d := decode[gateway.Decision](t, b); resp.StatusCode != 200 || d.Rules[0].Used != 0 {
			t.Errorf("peek %q: %d %s; want nothing recorded", rcp, resp.StatusCode, b)
		}
	}
	resp, b = f.post("application/json", "{\"recipient\":\"x\xff\"}")
	if p := decode[gateway.Problem](t, b); resp.StatusCode != 400 || p.Detail != `recipient: "x\xff" is not valid UTF-8 (byte 0xff at offset 1)` {
		t.Errorf("single item: %d %s", resp.StatusCode, b)
	}
	// A batch whose every item fails alone is still answered per item.
	resp, b = f.post("application/json", `{"items":[{"recipient":"\ud800"}]}`)
	if r := decode[gateway.BatchResponse](t, b).Results; resp.StatusCode != 200 || len(r) != 1 || r[0].Error == nil || r[0].Error.Status != 400 {
		t.Errorf("all failed: %d %s", resp.StatusCode, b)
	}
}

// TestCheckCostIsANumber: a cost given as a JSON string, even one that
// reads as a number, is a 400 naming the field; nothing is recorded.
func TestCheckCostIsANumber(t *testing.T) {
	f := newFixture(t, false)
	for _, tc := range []struct{ body, detail string }{
		{`{"recipient":"b","cost":"5"}`, "cost: a JSON string, want a number"},
		{`{"items":[{"recipient":"b"},{"recipient":"b","cost":"2"}]}`, "items[1].cost: a JSON string, want a number"},
		{`{"recipient":"b","cost":true}`, "cost: a JSON bool, want a number"},
		{`{"recipient":"b","cost":99999999999999999999}`, "cost: 99999999999999999999 out of range [1, 1000]"},
	} {
		resp, b := f.post("application/json", tc.body)
		if p := decode[gateway.Problem](t, b); resp.StatusCode != 400 || p.Detail != tc.detail {
			t.Errorf("%s: %d %s; want 400 with detail %q", tc.body, resp.StatusCode, b, tc.detail)
		}
	}
	resp, b := f.post("application/json", `{"recipient":"b","mode":"peek"}`)
	if d := decode[gateway.Decision](t, b); resp.StatusCode != 200 || d.Rules[0].Used != 0 {
		t.Fatalf("after: %s; want nothing recorded for b", b)
	}
}

// TestCheckDuplicateKeys: a key given twice in an object, or a field's
// name in another case (which encoding/json would take as the same key),
// is a 400 naming the key; nothing is recorded.
func TestCheckDuplicateKeys(t *testing.T) {
	f := newFixture(t, false)
	for _, tc := range []struct{ body, detail string }{
		{`{"recipient":"a","recipient":"b"}`, "recipient: duplicate key: each field may appear once"},
		{`{"recipient":null,"recipient":"b"}`, "recipient: duplicate key"},
		{`{"recipient":"b","cost":1,"cost":5}`, "cost: duplicate key"},
		{`{"recipient":"b","recipi\u0065nt":"c"}`, "recipient: duplicate key"},
		{`{"items":[{"recipient":"b"},{"recipient":"b","mode":"peek","mode":"check"}]}`, "items[1].mode: duplicate key"},
		{`{"items":[{"recipient":"b"}],"items":[{"recipient":"c"}]}`, "items: duplicate key"},
		{`{"recipient":"a","Recipient":"b"}`, `Recipient: unknown field (did you mean "recipient"? keys are case-sensitive)`},
	} {
		resp, b := f.post("application/json", tc.body)
		if p := decode[gateway.Problem](t, b); resp.StatusCode != 400 || !strings.HasPrefix(p.Detail, tc.detail) {
			t.Errorf("%s: %d %s; want 400 with detail %q...", tc.body, resp.StatusCode, b, tc.detail)
		}
	}
	for _, rcp := range []string{"a", "b", "c"} {
		resp, b := f.post("application/json", `{"recipient":"`+rcp+`","mode":"peek"}`)
		if d := decode[gateway.Decision](t, b); resp.StatusCode != 200 || d.Rules[0].Used != 0 {
			t.Errorf("peek %s: %s; want nothing recorded", rcp, b)
		}
	}
}

// TestCheckSlowBodyTimesOut: a client that sends the headers and part of
// the body, then stalls (as one trickling it would, past the timeout), is
// answered 408 once the body timeout passes and its connection closed;
// nothing is checked. The client waits for the answer, not for a time.
func TestCheckSlowBodyTimesOut(t *testing.T) {
	checked := make(chan struct{}, 1)
	h, err := gateway.New(gateway.Config{BodyTimeout: 200 * time.Millisecond, Checker: checkFunc(func(r *pb.CheckRequest) (*pb.CheckResponse, error) {
		checked <- struct{}{}
		return nil, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	pr, pw := io.Pipe()
	go pw.Write([]byte(`{"recipient":"+8613800000000","con`)) // and no more until the answer
	// A failsafe, far past the body timeout; it ends the body too, since the
	// client waits for the body's last read before it gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+gateway.CheckPath, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = 100
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	p := decode[gateway.Problem](t, b)
	if resp.StatusCode != http.StatusRequestTimeout || p.Type != gateway.TypeTimeout || !strings.HasPrefix(p.Detail, "body: not all received within 200ms, after ") || !resp.Close {
		t.Fatalf("%d close=%v %s; want 408 naming the timeout, and the connection closed", resp.StatusCode, resp.Close, b)
	}
	select {
	case <-checked:
		t.Fatal("a timed-out body was checked")
	default:
	}
	if _, err := gateway.New(gateway.Config{Checker: checkFunc(nil), BodyTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "Config.BodyTimeout -1s is negative") {
		t.Fatalf("negative BodyTimeout: %v", err)
	}
}
