package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// CheckPath is the check endpoint's path.
const CheckPath = "/v1/check"

// ExplainPath is the explain endpoint's path (explain.go).
const ExplainPath = "/v1/explain"

// DefaultMaxBodyBytes is the largest body accepted when
// Config.MaxBodyBytes is 0: 1 MiB.
const DefaultMaxBodyBytes = 1 << 20

// DefaultBodyTimeout is the time to read a body when Config.BodyTimeout
// is 0.
const DefaultBodyTimeout = 10 * time.Second

// Checker decides a batch of items; *node.Node satisfies it (and routes
// each item to its owner). It must be safe for concurrent use.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Config configures a Handler. A zero field takes the default named in its
// comment.
type Config struct {
	Checker Checker // required
	// Explainer answers GET /v1/explain; nil answers it 404.
	Explainer Explainer
	// Caller, if set, names who makes a request in the context the
	// Explainer gets, for its log of recipient lookups (node.WithCaller):
	// the client's address.
	Caller func(ctx context.Context, who string) context.Context
	// Serving reports whether the node serves; while it does not, every
	// request is answered 503. nil means always.
	Serving func() bool
	// LegacyHeaders adds X-RateLimit-Limit, -Remaining and -Reset (seconds
	// from now) beside the draft's RateLimit fields.
	LegacyHeaders bool
	// MaxBodyBytes bounds a request body, bytes; larger ones are answered
	// 413. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout bounds the time to read a request's body, from when the
	// handler starts (the server bounds the headers'): a body that is not
	// all there in time, such as one trickled a byte at a time, is answered
	// 408 and its connection closed, so that a slow client cannot hold a
	// connection and a goroutine open for as long as it likes. 0 means
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
}

// Handler serves POST /v1/check and GET /v1/explain. It is safe for
// concurrent use.
type Handler struct {
	cfg Config
}

// New returns a Handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Checker == nil {
		return nil, errors.New("gateway: Config.Checker is nil")
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("gateway: Config.MaxBodyBytes %d is negative", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout < 0 {
		return nil, fmt.Errorf("gateway: Config.BodyTimeout %v is negative", cfg.BodyTimeout)
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	return &Handler{cfg: cfg}, nil
}

// Problem is an RFC 9457 problem details body (application/problem+json).
// A 429 carries the decision beside the standard members.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	*Decision
}

// Decision is one item's answer, with the field names of "freqring check
// --json".
type Decision struct {
	Recipient      string       `json:"recipient"`
	Admitted       bool         `json:"admitted"`
	Recorded       bool         `json:"recorded"`
	Duplicate      bool         `json:"duplicate,omitempty"`
	Refund         bool         `json:"refund,omitempty"`
	Refunded       bool         `json:"refunded,omitempty"`
	DeniedBy       string       `json:"denied_by,omitempty"`
	ShadowDeniedBy string       `json:"shadow_denied_by,omitempty"`
	RetryAfterMs   int64        `json:"retry_after_ms"`
	DecidedAt      time.Time    `json:"decided_at"`
	Rules          []RuleResult `json:"rules,omitempty"`

	// hasContent: the item named a content, so its content rules apply.
	hasContent bool
}

