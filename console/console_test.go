package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// fakeBackend answers from fixed data and records the overrides set.
type fakeBackend struct {
	mu    sync.Mutex
	set   []*pb.Override
	usage []Usage // successive answers of Usage; the last repeats
	calls int
}

const goodToken = "0123456789abcdef0123456789abcdef"

func (f *fakeBackend) Explain(_ context.Context, who string, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	if req.Recipient == "bad" {
		return nil, errors.New("recipient: bad")
	}
	now := int64(1_800_000_000_000)
	return &pb.ExplainResponse{Recipient: req.Recipient, Domain: "default", Node: "n1", NowMs: now, DeniedBy: "content-59s", NextAdmittedMs: now + 1500,
		Rules: []*pb.ExplainRule{
			{Name: "content-59s", Scope: "recipient+content", Algorithm: "sliding-log", Limit: 2, WindowMs: 59_000, Judged: true, Used: 2, RetryAfterMs: 1500,
				Sends: []*pb.ExplainSend{{AtMs: now - 57_500, ContentFingerprint: 7}, {AtMs: now - 1000, ContentFingerprint: 7}}},
			{Name: "burst", Scope: "recipient", Algorithm: "gcra", Limit: 10, WindowMs: 1000, Judged: true, Used: 1, Remaining: 9,
				State: []*pb.ExplainValue{{Name: "tat_unix_ms", Value: float64(now + 100)}, {Name: "burst", Value: 10}}},
		}}, nil
}
func (f *fakeBackend) Ring(context.Context) (*pb.RingResponse, error) {
	m := &pb.Member{Name: "n1", Addr: "127.0.0.1:1", State: "serving", Version: "v1"}
	return &pb.RingResponse{Node: "n1", Members: []*pb.Member{m}, Known: []*pb.Member{m, {Name: "n2", Addr: "127.0.0.1:2", State: "serving", Excluded: "serves other rules"}},
		Placement: &pb.Placement{PartitionCount: 271}}, nil
}
func (f *fakeBackend) Status(_ context.Context, m *pb.Member) (*pb.StatusResponse, error) {
	if m.Name == "n2" {
		return nil, errors.New("connection refused")
	}
	return &pb.StatusResponse{Node: m.Name, Serving: true, RulesHash: "00000000deadbeef", RulesSource: "rules.yaml", LastReloadMs: 1_800_000_000_000}, nil
}
func (f *fakeBackend) Rules(context.Context) (*pb.RulesResponse, error) {
	return &pb.RulesResponse{Domains: []*pb.Domain{{Name: "default", Rules: []*pb.Rule{{Name: "content-59s", Scope: "recipient+content", Limit: 2, Window: "59s"}}}}}, nil
}
func (f *fakeBackend) Overrides(context.Context) (*pb.OverrideListResponse, error) {
	return &pb.OverrideListResponse{Overrides: []*pb.Override{{Name: "vip", Domain: "default", Recipients: []string{"+1"}, Exempt: true, Source: "admin", Version: 1_800_000_000_000, SetBy: "console 127.0.0.1:9"}}}, nil
}
func (f *fakeBackend) Usage(context.Context, int) (Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u := f.usage[min(f.calls, len(f.usage)-1)]
	f.calls++
	return u, nil
}
func (f *fakeBackend) SetOverride(_ context.Context, who, token string, o *pb.Override) []MemberResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = append(f.set, o)
	return []MemberResult{{Member: "n1"}}
}
func (f *fakeBackend) DeleteOverride(context.Context, string, string, string) []MemberResult {
	return []MemberResult{{Member: "n1"}}
}
func (f *fakeBackend) AdminToken(tok string) bool { return tok == goodToken }

