// Package api holds freqring's gRPC API: the proto sources under
// freqring/v1 and the generated Go code in freqringv1. Nothing else lives
// here; the node converts these types to its own at its boundary.
//
// Regenerate with `go generate ./api` (which runs gen.sh).
package api

//go:generate ./gen.sh
