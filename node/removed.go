package node

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ErrRemovedDomains reports a data directory holding the history of domains
// that the rules no longer have.
var ErrRemovedDomains = errors.New("node: the rules lack domains with history")

// Rules changes never delete history silently. A restart whose rules lack a
// domain that the snapshot or the WAL holds records or sends of refuses to
// start (ErrRemovedDomains, naming each domain and its counts) unless
// Config.DropRemovedDomains says to drop that history; then it logs a WARN
// with the same counts and writes a snapshot at once, so that the drop is
// durable. Refusing was chosen over keeping the records until their longest
// window has passed because the node cannot know that window: it is in the
// rules that are gone. Keeping them until some guessed time, or for ever,
// would hold memory that no Check can read, and a domain missing from the
// rules is more often a wrong rules file than a decision; refusing surfaces
// it before anything is lost, and an intended removal costs one flag.
// If the node later falls back to the snapshot before that drop (its newest
// one damaged), it refuses again and the flag is needed once more.
type removedDomains struct {
	records map[string]int64 // snapshot and partition-image records, by domain
	sends   map[string]int64 // WAL sends, by domain
}

// addCounts adds b to a, allocating a when needed, and returns a.
func addCounts(a, b map[string]int64) map[string]int64 {
	for k, v := range b {
		if a == nil {
			a = map[string]int64{}
		}
		a[k] += v
	}
	return a
}

func (r removedDomains) empty() bool { return len(r.records) == 0 && len(r.sends) == 0 }

func (r removedDomains) totals() (records, sends int64) {
	for _, v := range r.records {
		records += v
	}
	for _, v := range r.sends {
		sends += v
	}
	return records, sends
}

// String lists the domains in name order: `"a" (3 records, 10 WAL sends), ...`.
func (r removedDomains) String() string {
	names := slices.Sorted(maps.Keys(addCounts(addCounts(nil, r.records), r.sends)))
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("domain %q (%d records, %d WAL sends)", name, r.records[name], r.sends[name])
	}
	return strings.Join(parts, ", ")
}
