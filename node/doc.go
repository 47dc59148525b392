// Package node is a freqring node: it wires the rule engine (window) to
// sharded in-memory records and serves them over gRPC.
//
// # Data flow
//
// A Check request is a batch of items in columns (see api/freqring/v1). The
// node validates its shape, reads its clock once, and decides each item in
// order: the recipient's key is xxhash64 of its bytes, which picks a shard of
// the item's domain; under that shard's lock the record is looked up,
// window.Apply decides, and a changed record is written back. Nothing else
// takes a lock on the check path.
//
// # Memory layout
//
// Each domain has its own store of Shards shards (default 256). A shard holds
//   - an open-addressing index (linear probing, backward-shift deletion) of
//     12-byte entries, a 64-bit key hash and a 32-bit slot reference, grown by
//     half when 85% full;
//   - one slab per size class (8-byte steps to 256 bytes, then ~1/8 steps to
//     window.MaxRecordBytes), of pointer-free chunks that double from 1 KiB
//     to 256 KiB; a record moves to another class when its size does.
//
// Nothing per recipient holds a pointer, so a garbage collection costs the
// same at 10 million recipients as at ten.
//
// # Collisions
//
// Two recipients whose 64-bit key hashes collide are told apart by a 16-bit
// tag (CRC-32C of the recipient) in the record header: the second gets its
// own index entry with the same key, and the store counts the collision
// (DomainStats.Collisions). Only recipients equal in all 80 bits share a
// record; sharing can deny early, never admit beyond a limit.
//
// # Idle records
//
// A record whose newest send is older than its domain's longest window holds
// nothing any rule counts. Serve sweeps them every SweepInterval, one shard
// at a time and at most sweepBudget index entries per lock hold.
package node
