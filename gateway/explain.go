package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
)

// Explainer explains a recipient (the Limiter service's Explain);
// *node.Node satisfies it, forwarding to the recipient's owner. It must be
// safe for concurrent use.
type Explainer interface {
	Explain(ctx context.Context, req *pb.ExplainRequest) (*pb.ExplainResponse, error)
}

// explainParams are GET /v1/explain's query parameters.
var explainParams = map[string]bool{"recipient": true, "domain": true, "content": true, "content_hash": true, "cost": true}

// serveExplain answers GET /v1/explain?recipient=R[&domain=D][&content=C |
// &content_hash=H][&cost=N] with the recipient's explanation
// (wire.Explanation), or a problem naming the parameter at fault.
func (h *Handler) serveExplain(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeProblem(w, http.StatusMethodNotAllowed, TypeMethod, fmt.Sprintf("method %s: %s takes GET", r.Method, ExplainPath))
		return
	}
	if h.cfg.Serving != nil && !h.cfg.Serving() {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, TypeUnavailable, "node is not serving: recovering, moving or shutting down; retry")
		return
	}
	req, err := ExplainRequestOf(r)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, TypeInvalid, err.Error())
		return
	}
	ctx := r.Context()
	if h.cfg.Caller != nil {
		ctx = h.cfg.Caller(ctx, "http "+r.RemoteAddr)
	}
	resp, err := h.cfg.Explainer.Explain(ctx, req)
	if err != nil {
		st := status.Convert(err)
		code, typ := httpStatus(st.Code())
		if code == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeProblem(w, code, typ, st.Message())
		return
	}
	writeJSON(w, http.StatusOK, "application/json", wire.ExplanationOf(resp))
}

// ExplainRequestOf reads an ExplainRequest from the query of r: recipient
// (required), domain, content (hashed as a check hashes it) or
// content_hash (decimal), cost. An unknown, repeated or malformed
// parameter is an error naming it and its value.
func ExplainRequestOf(r *http.Request) (*pb.ExplainRequest, error) {
	q := r.URL.Query()
	for k, v := range q {
		if !explainParams[k] {
			return nil, fmt.Errorf("query parameter %q is not one of recipient, domain, content, content_hash, cost", k)
		}
		if len(v) > 1 {
			return nil, fmt.Errorf("query parameter %s: given %d times, want once", k, len(v))
		}
	}
	req := &pb.ExplainRequest{Recipient: q.Get("recipient"), Domain: q.Get("domain")}
	if req.Recipient == "" {
		return nil, fmt.Errorf("query parameter recipient: missing; GET %s?recipient=+8613800000000", ExplainPath)
	}
	if c := q.Get("content"); c != "" {
		req.Content = []byte(c)
	}
	if v := q.Get("content_hash"); v != "" {
		if req.Content != nil {
			return nil, fmt.Errorf("query parameters content and content_hash: give one")
		}
		h, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("query parameter content_hash %q: not a decimal 64-bit unsigned integer", v)
		}
		req.ContentHash = h
	}
	if v := q.Get("cost"); v != "" {
		c, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("query parameter cost %q: not a whole number of sends", v)
		}
		req.Cost = uint32(c)
	}
	return req, nil
}