func newTestConsole(t *testing.T, b *fakeBackend) *httptest.Server {
	t.Helper()
	h, err := New(Config{Backend: b, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// TestPagesRender: every page answers 200 with its content, and nothing
// it references lives elsewhere.
func TestPagesRender(t *testing.T) {
	today := time.Now().UTC().Format(time.DateOnly)
	srv := newTestConsole(t, &fakeBackend{usage: []Usage{{Days: []UsageDay{{Date: today, Domain: "default", Admitted: 5, Denied: 2, DeniedBy: map[string]int64{"content-59s": 2}, Recipients: 4}}}}})
	for path, want := range map[string]string{
		"/":                `id="recipient"`,
		"/?recipient=%2B1": `admitted from <b id="next-admitted">2027-01-15 08:00:01.500Z</b>`,
		"/?recipient=bad":  "explain bad: recipient: bad",
		"/cluster":         "left out of the ring and owns no partitions: it serves other rules",
		"/rules":           "console 127.0.0.1:9",
		"/usage":           "<td>default</td><td>5</td><td>2</td>",
		"/live":            "/static/live.js",
		"/static/live.js":  "/live.json",
		"/?recipient=%2B2": "tat_unix_ms</th><td>2027-01-15 08:00:00.100Z",
	} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(raw)
		if !strings.Contains(body, want) {
			t.Errorf("%s: %d, want %q in:\n%s", path, resp.StatusCode, want, body)
		}
		for _, ext := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(body, `src="`+ext) || strings.Contains(body, `href="`+ext) {
				t.Errorf("%s references %s", path, ext)
			}
		}
	}
}

// TestOverrideFormAccess: a change needs the CSRF token of its cookie, a
// same-origin post (when the browser names one) and an admin token; only
// then does it reach the backend.
func TestOverrideFormAccess(t *testing.T) {
	b := &fakeBackend{usage: []Usage{{}}}
	srv := newTestConsole(t, b)
	resp, err := http.Get(srv.URL + "/?recipient=%2B1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var csrf string
	for _, c := range resp.Cookies() {
		if c.Name == csrfCookie {
			csrf = c.Value
		}
	}
	if csrf == "" {
		t.Fatal("no CSRF cookie")
	}
	post := func(form url.Values, cookie, origin string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/override", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: csrfCookie, Value: cookie})
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	form := func(csrf, token string) url.Values {
		return url.Values{"csrf": {csrf}, "token": {token}, "recipient": {"+1"}, "limits": {"content-59s=5"}}
	}
	for _, tc := range []struct {
		name           string
		form           url.Values
		cookie, origin string
		want           int
	}{
		{"no cookie", form(csrf, goodToken), "", "", http.StatusForbidden},
		{"field not the cookie's", form("00000000000000000000000000000000", goodToken), csrf, "", http.StatusForbidden},
		{"another site", form(csrf, goodToken), csrf, "https://evil.example", http.StatusForbidden},
		{"no token", form(csrf, ""), csrf, "", http.StatusUnauthorized},
		{"wrong token", form(csrf, "not-the-token-at-all-not-at-all"), csrf, "", http.StatusUnauthorized},
		{"bad limits", url.Values{"csrf": {csrf}, "token": {goodToken}, "recipient": {"+1"}, "limits": {"content-59s"}}, csrf, "", http.StatusBadRequest},
	} {
		if got := post(tc.form, tc.cookie, tc.origin); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if len(b.set) != 0 {
		t.Fatalf("refused forms reached the backend: %v", b.set)
	}
	if got := post(form(csrf, goodToken), csrf, srv.URL); got != http.StatusOK {
		t.Fatalf("a good form: %d", got)
	}
	if len(b.set) != 1 || b.set[0].Limits["content-59s"] != 5 || b.set[0].Recipients[0] != "+1" {
		t.Fatalf("set %v", b.set)
	}
}

// TestLiveRates: the sampler turns the counters of successive samples into
// per-second rates per domain and per rule, and a counter that goes back (a
// new day) gives 0, not a negative rate.
func TestLiveRates(t *testing.T) {
	day := func(admitted, denied, byRule int64) Usage {
		return Usage{Days: []UsageDay{{Date: "2027-01-15", Domain: "d", Admitted: admitted, Denied: denied, DeniedBy: map[string]int64{"r": byRule}}}}
	}
	b := &fakeBackend{usage: []Usage{day(10, 1, 1), day(30, 4, 3), day(5, 0, 0)}}
	now := time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)
	s := &sampler{b: b, now: func() time.Time { return now }, timeout: time.Second}
	for range 3 {
		s.take()
		now = now.Add(2 * time.Second)
	}
	d := s.rates()
	if len(d.Series) != 2 || d.StepMs != 1000 {
		t.Fatalf("%+v", d)
	}
	tot, rule := d.Series[0], d.Series[1]
	if tot.Domain != "d" || tot.Rule != "" || rule.Rule != "r" {
		t.Fatalf("series %+v", d.Series)
	}
	if want := []float64{10, 0}; !equal(tot.Admitted, want) {
		t.Errorf("admitted/s %v, want %v", tot.Admitted, want)
	}
	if want := []float64{1.5, 0}; !equal(tot.Denied, want) {
		t.Errorf("denied/s %v, want %v", tot.Denied, want)
	}
	if want := []float64{1, 0}; !equal(rule.Denied, want) {
		t.Errorf("rule r denied/s %v, want %v", rule.Denied, want)
	}
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
