package rules

import "fmt"

// Durability is what a domain's admitted sends must reach before the
// answer that admits them goes out: the owner's disk, its backup, or
// neither. A node's --sync and --replication can only lower it (package
// node).
type Durability uint8

const (
	// DurabilityDefault is a domain that does not say: the node's default
	// applies.
	DurabilityDefault Durability = iota
	// DurabilityFsync: written and fsynced on the owner, and held by the
	// backup (in its store, written to its WAL).
	DurabilityFsync
	// DurabilityReplicated: written on the owner and held by the backup;
	// each fsyncs within its --sync-interval. Sends with no backup (a node
	// alone, or replication off) wait for the owner's fsync instead.
	DurabilityReplicated
	// DurabilityAsync: written on the owner; the backup follows, at most
	// --async-bound sends of a partition behind.
	DurabilityAsync
)

// String returns the name a rules file uses: fsync, replicated or async
// ("" for DurabilityDefault).
func (d Durability) String() string {
	switch d {
	case DurabilityDefault:
		return ""
	case DurabilityFsync:
		return "fsync"
	case DurabilityReplicated:
		return "replicated"
	case DurabilityAsync:
		return "async"
	}
	return fmt.Sprintf("Durability(%d)", uint8(d))
}

// ParseDurability parses fsync, replicated or async; "" is
// DurabilityDefault.
func ParseDurability(s string) (Durability, error) {
	switch s {
	case "":
		return DurabilityDefault, nil
	case "fsync":
		return DurabilityFsync, nil
	case "replicated":
		return DurabilityReplicated, nil
	case "async":
		return DurabilityAsync, nil
	}
	return 0, fmt.Errorf("durability %q is not one of fsync, replicated, async", s)
}

// Durability returns the durability the rules give domain name;
// DurabilityDefault when they give none, or have no such domain.
func (rs *Set) Durability(name string) Durability { return rs.durability[name] }
