package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/freqring/freqring/wal"
)

// ErrCorruptSnapshot reports a snapshot file that fails its checks.
var ErrCorruptSnapshot = errors.New("node: corrupt snapshot")

// A snapshot holds every record of a node and, per partition, the sequence
// number of the last send it includes, so that a restart loads it and replays
// only the WAL from the position it names. Files are named "%016x.snap" after
// the WAL segment replay starts at, written atomically (wal.WriteFileAtomic)
// and read back to verify them (verifySnapshot). A node keeps the newest two
// intact snapshots and the WAL from the older one's replay start: Open loads
// the newest intact one, falling back on its own (logging each damaged file
// at error level), since the older snapshot plus the WAL after it lose
// nothing. Only when no snapshot is intact does it need --skip-corrupt, to
// start from the WAL alone. A file is a series of sections, each framed as
// a WAL record is (wal.AppendFrame), its type the section's kind:
//
//	| size u32 | crc u32 = CRC-32C(kind + body) | kind u8 | body (size bytes) |
//
// little-endian, in this order (format 4, "FRQSNAP4"):
//
//	header     "FRQSNAP4", created unix ms u64, replay position: segment u64,
//	           offset u64, partitions u32
//	partition  a partition image (package store's format), once per partition
//	end        partitions u32, records u64
//
// Format 3 ("FRQSNAP3") has the same sections in a framing of its own,
// | kind u8 | size u32 | crc u32 = CRC-32C(kind + body) | body |, and is
// still read, as are formats 1 and 2 ("FRQSNAP1", "FRQSNAP2", written before
// the store was organised by partition), in that framing too:
//
//	header   magic, created unix ms u64, replay position: segment u64, offset u64
//	domain   name length u16, name, shards u32 (once per domain)
//	shard    shard u32, seq u64, records u32, then each: key u64, length u16, record;
//	         then (format 2) request ids u32, then each: mixed key u64, decision time u64
//	end      domains u32, shards u32, records u64
//
// Their records are spread over this version's partitions by key; their
// request ids, saved without their recipient, are dropped (the WAL tail
// after the snapshot still restores the ids it holds), and Open writes a
// format 4 snapshot at once, as it does after loading a format 3 one. A
// missing end section means a truncated file. snapread.go reads them.
const (
	snapMagic          = "FRQSNAP4"
	snapMagicV3        = "FRQSNAP3"
	snapMagicV2        = "FRQSNAP2"
	snapMagicV1        = "FRQSNAP1" // no request ids
	secHeader    uint8 = 1
	secDomain    uint8 = 2 // formats 1 and 2
	secShard     uint8 = 3 // formats 1 and 2
	secEnd       uint8 = 4
	secPartition uint8 = 5
	maxSection         = 1 << 30
)

// snapName is the file name of the snapshot whose replay starts in segment seq.
func snapName(seq uint64) string { return fmt.Sprintf("%016x.snap", seq) }