// RuleResult is one rule's state after a decision.
type RuleResult struct {
	Name         string `json:"name"`
	Scope        string `json:"scope"` // recipient or recipient+content
	Limit        uint32 `json:"limit"`
	Window       string `json:"window"`
	Used         uint32 `json:"used"`
	Remaining    uint32 `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	Shadow       bool   `json:"shadow,omitempty"`
}

// ItemResult is one item of a batch's answer: a decision, or an error.
type ItemResult struct {
	*Decision
	Error *Problem `json:"error,omitempty"`
}

// BatchResponse answers a batch: one result per item, in request order.
type BatchResponse struct {
	Results []ItemResult `json:"results"`
}

// Problem types: a stable URI per kind of failure.
const (
	typeBase        = "https://github.com/freqring/freqring/blob/main/gateway/openapi.yaml#"
	TypeRateLimited = typeBase + "rate-limited"
	TypeInvalid     = typeBase + "invalid-request"
	TypeNotFound    = typeBase + "refund-not-found"
	TypeConflict    = typeBase + "request-id-conflict"
	TypeUnavailable = typeBase + "unavailable"
	TypeTooLarge    = typeBase + "body-too-large"
	TypeTimeout     = typeBase + "body-timeout"
	TypeMediaType   = typeBase + "unsupported-media-type"
	TypeMethod      = typeBase + "method-not-allowed"
	TypeNoRoute     = typeBase + "not-found"
	TypeInternal    = typeBase + "internal"
)

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == ExplainPath && h.cfg.Explainer != nil {
		h.serveExplain(w, r)
		return
	}
	if r.URL.Path != CheckPath {
		writeProblem(w, http.StatusNotFound, TypeNoRoute, fmt.Sprintf("path %q: the endpoints are POST %s and GET %s", r.URL.Path, CheckPath, ExplainPath))
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeProblem(w, http.StatusMethodNotAllowed, TypeMethod, fmt.Sprintf("method %s: %s takes POST", r.Method, CheckPath))
		return
	}
	if ct := r.Header.Get("Content-Type"); !isJSON(ct) {
		writeProblem(w, http.StatusUnsupportedMediaType, TypeMediaType, fmt.Sprintf("Content-Type %q: want application/json", ct))
		return
	}
	if h.cfg.Serving != nil && !h.cfg.Serving() {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, TypeUnavailable, "node is not serving: recovering, moving or shutting down; retry")
		return
	}
	// A ResponseWriter that cannot set deadlines (a ResponseRecorder) reads
	// without one.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(h.cfg.BodyTimeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if deadline && err == nil {
		// The server's background read, which watches for the client going
		// away while Check runs, must not time out and cancel the call.
		rc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeProblem(w, http.StatusRequestEntityTooLarge, TypeTooLarge, fmt.Sprintf("body: more than %d bytes", tooBig.Limit))
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			writeProblem(w, http.StatusRequestTimeout, TypeTimeout, fmt.Sprintf("body: not all received within %v, after %d bytes", h.cfg.BodyTimeout, len(body)))
			return
		}
		writeProblem(w, http.StatusBadRequest, TypeInvalid, fmt.Sprintf("body: %v", err))
		return
	}
	req, batch, failed, err := DecodeCheck(body)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, TypeInvalid, err.Error())
		return
	}
	idx := bodyIndexes(len(req.Recipients), failed)
	resp := &pb.CheckResponse{}
	if len(req.Recipients) > 0 { // else every item of the batch failed alone
		resp, err = h.cfg.Checker.Check(r.Context(), req)
		if err != nil {
			st := status.Convert(err)
			code, typ := httpStatus(st.Code())
			if code == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", "1")
			}
			writeProblem(w, code, typ, requestDetail(st, batch))
			return
		}
	}
	answers, err := wire.Read(resp, len(req.Recipients))
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, TypeInternal, fmt.Sprintf("the node's answer is malformed: %v", err))
		return
	}
	if batch {
		h.writeBatch(w, req, answers, failed, idx)
		return
	}
	h.writeSingle(w, req, answers)
}

// bodyIndexes maps the index of each of n items decided to its index in
// the body, which also held the failed items; nil when none failed.
func bodyIndexes(n int, failed []FailedItem) []int {
	if len(failed) == 0 {
		return nil
	}
	idx := make([]int, 0, n)
	f := 0
	for j := 0; len(idx) < n; j++ {
		if f < len(failed) && failed[f].Index == j {
			f++
			continue
		}
		idx = append(idx, j)
	}
	return idx
}

// isJSON reports whether a Content-Type is application/json.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// httpStatus maps a gRPC code of a failed item or request to an HTTP status
// and problem type.
func httpStatus(c codes.Code) (int, string) {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest, TypeInvalid
	case codes.NotFound:
		return http.StatusNotFound, TypeNotFound
	case codes.AlreadyExists:
		return http.StatusConflict, TypeConflict
	case codes.Unavailable, codes.ResourceExhausted, codes.FailedPrecondition, codes.Canceled, codes.DeadlineExceeded, codes.Aborted:
		return http.StatusServiceUnavailable, TypeUnavailable
	}
	return http.StatusInternalServerError, TypeInternal
}

// jsonField is this API's name of each request column (wire's names).
var jsonField = map[string]string{
	wire.Recipients: "recipient", wire.Domains: "domain", wire.Contents: "content", wire.ContentHashes: "content",
	wire.Costs: "cost", wire.Modes: "mode", wire.RequestIDs: "request_id",
}

// itemDetail is the problem detail of an item error: the node's message,
// its field named as this API names it ("items[2].cost: ..." in a batch,
// "cost: ..." for a single item) when the error names one. bodyIndex is
// the item's index in the body.
func itemDetail(e *pb.ItemError, batch bool, bodyIndex int) string {
	name, ok := jsonField[e.Field]
	if !ok {
		return e.Message
	}
	if batch {
		name = "items[" + strconv.Itoa(bodyIndex) + "]." + name
	}
	return name + ": " + wire.Detail(e)
}

// requestDetail is the problem detail of a call that failed whole: its
// message, with the column its details name (a malformed batch) named as
// this API names it.
func requestDetail(st *status.Status, batch bool) string {
	field, msg := wire.Violation(st)
	if field == "" {
		return st.Message()
	}
	name := jsonField[field]
	if field == wire.Recipients && batch {
		name = "items"
	}
	if name == "" {
		return st.Message()
	}
	return name + ": " + msg
}

// decision converts item i of the answers.
func decision(req *pb.CheckRequest, r *wire.Response, i int) *Decision {
	d := &Decision{
		Recipient:    req.Recipients[i],
		Admitted:     r.Admitted[i],
		Recorded:     r.Recorded[i],
		RetryAfterMs: r.RetryAfterMs[i],
		DecidedAt:    time.UnixMilli(r.DecidedAtMs[i]).UTC(),
		Refund:       req.Modes[i] == pb.Mode_MODE_REFUND,
		hasContent:   (i < len(req.Contents) && len(req.Contents[i]) > 0) || (i < len(req.ContentHashes) && req.ContentHashes[i] != 0),
		Duplicate:    r.Duplicate(i),
		Refunded:     r.Refunded(i),
	}
	domain := req.Domains[i]
	if domain == "" {
		domain = "default"
	}
	rules := r.Domains[domain].GetRules()
	used, remaining, retry := r.Rules(i)
	for k := 0; k < len(used) && k < len(rules); k++ {
		ru := rules[k]
		d.Rules = append(d.Rules, RuleResult{Name: ru.Name, Scope: ru.Scope, Limit: ru.Limit, Window: ru.Window, Used: used[k],
			Remaining: remaining[k], RetryAfterMs: retry[k], Shadow: ru.Shadow})
	}
	if k := r.DeniedBy[i]; k >= 0 && int(k) < len(rules) {
		d.DeniedBy = rules[k].Name
	}
	if k := r.ShadowDeniedBy(i); k >= 0 && int(k) < len(rules) {
		d.ShadowDeniedBy = rules[k].Name
	}
	return d
}

func (h *Handler) writeSingle(w http.ResponseWriter, req *pb.CheckRequest, r *wire.Response) {
	if e := r.Err(0); e != nil {
		code, typ := httpStatus(codes.Code(e.Code))
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeProblem(w, code, typ, itemDetail(e, false, 0))
		return
	}
	d := decision(req, r, 0)
	h.setRateLimitHeaders(w.Header(), d)
	if d.Admitted {
		writeJSON(w, http.StatusOK, "application/json", d)
		return
	}
	w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfterMs), 10))
	writeJSON(w, http.StatusTooManyRequests, "application/problem+json", &Problem{
		Type: TypeRateLimited, Title: http.StatusText(http.StatusTooManyRequests), Status: http.StatusTooManyRequests,
		Detail:   fmt.Sprintf("denied by rule %s: retry after %d ms", d.DeniedBy, d.RetryAfterMs),
		Decision: d,
	})
}

// writeBatch answers a batch: the items of req, decided in r, and the
// items that failed alone in decoding, each at its index in the body (idx,
// as from bodyIndexes).
func (h *Handler) writeBatch(w http.ResponseWriter, req *pb.CheckRequest, r *wire.Response, failed []FailedItem, idx []int) {
	out := BatchResponse{Results: make([]ItemResult, len(req.Recipients)+len(failed))}
	for _, f := range failed {
		out.Results[f.Index].Error = &Problem{Type: TypeInvalid, Title: http.StatusText(http.StatusBadRequest), Status: http.StatusBadRequest, Detail: f.Err.Error()}
	}
	for i := range req.Recipients {
		j := i
		if idx != nil {
			j = idx[i]
		}
		if e := r.Err(i); e != nil {
			code, typ := httpStatus(codes.Code(e.Code))
			out.Results[j].Error = &Problem{Type: typ, Title: http.StatusText(code), Status: code, Detail: itemDetail(e, true, j)}
			continue
		}
		out.Results[j].Decision = decision(req, r, i)
	}
	writeJSON(w, http.StatusOK, "application/json", &out)
}

// bindingRule is the rule that decided d: the denying rule, else the
// enforced rule with the least remaining (content rules only when the item
// named a content); nil if d has no such rule.
func bindingRule(d *Decision) *RuleResult {
	var best *RuleResult
	for k := range d.Rules {
		r := &d.Rules[k]
		if r.Shadow || (r.Scope == "recipient+content" && !d.hasContent) {
			continue
		}
		if d.DeniedBy != "" {
			if r.Name == d.DeniedBy {
				return r
			}
			continue
		}
		if best == nil || r.Remaining < best.Remaining {
			best = r
		}
	}
	return best
}

// setRateLimitHeaders sets the IETF httpapi draft's RateLimit-Policy and
// RateLimit fields (and, with LegacyHeaders, X-RateLimit-*) for d's binding
// rule.
func (h *Handler) setRateLimitHeaders(hd http.Header, d *Decision) {
	policy, state, ok := rateLimitFields(d)
	if !ok {
		return
	}
	hd.Set("RateLimit-Policy", policy)
	hd.Set("RateLimit", state)
	if h.cfg.LegacyHeaders {
		r := bindingRule(d)
		hd.Set("X-RateLimit-Limit", strconv.FormatUint(uint64(r.Limit), 10))
		hd.Set("X-RateLimit-Remaining", strconv.FormatUint(uint64(r.Remaining), 10))
		hd.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(r.RetryAfterMs), 10))
	}
}

// rateLimitFields are the values of the IETF httpapi draft's
// RateLimit-Policy and RateLimit fields for d's binding rule; ok is false
// when d has none.
func rateLimitFields(d *Decision) (policy, state string, ok bool) {
	r := bindingRule(d)
	if r == nil {
		return "", "", false
	}
	win, err := time.ParseDuration(r.Window)
	if err != nil {
		win = 0
	}
	name := sfString(r.Name)
	policy = fmt.Sprintf("%s;q=%d;w=%d", name, r.Limit, ceilSeconds(win.Milliseconds()))
	state = fmt.Sprintf("%s;r=%d;t=%d", name, r.Remaining, ceilSeconds(r.RetryAfterMs))
	return policy, state, true
}

// ceilSeconds is ms in whole seconds, rounded up; 0 for ms <= 0.
func ceilSeconds(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

// sfString is s as a structured-field string (RFC 8941): quoted, with \ and
// " escaped and bytes outside printable ASCII replaced by '?'.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func writeProblem(w http.ResponseWriter, code int, typ, detail string) {
	writeJSON(w, code, "application/problem+json", &Problem{Type: typ, Title: http.StatusText(code), Status: code, Detail: detail})
}

func writeJSON(w http.ResponseWriter, code int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, contentType = http.StatusInternalServerError, "application/problem+json"
		b = []byte(`{"type":"` + TypeInternal + `","title":"Internal Server Error","status":500,"detail":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}
