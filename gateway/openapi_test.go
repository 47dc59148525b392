package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/gateway"
)

// checkFunc is a Checker that answers with a function.
type checkFunc func(*pb.CheckRequest) (*pb.CheckResponse, error)

func (f checkFunc) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return f(req)
}

// answer is a CheckResponse for req: every item admitted, or denied by rule
// 0 when deny is set, or failed with code when it is not OK.
func answer(req *pb.CheckRequest, deny bool, code codes.Code) *pb.CheckResponse {
	resp := &pb.CheckResponse{Domains: map[string]*pb.Domain{"default": {Name: "default", Rules: []*pb.Rule{{Name: "r", Limit: 2, Window: "1m0s", WindowMs: 60_000}}}}}
	for i := range req.Recipients {
		resp.Admitted = append(resp.Admitted, !deny && code == codes.OK)
		resp.Recorded = append(resp.Recorded, !deny && code == codes.OK)
		resp.DeniedBy = append(resp.DeniedBy, map[bool]int32{true: 0, false: -1}[deny])
		resp.RetryAfterMs = append(resp.RetryAfterMs, map[bool]int64{true: 1500, false: 0}[deny])
		resp.DecidedAtMs = append(resp.DecidedAtMs, t0)
		if code != codes.OK {
			resp.RuleCounts = append(resp.RuleCounts, 0)
			resp.Errors = append(resp.Errors, &pb.ItemError{Index: uint32(i), Code: uint32(code), Message: "recipients[" + strconv.Itoa(i) + "]: failed"})
			continue
		}
		resp.RuleCounts = append(resp.RuleCounts, 1)
		resp.Used = append(resp.Used, 2)
		resp.Remaining = append(resp.Remaining, 0)
		resp.RuleRetryAfterMs = append(resp.RuleRetryAfterMs, resp.RetryAfterMs[i])
	}
	return resp
}

