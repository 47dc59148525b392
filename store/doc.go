// Package store keeps freqring's records in memory: one compact record
// (package window's format) per recipient and domain, organised by ring
// partition so that a partition can be listed, exported as an image, merged
// into another store and dropped without touching the others. It imports
// window only; partition numbers are the ring's (key % Partitions), given as
// a count. A Store is safe for concurrent use.
//
// # Partitions and locks
//
// A Store has Partitions partitions, each with one lock, which guards every
// record of the partition in every domain, its request ids, its sequence
// number and its window.Scratch. A check takes exactly one lock. Within a
// partition each domain has its own space: an open-addressing index (linear
// probing, backward-shift deletion) of 12-byte entries (a 64-bit key hash
// and a 32-bit slot reference, grown by a quarter when 85% full) and one slab per
// size class (2-byte steps to 64 bytes, 4-byte steps to 256 bytes, then ~1/8
// steps to window.MaxRecordBytes), of pointer-free chunks that double from
// 1 KiB to 32 KiB; a record moves to another class when its size does. Nothing per
// recipient holds a pointer, so a garbage collection costs the same at 10
// million recipients as at ten. Full-size chunks come from memory the store
// maps itself (blocks), and so do index tables of 2 MiB or more (from about
// 40M recipients a node in the default 271 partitions; 6 MiB each at 100M),
// each in a mapping of its own: outside the Go heap, they are not resident
// a second time as the collector's headroom.
//
// # Batches
//
// ApplyBatch decides a batch as Apply would item by item, grouped by
// partition: one hold of each partition's lock for its items, in batch
// order. At millions of recipients a check costs about two dependent cache
// misses (index entry, then record), each with a TLB miss; ApplyBatch
// prefetches the entries (and the request ids' cache slots) and records of
// the partitions two and one ahead of the one it decides (a prefetch
// instruction, prefetch_amd64.s and prefetch_arm64.s; a no-op elsewhere),
// so those misses overlap with deciding. BenchmarkStoreBatch compares it with Apply in one run.
// RecordBatch does the same for a backup's sends, as Record would one by
// one (BenchmarkStoreRecordBatch).
//
// # Domains
//
// The domain is an argument of every call, as a Ref from Bind. Records belong
// to the domain's name: binding a reloaded rule set finds the same records.
//
// # Collisions
//
// Two recipients whose 64-bit key hashes collide are told apart by a 16-bit
// tag (the caller's verifier, kept in the record header): the second gets
// its own index entry with the same key, and the store counts the collision
// (Stats.Collisions). Only recipients equal in all 80 bits share a record;
// sharing can deny early, never admit beyond a limit.
//
// # Request ids
//
// A recorded item's nonzero request id is remembered for IDHorizon in its
// partition (two generations of integer maps, keyed by id mixed with the
// recipient's key), so that a retry is answered from the first decision.
//
// # Sequence numbers
//
// Each partition numbers the sends it records (Apply returns the number).
// The node writes the number to its WAL beside the send, and a snapshot
// image carries the partition's number when it was taken, so that a restart
// replays only the sends the snapshot does not hold.
//
// # Images
//
// AppendImage writes a partition's records and ids (format in image.go);
// MergeImage merges one in as a set union of sends (window.Domain.Merge),
// checking the whole image before it changes anything. Snapshots are a
// series of images, and partition handoff moves them between nodes. Image
// version 2 holds records in window's format 2; version 1 (format 1) is
// read, and written on request for peers of older releases. SplitImage
// cuts an image into parts of bounded size whose union is the image, for
// peer messages and WAL records.
//
// # Memory outside the Go heap
//
// A slab's chunks double from 1 KiB, then stay at 32 KiB. The 32 KiB ones,
// which hold nearly every record of a store with many recipients, come from
// regions of 64 MiB that the store maps itself (blocks.go) and advises for
// transparent huge pages before anything touches them. On the Go heap a
// kernel in madvise mode (the usual default) backs records with 4 KiB
// pages, and at 100M recipients nearly every check then misses the TLB.
// Advising the Go heap's own arenas does not serve: pages the runtime
// touched first stay small, and on the VM where this was measured the
// mixture ran five times slower than either kind alone. A block freed by a
// sweep's trim or by Drop is reused, zeroed, before anything new is mapped;
// the regions are unmapped once the store is unreachable (a cleanup on its
// memory account, which every slab points into, so no block can still be in
// use). Config.HeapSlabs keeps every chunk on the Go heap, as does a
// platform or sandbox that refuses the mapping. The race detector does not
// watch memory outside the Go heap: races on records in blocks go unseen
// under -race (small stores, as in most tests, keep theirs on the heap).
//
// # Memory limit
//
// A store counts the memory it holds (Memory): every index table, slab chunk
// and free list as it is allocated and freed, and the tables of its request
// ids, in one atomic counter that changes only when memory does (a chunk, a
// resize, a rebuild), so checks do not contend on it.
// With Config.MaxBytes, once the store holds MaxBytes or more (counting the
// free blocks it keeps for reuse), Apply takes no more memory for a
// decision. It refuses, with ErrMemoryLimit and changing nothing:
//
//   - an item that would create a record (its recipient has none in the
//     domain), unless the record fits room already held: a free slot of its
//     size class (left by a reclaimed or moved record), room in that
//     class's chunks or a free block for its next one, and room in the index;
//   - an item of a known recipient whose record would grow out of its slot
//     into a size class with no such room (MemoryStats.RefusedGrowth).
//
// Everything else is decided as always: denials and peeks, which write
// nothing, sends that fit the record's slot, and records that move to a
// class with room held. A record that shrinks into a class with no room
// held stays in its slot, which holds it. The request ids of recorded
// items are remembered as always, but the table does not grow: its
// rebuilds keep the newest that fit (Stats.EvictedIDs counts the others).
// So the store holds no more than its limit and what the last allocation
// below it took past it (a chunk, or an index table grown by a quarter),
// give or take a free block that two partitions' checks both count on (the
// later one maps a fresh block), the free lists of the slots moved records
// leave, and an id table of minimal size for a domain that had none.
//
// Replay (Insert), backups (Record), merges (MergeImage, MergeRecord) and
// refunds never refuse: they carry sends another node or this one
// admitted, and losing those is worse than holding more; what they create
// or grow past the limit is counted (MemoryStats.Overshoots). Replay
// rebuilds what the store held before a restart (within the limit then, if
// the limit has not been lowered since); a backup holds copies of what
// its partitions' owners admitted within their own limits.
//
// # Idle records
//
// A record whose newest send is older than its domain's longest window holds
// nothing any rule counts. Sweep reclaims them a bounded number of index
// entries at a time; MergeImage skips them.
//
// A record keeps the content logs of its newest sends until its next write,
// even when no content rule can count them any more. Sweep also compacts the
// records whose newest send is older than the domain's longest content
// window, in a domain with recipient rules: it drops their content logs
// (window.Domain.Compact), which leaves a recipient of 3 sends a day about 4
// bytes lighter. The caller chooses the time it sweeps as of: a decision
// timed before it could miss a send the sweep dropped (the node sweeps as of
// a minute ago). Past the memory limit, a compaction that would need a
// fresh chunk waits for a free slot: the slot it leaves is given back only
// by a later pass.
//
// # Sparse chunks
//
// A slab gives a chunk back only when no record is left in it, and records
// move between size classes as their sends come and expire, so a class
// whose records moved away would keep the chunks of its highest occupancy
// ever. A sweep pass of a partition therefore plans, when it starts, to give
// back each slab's tail chunks that its records would fit without (a
// quarter chunk of free slots kept as headroom), if those hold at least a
// full-size chunk's slots; moves each record it visits there to a free slot
// below, within its steps' budget; and, when it ends, gives the chunks back
// if no record is left in them, or leaves them to the next pass (see
// slab.planDefrag).
package store
