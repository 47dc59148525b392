// Package wal is an append-only write-ahead log of opaque payloads. It owns
// the bytes on disk and knows nothing about rules: the node hands it one
// payload per batch of admitted sends and replays the payloads after a
// restart.
//
// # Segments
//
// The log is a directory of segment files named "%016x.wal", the segment's
// sequence number in fixed-width lower-case hex, starting at 1, so that name
// order is log order. Appends go to the newest segment, the active one; every
// other segment is sealed and never changes. After a batch brings the active
// segment to Options.SegmentBytes, or on Rotate, the active segment is sealed:
// truncated to the end of its last record if it is pre-zeroed (below), then
// fsynced. Then the next one is cut: its header is written at offset 0 of a
// spare segment, or of a new "<name>.tmp" if no spare is ready; the file is
// fsynced, renamed to "<name>", and the directory is fsynced. Open deletes
// leftover "<segment name>.tmp" files of interrupted cuts and a leftover
// spare. Open continues the last segment unless it is full.
//
// # Spare segments
//
// Appending to a growing file makes every fsync journal the new size and
// extents; overwriting blocks that already hold fsynced zeros does not, and
// takes about a third less time (etcd's file pipeline does the same). So a
// goroutine of the Log, the preparer, makes the next segment ready once the
// active one holds Options.PrepareAfter bytes (half of SegmentBytes by
// default, so that a new or idle log spends nothing on it): it writes
// Options.SegmentBytes of zeros to "spare.wal.tmp", 1 MiB per write, each
// fsynced (a single fsync of 64 MiB at the end would land in some Append's
// journal commit and stall it for seconds on ext4), without holding any lock
// the appends need. A cut takes the spare when it is ready and otherwise
// makes a plain file as above, so a cut never waits for zeroing.
// Stats.PreparedCuts counts the cuts that used a spare. Close stops the
// preparer and removes an unused spare.
// The cost is disk space, one spare and the unused part of the active
// segment, and writing every segment's bytes twice, once as zeros.
//
// Records are written at the segment's logical size, the end of its last
// record, with pwrite(2): over the zeros of a pre-zeroed segment, and past
// the end of the file when a batch goes beyond it, which then grows as a
// plain file does. SegmentInfo.Size, rotation and Replay use the logical
// size, never the file's length.
//
// A Position is a segment's sequence number and a record's byte offset in the
// segment file.
//
// # Records
//
// Every record is framed the same way, little-endian:
//
//	| size u32 | crc u32 | type u8 | payload (size bytes) |
//
// crc is CRC-32C (Castagnoli) of the type byte and the payload. size is at
// most MaxPayload (16 MiB). Record types, which may only be added, never
// changed:
//
//	0  never written, so that zeroed bytes are never a record
//	1  segment header: version u32 | seq u64 | created i64 (unix ns)
//	   (payload 20 bytes; the record is 29 bytes)
//	2  data: one payload given to Append
//
// Each segment starts with one header record: format version 1, the segment's
// sequence number (equal to the one in its file name) and its creation time
// from Options.Now. Data records follow, one per Append, back to back.
//
// # Recovery: torn tail versus corruption
//
// Open reads every segment. In the last segment, a short header, a short
// payload, an all-zero header, a size over MaxPayload or a bad crc with no
// intact data record anywhere after it marks the end of the log: that is what
// an interrupted write(2) or a power cut in the middle of a batch leaves
// behind.
//
// If every byte after the last intact record of the last segment is zero
// (and the header is intact), the log simply ends there: the zeros are the
// unused part of a pre-zeroed segment. Open keeps the file's length, so that
// appends go on overwriting zeros, and neither counts nor logs anything.
//
// Otherwise the tail is torn. Open truncates the segment to the end of the
// last intact record, fsyncs it, logs the file, offset and number of bytes
// cut at warn level, counts them in Stats.TornBytes, and goes on. In a
// pre-zeroed segment the bytes cut include its unused zeros. Truncating
// rather than zeroing the damage is the simplest way to make sure that no
// stale byte of the torn tail can ever be read back as a record once later
// appends leave a gap before it; the segment then grows as a plain file until
// it is sealed. If even the header is torn, the segment is cut again under
// the same number.
//
// Damage with an intact data record after it is corruption, in the last
// segment as in every other: a torn tail never has intact records after it,
// so cutting there would drop acknowledged appends. Open refuses to open: the
// error wraps ErrCorrupt, names the file and offset of the damage and the
// offset of the next intact record, and hints at the operator override
// (Options.SkipCorrupt, freqring serve --skip-corrupt). The trade: a power
// cut under SyncInterval or SyncNone that loses earlier pages of the last
// batch but keeps later ones also looks like this, and now needs SkipCorrupt
// too, which then keeps those later records although no Append of them had
// returned; they can only make the node count more sends, never admit more.
//
// The same damage in a sealed segment cannot come from a crash, because a
// segment is fsynced before it is sealed, so Open refuses to open there too,
// whatever follows the damage. A sealed segment never ends in zeros either:
// sealing truncates a pre-zeroed segment to its last record before the fsync
// that seals it, so zeros after the last record of a sealed segment are
// damage too, as they were before spare segments. (Accepting zero tails in
// sealed segments would have worked as well, but would keep unused
// preallocation on disk after every early Rotate and weaken the check.) So
// do, in every segment, a record whose framing is intact but whose content is
// wrong (an unknown type, which a newer writer may have added; a header
// record after the start) and a gap in the sequence numbers.
//
// With Options.SkipCorrupt, an operator override, Open instead skips each
// damaged range up to the next intact data record (found by trying every
// byte offset), keeps everything after it, logs each range (file, offset,
// bytes, reason) at error level and counts the bytes in Stats.SkippedBytes;
// Replay skips the same bytes, so it yields exactly the records Open counted.
// A last segment with skipped damage is sealed at once, so that no append
// goes after the damage and retention removes the segment in its time. The
// damaged bytes stay on disk (nothing is rewritten): until then, every Open
// needs SkipCorrupt again. A header with an unknown format version, or a
// sequence number that differs from the file name, is an error in every mode.
//
// # Group commit and sync policies
//
// Append copies its payload into the pending batch and waits. One flusher
// goroutine takes the whole pending batch, writes it with one write(2),
// fsyncs it if the policy says so, and wakes every waiter of that batch;
// meanwhile new appends fill the other of two buffers. Append returns only
// after its record is written to the OS, under every policy, so a killed
// process (kill -9) loses nothing that an Append acknowledged. What a power
// cut or kernel crash can lose depends on Options.Sync:
//
//   - SyncBatch (default): every batch is fsynced before its Appends return.
//     Nothing acknowledged is lost.
//   - SyncInterval: Appends return after write(2); a background loop fsyncs
//     every Options.SyncInterval. Up to about one SyncInterval (plus one
//     fsync's duration) of acknowledged appends can be lost.
//   - SyncNone: appended records are fsynced only by Sync, at rotation and on
//     Close. Whatever the OS had not written back is lost, typically up to
//     about 30 s (Linux vm.dirty_expire_centisecs).
//
// Whatever is lost is lost from the tail only: a sealed segment is always
// fsynced, and Open truncates the torn tail of the last one.
//
// After a write or fsync error the Log refuses all further appends and
// returns that error (Failed, Err): the file may hold a partial record, and
// the pages an fsync failed to write may be gone. Recover brings it back once
// the cause has cleared (space freed, a device back), without a restart: it
// truncates the active segment to the end of the last batch whose Appends
// were told they succeeded (under SyncBatch, the last one fsynced), so that
// nothing an Append was told failed stays in the log, seals that segment and
// cuts a new one. A Recover that fails leaves the log failed; call it again
// later. Reopening the directory truncates a torn tail as well.
//
// # Retention
//
// The package decides nothing about retention; the node does, with Segments
// and RemoveBefore. Every record of a segment was appended before the next
// segment was created, so all of a segment's records are older than the next
// segment's Created time (same clock, Options.Now). A node whose state
// depends only on the records of the last W nanoseconds may delete segment i
// once now-W >= Segments()[i+1].Created. RemoveBefore never deletes the active
// segment. Rotate returns the first position of a fresh segment, which the
// node can use as the replay start of a snapshot written with
// WriteFileAtomic.
//
// A directory must be used by one Log at a time; wal takes no lock on it:
// its owner does (package node locks its data directory before Open).
//
// # Files
//
// wal.go holds Options, Log, Open, Close and the inspection calls (Segments,
// RemoveBefore, Stats). commit.go is group commit: the two batches, Append,
// AppendExpected, Expect and Unexpect, Sync and Rotate, and the flusher loop
// that takes each batch. writer.go is what the flusher does to the files:
// write and fsync a batch, the SyncInterval loop, sealing (rotate) and cutting
// segments, the sticky error. reader.go reads segments back: Open's recovery
// and torn-tail repair, and Replay. spare.go is the preparer of pre-zeroed
// spare segments. segment.go names, lists and scans segment files (plus
// WriteFileAtomic); record.go is the record framing.
package wal
