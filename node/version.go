package node

import (
	"runtime/debug"
	"sync"
)

// ProtocolVersion is the version of the Peer protocol and of the formats that
// travel between nodes (WAL payloads, partition images). Nodes publish it in
// gossip; only nodes of one protocol share a ring. It changes only when a
// change would make two binaries misread each other.
//
// Version 2: partition images of version 2 (records in window's format 2)
// in Fill and in the WAL. Acquire still answers version 1 to a caller that
// asks for nothing newer, so members of version 1 left out of the ring can
// take their partitions from a version 2 member during a rolling upgrade.
//
// Version 3: partition images of version 3 (records in window's format 3,
// which adds the counting algorithms' states) in Fill and in the WAL.
// Acquire answers versions 1 and 2 to callers that ask for them, unless a
// partition holds counter states (then FailedPrecondition: no older binary
// can load rules with counting algorithms).
const ProtocolVersion = 3

// Version returns the binary's version: the main module's version and, when
// the build recorded them, the VCS revision (12 hex digits) and "+dirty" for
// uncommitted changes, e.g. "(devel) 8e44184a0b1c+dirty". Safe for concurrent
// use.
func Version() string { return version() }

var version = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " " + rev + dirty
	}
	if len(v) > 64 { // gossip's bound
		v = v[:64]
	}
	return v
})
