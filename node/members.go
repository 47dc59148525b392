package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// This file is rule 5's memory across restarts (partition.go): the members a
// node counts are kept in its data directory, so that a node that restarts
// and then sees nobody (its peers unreachable, or marked failed by its own
// gossip before its first reconcile, as on a starved machine) does not hold
// a majority of one and decide alone for every partition. It counts the
// members it remembers, from its start, until it sees them again or
// ForgetDeadAfter passes.

// membersFile is the file in the data directory that holds the members
// this node counts for rule 5: JSON, written as the count changes
// (temp file, fsync, rename).
const membersFile = "members.json"

// membersJSON is the format of membersFile.
type membersJSON struct {
	Format  int      `json:"format"`
	Members []string `json:"members"` // no duplicates; saveMembers sorts them
}

// decodeMembers parses membersFile's contents: the member names, or an
// error that names what is wrong.
func decodeMembers(b []byte) ([]string, error) {
	var f membersJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	if f.Format != 1 {
		return nil, fmt.Errorf("format %d, want 1", f.Format)
	}
	seen := make(map[string]bool, len(f.Members))
	for i, m := range f.Members {
		if m == "" || strings.ContainsFunc(m, func(r rune) bool { return r < ' ' }) {
			return nil, fmt.Errorf("members[%d] = %q: not a member name", i, m)
		}
		if seen[m] {
			return nil, fmt.Errorf("members[%d] = %q: listed twice", i, m)
		}
		seen[m] = true
	}
	return f.Members, nil
}

// loadMembers counts for rule 5, as present now, the members kept in the
// data directory by an earlier run. Without a DataDir, or before the first
// run has written the file, it counts nobody. A file it cannot read is an
// error that names it: deciding as if it were absent could let this node
// decide alone beside a majority it has forgotten.
func (n *Node) loadMembers() error {
	if n.cfg.DataDir == "" {
		return nil
	}
	path := filepath.Join(n.cfg.DataDir, membersFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		var names []string
		if names, err = decodeMembers(b); err == nil {
			h := n.ho
			now := time.Now()
			h.mu.Lock()
			for _, m := range names {
				h.counted[m] = now
			}
			h.seen = len(h.counted)
			h.mu.Unlock()
			h.savedMembers = names
			n.log.Info("rule 5: counting the members this node counted before it stopped, until it sees them again or ForgetDeadAfter passes",
				"file", path, "members", names, "forget_dead_after", n.cfg.ForgetDeadAfter)
			return nil
		}
	}
	return fmt.Errorf("node: members counted for the majority (rule 5): %s: %w (remove the file only if those members are gone for good: this node then counts only those it sees)", path, err)
}

// saveMembers writes the members counted for rule 5 to the data directory
// when they differ from what it last wrote. Only the mover calls it. A
// failure is logged and tried again at the next call: the node decides on
// what it counts in memory either way.
func (n *Node) saveMembers() {
	if n.cfg.DataDir == "" {
		return
	}
	h := n.ho
	h.mu.Lock()
	names := make([]string, 0, len(h.counted))
	for m := range h.counted {
		names = append(names, m)
	}
	h.mu.Unlock()
	slices.Sort(names)
	if slices.Equal(names, h.savedMembers) {
		return
	}
	b, err := json.MarshalIndent(membersJSON{Format: 1, Members: names}, "", "  ")
	if err == nil {
		err = writeFileAtomic(n.cfg.DataDir, membersFile, b)
	}
	if err != nil {
		n.log.Warn("rule 5: could not keep the members counted in the data directory; a restart may count too few", "file", membersFile, "err", err)
		return
	}
	h.savedMembers = names
}
