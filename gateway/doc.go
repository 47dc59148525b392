// Package gateway serves freqring decisions to callers that do not speak
// freqring's gRPC API:
//
//   - Handler, HTTP/JSON: POST /v1/check answers 200 when an item is
//     admitted and 429 with Retry-After and the IETF httpapi draft's
//     RateLimit-Policy and RateLimit fields when it is denied;
//   - RLS, Envoy's rate limit service (envoy.service.ratelimit.v3), which
//     cmd/freqring registers on the node's gRPC server through
//     node.Config.Services: Envoy and Istio meshes call ShouldRateLimit
//     before forwarding a request.
//
// It makes no decisions: it translates a request into a CheckRequest, calls
// a Checker (a *node.Node, which routes items to their owners as gRPC items
// are), and translates the CheckResponse back. It imports api, grpc,
// net/http, go-control-plane's RLS types, and rules for the envoy section
// that maps Envoy's descriptors to items (read through a func, so that it
// follows reloads); never node.
package gateway
