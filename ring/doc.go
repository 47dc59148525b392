// Package ring answers "which member owns key k". It is pure: no goroutines,
// no network, no clock, and it does not import memberlist, so clients can
// link it without pulling gossip into their binaries. Membership lives in
// ring/gossip, which builds a new Ring on every change.
//
// # Keys
//
// A key (the recipient) is hashed with xxhash64, seed 0, over its bytes
// (Hash, HashString). Its partition is hash % PartitionCount (271 by default).
// Nodes and clients must hash the recipient string exactly this way.
//
// # Placement
//
// Partitions are placed on members by github.com/buraksezer/consistent
// v1.0.0 (consistent hashing with bounded loads) with the same xxhash64:
// every member gets ReplicationFactor virtual nodes, hashed from "i:name";
// partition p is hashed from its id as a little-endian uint64 and goes to the
// first member clockwise that has fewer than ceil(PartitionCount/members*Load)
// partitions. Only member names take part; addresses do not. New reads the
// partition table out of consistent once, so a lookup is one hash, one
// modulo and two slice indexes, with no lock and no allocation.
//
// Determinism: consistent's placement depends only on the set of member
// names, not on the order they are added or on map iteration. It sorts its
// virtual-node hashes, walks partitions in id order, and only looks maps up
// by key. The one exception is two virtual nodes with the same 64-bit hash
// (odds about (members*ReplicationFactor)²/2^65): the member added last takes
// the point. New adds members sorted by name, so even that case is the same
// everywhere. The load bound is float64 division and Ceil, which gives the
// same result on every architecture. TestOwnersIgnoreOrder and
// TestConsistentIgnoresOrder check both; TestPlacementGolden pins the
// placement itself, so an upgrade that changes it is caught.
//
// # Replica
//
// The replica of a partition is the member that would own it if its owner
// left the ring: the member that takes over the partition when the owner
// crashes, if nothing else changes at the same time. New computes it by
// removing each member in turn. This is neither consistent's GetClosestN
// (the next member on a ring of name hashes, the same for all of a member's
// partitions) nor the next virtual node clockwise (which the bounded-load
// rule may skip). Note that with bounded loads a removal can also move a few
// partitions between the remaining members.
//
// # Epoch
//
// Epoch is xxhash64 of a canonical encoding of the placement version, the
// parameters and the members sorted by name, with their addresses. Equal sets
// give equal epochs on every process, in any order; any change of name,
// address or parameter changes it (a collision has odds about 2^-64 per pair
// of rings). 0 means no ring. Because addresses are included, a node that
// comes back at a new address changes the epoch without moving any key.
//
// # Cost
//
// Owner costs about 7.5ns on one core of the 2-core build machine (10 to 100
// members; consistent's LocateKey, with its lock and map, costs 20ns).
// New is dominated by consistent, which re-sorts its virtual nodes for each
// member it adds, plus one Remove and Add per member for the replica table:
// about 0.8ms for 10 members, 19ms for 100 and 93ms for 300 (BenchmarkNew).
// Every node and client pays it once per membership change.
package ring