// listSnapshots returns the snapshot files of dir, oldest first.
func listSnapshots(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".snap") && len(name) == 21 {
			if _, err := strconv.ParseUint(name[:16], 16, 64); err == nil {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// sectionWriter frames sections onto w, which buffers, in wal's framing
// (format 4).
type sectionWriter struct {
	w   io.Writer
	hdr []byte
}

func (sw *sectionWriter) section(kind uint8, body []byte) error {
	if len(body) > maxSection {
		return fmt.Errorf("node: snapshot section of %d bytes, more than %d", len(body), maxSection)
	}
	sw.hdr = wal.AppendFrameHeader(sw.hdr[:0], kind, body)
	if _, err := sw.w.Write(sw.hdr); err != nil {
		return err
	}
	_, err := sw.w.Write(body)
	return err
}

// snapshotStats counts what a snapshot wrote or loaded.
type snapshotStats struct {
	Records int64
	Bytes   int64
	Skipped int64 // records not loaded: idle, or of a domain the rules no longer have
}

// writeSnapshot writes every partition's image to dir as the snapshot whose
// replay starts at from, locking one partition at a time.
func (n *Node) writeSnapshot(dir string, from wal.Position, nowMs int64) (snapshotStats, error) {
	return writeSnapshotFile(dir, from, nowMs, n.store.Partitions(), snapshotChunk(n.cfg.MaxMemory), func(dst []byte, p int) ([]byte, int64, error) {
		img, cnt := n.store.AppendImage(dst, p)
		return img, cnt, nil
	})
}

// snapshotChunk returns the direct I/O chunk size, bytes, with which a node
// budgeted at maxMemory bytes (Config.MaxMemory) writes, verifies and loads
// snapshots: 0 (wal's default, 8 MiB) without a limit; with one, 1/256 of
// it rounded down to a power of two, from 1 MiB to 8 MiB. A write holds
// about three chunks and a buffer of its largest partition image,
// a verification or a load two chunks (and a load its images in flight):
// with 1 MiB chunks at 128 MiB, a snapshot costs 3 MiB of buffers where 8
// MiB ones took up to 40 MiB.
func snapshotChunk(maxMemory int64) int {
	if maxMemory <= 0 {
		return 0
	}
	c := 1 << 20
	for c < 8<<20 && int64(c)*2*256 <= maxMemory {
		c *= 2
	}
	return c
}

// writeSnapshotFile writes to dir, with direct I/O in chunks of chunk bytes
// (0: wal's default) where the file system allows it
// (wal.WriteFileAtomicDirectChunk), the format 4 snapshot whose replay
// starts at from, taken at nowMs (unix ms), of parts partitions: image appends
// partition p's image (store.AppendImage's format) to dst and returns it
// with its record count; it is called once per partition, in order, and
// its bytes are written before the next call, into the buffer the previous
// call returned. An error of image stops the write and leaves no file.
func writeSnapshotFile(dir string, from wal.Position, nowMs int64, parts, chunk int, image func(dst []byte, p int) ([]byte, int64, error)) (snapshotStats, error) {
	var st snapshotStats
	err := wal.WriteFileAtomicDirectChunk(dir, snapName(from.Seq), chunk, func(w io.Writer) error {
		cw := &countingWriter{w: w}
		sw := sectionWriter{w: cw} // w buffers: in chunks with direct I/O, else 64 KiB
		body := binary.LittleEndian.AppendUint64([]byte(snapMagic), uint64(nowMs))
		body = binary.LittleEndian.AppendUint64(body, from.Seq)
		body = binary.LittleEndian.AppendUint64(body, uint64(from.Offset))
		body = binary.LittleEndian.AppendUint32(body, uint32(parts))
		if err := sw.section(secHeader, body); err != nil {
			return err
		}
		var buf []byte
		for p := range parts {
			var (
				cnt int64
				err error
			)
			if buf, cnt, err = image(buf[:0], p); err != nil {
				return err
			}
			st.Records += cnt
			if err := sw.section(secPartition, buf); err != nil {
				return err
			}
		}
		body = binary.LittleEndian.AppendUint32(body[:0], uint32(parts))
		body = binary.LittleEndian.AppendUint64(body, uint64(st.Records))
		if err := sw.section(secEnd, body); err != nil {
			return err
		}
		st.Bytes = cw.n
		return nil
	})
	return st, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// snapshotState is what a loaded snapshot says about the WAL.
type snapshotState struct {
	file    string
	from    wal.Position // replay the WAL from here
	created int64        // unix ms
	// parts holds, for formats 3 and 4, the sequence number each partition's
	// records include, by partition under the snapshot's partition count.
	parts []uint64
	// legacy holds, for formats 1 and 2, per domain the sequence number each
	// shard's records include.
	legacy map[string]shardSeqs
	// resnap: the snapshot is not in this node's layout (an older format or
	// another partition count); Open writes a fresh one.
	resnap bool
	stats  snapshotStats
	// unknown counts, by name, the records of domains the rules lack, which
	// the load skipped.
	unknown map[string]int64
}

// shardSeqs are a domain's shard sequence numbers in a format 1 or 2
// snapshot, and how keys mapped to those shards.
type shardSeqs struct {
	shift uint
	seq   []uint64
}

// covered reports whether the send with key and seq is already in the snapshot.
func (s *snapshotState) covered(domain string, key, seq uint64) bool {
	if s.parts != nil {
		return seq <= s.parts[key%uint64(len(s.parts))]
	}
	ss, ok := s.legacy[domain]
	if !ok {
		return false
	}
	return seq <= ss.seq[max(key, 1)>>ss.shift]
}

// dropCachedStep is how many bytes of a snapshot loadSnapshot reads
// between two requests to drop what it read from the page cache. It reads
// the file once, and the store it fills is as large: at 100M recipients the
// two (12.7 GB each) do not fit in 24 GiB together, and while the cache
// held the file the store's huge pages were found by reclaim and
// compaction, which made recovery take half as long again (measured at
// 100M recipients with deploy/scale/restart.sh; docs/benchmarks.md).
const dropCachedStep = 64 << 20

// snapSeq returns the WAL segment a snapshot file name says replay starts in.
func snapSeq(name string) uint64 {
	seq, _ := strconv.ParseUint(name[:16], 16, 64)
	return seq
}