// openAPI is the part of gateway/openapi.yaml this test reads.
type openAPI struct {
	Paths      map[string]map[string]operation `yaml:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any `yaml:"properties"`
		} `yaml:"schemas"`
	} `yaml:"components"`
}

// readOpenAPI reads openapi.yaml and returns it with its operation of
// method on path, failing the test if it has none.
func readOpenAPI(t *testing.T, path, method string) (openAPI, operation) {
	t.Helper()
	raw, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPI
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	op, ok := doc.Paths[path][method]
	if !ok {
		t.Fatalf("openapi.yaml has no %s of %s", method, path)
	}
	return doc, op
}

// operation is one method of a path of openapi.yaml.
type operation struct {
	RequestBody struct {
		Content map[string]struct {
			Examples map[string]struct {
				Value any `yaml:"value"`
			} `yaml:"examples"`
		} `yaml:"content"`
	} `yaml:"requestBody"`
	Responses map[string]struct {
		Headers map[string]any `yaml:"headers"`
		Content map[string]any `yaml:"content"`
	} `yaml:"responses"`
}

// checkDocumented checks that op documents the status rec answered
// scenario name with, its content type and every header sent with it,
// and notes the status in sent.
func checkDocumented(t *testing.T, name string, op operation, rec *httptest.ResponseRecorder, sent map[string]bool) {
	t.Helper()
	code := strconv.Itoa(rec.Code)
	sent[code] = true
	resp, ok := op.Responses[code]
	if !ok {
		t.Errorf("%s: status %s is not in openapi.yaml", name, code)
		return
	}
	if ct := rec.Header().Get("Content-Type"); resp.Content[ct] == nil {
		t.Errorf("%s: status %s with Content-Type %s, documented %v", name, code, ct, slices.Sorted(maps.Keys(resp.Content)))
	}
	documented := map[string]bool{} // header names are case-insensitive
	for h := range resp.Headers {
		documented[http.CanonicalHeaderKey(h)] = true
	}
	for h := range rec.Header() {
		if !documented[h] && h != "Content-Type" && h != "Content-Length" {
			t.Errorf("%s: status %s sends header %s, not documented", name, code, h)
		}
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Errorf("%s: body is not JSON: %s", name, rec.Body)
	}
}

// TestOpenAPIMatchesHandler drives the handler into every status it can
// send (with a Checker answering each outcome) and checks that
// openapi.yaml documents that status, its content type and every header
// sent with it; that it documents no status the handler never sends; that
// every example request decodes; and that the Item schema's properties are
// the fields the decoder accepts.
func TestOpenAPIMatchesHandler(t *testing.T) {
	doc, op := readOpenAPI(t, gateway.CheckPath, "post")

	type scenario struct {
		name, method, path, ct, body string
		check                        checkFunc
		serving                      bool
	}
	ok200 := checkFunc(func(r *pb.CheckRequest) (*pb.CheckResponse, error) { return answer(r, false, codes.OK), nil })
	itemFails := func(c codes.Code) checkFunc {
		return func(r *pb.CheckRequest) (*pb.CheckResponse, error) { return answer(r, false, c), nil }
	}
	callFails := func(c codes.Code) checkFunc {
		return func(*pb.CheckRequest) (*pb.CheckResponse, error) { return nil, status.Error(c, "failed") }
	}
	const one = `{"recipient":"a"}`
	scenarios := []scenario{
		{"admitted", "POST", gateway.CheckPath, "application/json", one, ok200, true},
		{"batch", "POST", gateway.CheckPath, "application/json", `{"items":[{"recipient":"a"},{"recipient":"b"}]}`, ok200, true},
		{"batch with a failed item", "POST", gateway.CheckPath, "application/json", `{"items":[{"recipient":"a"}]}`, itemFails(codes.NotFound), true},
		{"denied", "POST", gateway.CheckPath, "application/json", one, func(r *pb.CheckRequest) (*pb.CheckResponse, error) { return answer(r, true, codes.OK), nil }, true},
		{"bad input", "POST", gateway.CheckPath, "application/json", `{"cost":0}`, ok200, true},
		{"invalid item", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.InvalidArgument), true},
		{"invalid call", "POST", gateway.CheckPath, "application/json", one, callFails(codes.InvalidArgument), true},
		{"refund not found", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.NotFound), true},
		{"id conflict", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.AlreadyExists), true},
		{"unavailable item", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.Unavailable), true},
		{"out of memory", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.ResourceExhausted), true},
		{"unavailable call", "POST", gateway.CheckPath, "application/json", one, callFails(codes.Unavailable), true},
		{"not serving", "POST", gateway.CheckPath, "application/json", one, ok200, false},
		{"internal", "POST", gateway.CheckPath, "application/json", one, callFails(codes.Internal), true},
		{"internal item", "POST", gateway.CheckPath, "application/json", one, itemFails(codes.DataLoss), true},
		{"body timeout", "POST", gateway.CheckPath, "application/json", one, ok200, true}, // its body times out, below
		{"too large", "POST", gateway.CheckPath, "application/json", `{"recipient":"` + strings.Repeat("a", gateway.DefaultMaxBodyBytes) + `"}`, ok200, true},
		{"media type", "POST", gateway.CheckPath, "text/plain", one, ok200, true},
		{"method", "GET", gateway.CheckPath, "", "", ok200, true},
		{"path", "POST", "/v1/nope", "application/json", one, ok200, true},
	}
	sent := map[string]bool{}
	for _, sc := range scenarios {
		serving := sc.serving
		h, err := gateway.New(gateway.Config{Checker: sc.check, Serving: func() bool { return serving }, LegacyHeaders: true})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(sc.method, sc.path, strings.NewReader(sc.body))
		if sc.name == "body timeout" {
			req.Body = io.NopCloser(io.MultiReader(strings.NewReader(sc.body[:5]), iotest.ErrReader(os.ErrDeadlineExceeded)))
		}
		if sc.ct != "" {
			req.Header.Set("Content-Type", sc.ct)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkDocumented(t, sc.name, op, rec, sent)
	}
	for code := range op.Responses {
		if !sent[code] {
			t.Errorf("openapi.yaml documents status %s, which no scenario of the handler sends", code)
		}
	}

	examples := op.RequestBody.Content["application/json"].Examples
	if len(examples) == 0 {
		t.Fatal("openapi.yaml has no example requests")
	}
	for name, ex := range examples {
		body, err := json.Marshal(ex.Value)
		if err != nil {
			t.Fatalf("example %s: %v", name, err)
		}
		if _, _, _, err := gateway.DecodeCheck(body); err != nil {
			t.Errorf("example %s (%s): %v", name, body, err)
		}
	}

	props := slices.Sorted(maps.Keys(doc.Components.Schemas["Item"].Properties))
	if want := []string{"content", "cost", "domain", "mode", "recipient", "request_id"}; !slices.Equal(props, want) {
		t.Errorf("Item properties %v, want %v", props, want)
	}
	for _, p := range props { // each documented property is one the decoder knows
		if _, _, _, err := gateway.DecodeCheck([]byte(`{"recipient":"a","` + p + `":null}`)); err != nil && strings.Contains(err.Error(), "unknown field") {
			t.Errorf("Item property %s: %v", p, err)
		}
	}
}

// explainFunc is an Explainer that answers with a function.
type explainFunc func(*pb.ExplainRequest) (*pb.ExplainResponse, error)

func (f explainFunc) Explain(_ context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	return f(req)
}

// TestOpenAPIExplainMatchesHandler does for GET /v1/explain what
// TestOpenAPIMatchesHandler does for POST /v1/check: every status the
// handler sends is documented with its content type and headers, and
// every documented status is sent.
func TestOpenAPIExplainMatchesHandler(t *testing.T) {
	_, op := readOpenAPI(t, gateway.ExplainPath, "get")
	ok200 := explainFunc(func(r *pb.ExplainRequest) (*pb.ExplainResponse, error) {
		return &pb.ExplainResponse{Recipient: r.Recipient, Domain: "default", NowMs: t0, Admitted: true, NextAdmittedMs: t0,
			Rules: []*pb.ExplainRule{{Name: "r", Scope: "recipient", Algorithm: "sliding-log", Limit: 2, WindowMs: 60_000, Judged: true, Used: 1, Remaining: 1,
				Sends: []*pb.ExplainSend{{AtMs: t0 - 5}}}}}, nil
	})
	fails := func(c codes.Code) explainFunc {
		return func(*pb.ExplainRequest) (*pb.ExplainResponse, error) { return nil, status.Error(c, "failed") }
	}
	sent := map[string]bool{}
	for _, sc := range []struct {
		name, method, query string
		ex                  explainFunc
		serving             bool
	}{
		{"explained", "GET", "recipient=a", ok200, true},
		{"bad query", "GET", "recipient=a&cost=x", ok200, true},
		{"invalid", "GET", "recipient=a", fails(codes.InvalidArgument), true},
		{"method", "POST", "recipient=a", ok200, true},
		{"internal", "GET", "recipient=a", fails(codes.Internal), true},
		{"moving", "GET", "recipient=a", fails(codes.Unavailable), true},
		{"not serving", "GET", "recipient=a", ok200, false},
	} {
		serving := sc.serving
		h, err := gateway.New(gateway.Config{Checker: checkFunc(nil), Explainer: sc.ex, Serving: func() bool { return serving }})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(sc.method, gateway.ExplainPath+"?"+sc.query, nil))
		checkDocumented(t, sc.name, op, rec, sent)
	}
	for code := range op.Responses {
		if !sent[code] {
			t.Errorf("openapi.yaml documents status %s, which no scenario of the handler sends", code)
		}
	}
}
