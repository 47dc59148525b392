// Package gateway serves freqring decisions over HTTP/JSON: POST /v1/check
// answers 200 when an item is admitted and 429 with Retry-After and the IETF
// httpapi draft's RateLimit-Policy and RateLimit fields when it is denied.
//
// It makes no decisions: it translates a JSON body into a CheckRequest, calls
// a Checker (a *node.Node, which routes items to their owners as gRPC items
// are), and translates the CheckResponse back. It imports api, grpc (status
// codes) and net/http only.
package gateway
