package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/freqring/freqring/store"
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
// start from the WAL alone. A file is a series of sections, each framed
//
//	| kind u8 | size u32 | crc u32 = CRC-32C(kind + body) | body (size bytes) |
//
// little-endian, in this order (format 3, "FRQSNAP3"):
//
//	header     "FRQSNAP3", created unix ms u64, replay position: segment u64,
//	           offset u64, partitions u32
//	partition  a partition image (package store's format), once per partition
//	end        partitions u32, records u64
//
// Formats 1 and 2 ("FRQSNAP1", "FRQSNAP2", written before the store was
// organised by partition) are still read:
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
// format 3 snapshot at once. A missing end section means a truncated file.
const (
	snapMagic          = "FRQSNAP3"
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

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// sectionWriter frames sections onto w, which buffers.
type sectionWriter struct {
	w   io.Writer
	hdr [9]byte
}

func (sw *sectionWriter) section(kind uint8, body []byte) error {
	if len(body) > maxSection {
		return fmt.Errorf("node: snapshot section of %d bytes, more than %d", len(body), maxSection)
	}
	sw.hdr[0] = kind
	binary.LittleEndian.PutUint32(sw.hdr[1:], uint32(len(body)))
	crc := crc32.Update(crc32.Update(0, crcTable, sw.hdr[:1]), crcTable, body)
	binary.LittleEndian.PutUint32(sw.hdr[5:], crc)
	if _, err := sw.w.Write(sw.hdr[:]); err != nil {
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
// (wal.WriteFileAtomicDirectChunk), the format 3 snapshot whose replay
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
	// parts holds, for format 3, the sequence number each partition's
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

// loadSnapshot loads path into the node's store, skipping records whose
// newest send is at or before their domain's longest window before nowMs.
// Sections are read (with direct I/O where the file system allows it) and
// checked by this goroutine and merged by a worker per core, each partition
// image by one.
func (n *Node) loadSnapshot(path string, nowMs int64) (*snapshotState, error) {
	r, err := wal.OpenDirectChunk(path, snapshotChunk(n.cfg.MaxMemory)) // it reads ahead in chunks
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// f is for advice only: where the file system refuses direct I/O the
	// reads go through the page cache, and what they leave there is dropped
	// as they go (dropCached applies to the file, whichever descriptor).
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ss := &snapshotState{file: path}
	bad := func(off int64, format string, args ...any) error {
		return fmt.Errorf("%w: %s offset %d: %s", ErrCorruptSnapshot, path, off, fmt.Sprintf(format, args...))
	}
	v := n.view.Load()
	work := make(chan imageWork, 4)
	var (
		loadErr error
		errOnce sync.Once
		records atomic.Int64
		skipped atomic.Int64
		workers sync.WaitGroup
		bodies  sync.Pool
		unknown sync.Mutex // guards ss.unknown
	)
	for range max(1, runtime.GOMAXPROCS(0)) {
		workers.Go(func() {
			for w := range work {
				_, ms, err := n.store.MergeImage(*w.img, nowMs, v.bindName)
				records.Add(ms.Records)
				skipped.Add(ms.Idle + ms.UnknownDomain)
				if ms.Unknown != nil {
					unknown.Lock()
					ss.unknown = addCounts(ss.unknown, ms.Unknown)
					unknown.Unlock()
				}
				if err != nil {
					errOnce.Do(func() { loadErr = fmt.Errorf("%w: %s offset %d: %v", ErrCorruptSnapshot, path, w.off, err) })
				}
				bodies.Put(w.img)
			}
		})
	}
	finish := func() error {
		close(work)
		workers.Wait()
		ss.stats.Records, ss.stats.Skipped = ss.stats.Records+records.Load(), ss.stats.Skipped+skipped.Load()
		return loadErr
	}
	buffer := func() *[]byte {
		if buf, ok := bodies.Get().(*[]byte); ok {
			return buf
		}
		return new([]byte)
	}
	submit := func(img []byte, off int64) {
		buf := buffer()
		*buf = append((*buf)[:0], img...)
		work <- imageWork{img: buf, off: off}
	}
	var (
		off      int64
		hdr      [9]byte
		body     *[]byte // the section being read: a loading worker's, once a partition image
		format   int
		dname    string
		shards   uint32
		sawEnd   bool
		nSecs    int
		sections uint32
		image    []byte
		dropped  int64 // bytes from the start whose page cache is dropped
	)
	finished := false
	defer func() {
		if !finished {
			finish()
		}
	}()
	for !sawEnd {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, bad(off, "no end section (%v)", err)
		}
		kind, size := hdr[0], binary.LittleEndian.Uint32(hdr[1:])
		if size > maxSection {
			return nil, bad(off, "section of %d bytes", size)
		}
		if body == nil {
			body = buffer()
		}
		*body = slices.Grow((*body)[:0], int(size))[:size]
		if _, err := io.ReadFull(r, *body); err != nil {
			return nil, bad(off, "section of %d bytes cut short (%v)", size, err)
		}
		crc := crc32.Update(crc32.Update(0, crcTable, hdr[:1]), crcTable, *body)
		if want := binary.LittleEndian.Uint32(hdr[5:]); crc != want {
			return nil, bad(off, "crc %08x, want %08x", crc, want)
		}
		if nSecs == 0 && kind != secHeader {
			return nil, bad(off, "first section is of kind %d, not a header", kind)
		}
		br := walReader{b: *body}
		switch {
		case kind == secHeader:
			magic := string(br.take(8))
			switch {
			case nSecs != 0:
				return nil, bad(off, "a second header")
			case magic == snapMagic:
				format = 3
			case magic == snapMagicV2:
				format = 2
			case magic == snapMagicV1:
				format = 1
			default:
				return nil, bad(off, "unknown format %q", magic)
			}
			ss.created = int64(br.u64())
			ss.from = wal.Position{Seq: br.u64(), Offset: int64(br.u64())}
			if format == 3 {
				parts := br.u64n(4)
				if parts < 1 || parts > store.MaxPartitions {
					return nil, bad(off, "%d partitions", parts)
				}
				ss.parts = make([]uint64, parts)
				ss.resnap = int(parts) != n.store.Partitions()
			} else {
				ss.legacy = map[string]shardSeqs{}
				ss.resnap = true
			}
		case kind == secPartition && format == 3:
			img := br.b
			br.b = nil
			if len(img) < 17 { // version, partition, partitions, seq
				return nil, bad(off, "partition image of %d bytes", len(img))
			}
			p := binary.LittleEndian.Uint32(img[1:])
			if int(p) >= len(ss.parts) {
				return nil, bad(off, "partition %d of %d", p, len(ss.parts))
			}
			ss.parts[p] = binary.LittleEndian.Uint64(img[9:])
			// The worker takes the section's buffer as it is, rather
			// than a copy, and puts it back in bodies when done.
			work <- imageWork{img: body, off: off}
			body = nil
			sections++
		case kind == secDomain && format < 3:
			dname = string(br.take(uint64(br.u64n(2))))
			shards = uint32(br.u64n(4))
			if shards == 0 || shards&(shards-1) != 0 || shards > 1<<16 {
				return nil, bad(off, "domain %q has %d shards", dname, shards)
			}
			ss.legacy[dname] = shardSeqs{shift: uint(64 - bits.Len(uint(shards-1))), seq: make([]uint64, shards)}
		case kind == secShard && format < 3:
			if dname == "" {
				return nil, bad(off, "shard section before any domain")
			}
			i := uint32(br.u64n(4))
			seq := br.u64()
			if i >= shards {
				return nil, bad(off, "shard %d of %d", i, shards)
			}
			ss.legacy[dname].seq[i] = seq
			// The rest is a domain block of a partition image: records,
			// then (format 2) request ids. Under one image of a store of
			// partition count 1 that differs from this one's, MergeImage
			// spreads the records by key and drops the ids.
			image = legacyImage(image[:0], dname, br.b, format, n.store.Partitions())
			br.b = nil
			submit(image, off)
			sections++
		case kind == secEnd:
			if format == 3 {
				if want := uint32(br.u64n(4)); want != sections || int(want) != len(ss.parts) {
					return nil, bad(off, "end section counts %d partitions, read %d of %d", want, sections, len(ss.parts))
				}
			} else if want := uint32(br.u64n(4)); want != uint32(len(ss.legacy)) || uint32(br.u64n(4)) != sections {
				return nil, bad(off, "end section counts %d domains, read %d", want, len(ss.legacy))
			}
			sawEnd = true
		default:
			return nil, bad(off, "unknown section kind %d in a format %d snapshot", kind, format)
		}
		if br.err != nil {
			return nil, bad(off, "section of kind %d: %v", kind, br.err)
		}
		off += int64(len(hdr)) + int64(size)
		nSecs++
		if off-dropped >= dropCachedStep {
			dropCached(f, dropped, off-dropped)
			dropped = off
		}
	}
	dropCached(f, dropped, off-dropped)
	finished = true
	if err := finish(); err != nil {
		return nil, err
	}
	ss.stats.Bytes = off
	return ss, nil
}

// dropCachedStep is how many bytes of a snapshot loadSnapshot reads
// between two requests to drop what it read from the page cache. It reads
// the file once, and the store it fills is as large: at 100M recipients the
// two (12.7 GB each) do not fit in 24 GiB together, and while the cache
// held the file the store's huge pages were found by reclaim and
// compaction, which made recovery take half as long again (measured at
// 100M recipients with deploy/scale/restart.sh; docs/benchmarks.md).
const dropCachedStep = 64 << 20

// imageWork is one partition image of a snapshot, for a loading worker.
type imageWork struct {
	img *[]byte
	off int64 // the section's offset in the file, for errors
}

// legacyImage appends to dst a partition image holding the shard section
// rest (records, then with format 2 request ids) of domain name, taken under
// a partition count other than this store's (parts), so that MergeImage
// spreads its records by key and drops its ids, which were saved without
// their recipients.
func legacyImage(dst []byte, name string, rest []byte, format, parts int) []byte {
	from := uint32(1)
	if parts == 1 {
		from = 2
	}
	dst = append(dst, 1) // image version
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, from)
	dst = binary.LittleEndian.AppendUint64(dst, 0)
	dst = binary.LittleEndian.AppendUint16(dst, 1)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	dst = append(dst, name...)
	dst = append(dst, rest...)
	if format == 1 {
		dst = binary.LittleEndian.AppendUint32(dst, 0) // no request ids
	}
	return dst
}

// snapSeq returns the WAL segment a snapshot file name says replay starts in.
func snapSeq(name string) uint64 {
	seq, _ := strconv.ParseUint(name[:16], 16, 64)
	return seq
}

// verifySnapshot reads back a format 3 snapshot that this node just wrote,
// streaming, with direct I/O in chunks of chunk bytes (0: wal's default)
// where the file system allows it (the disk's bytes, not the page cache's),
// and checks every section's framing and crc, the partition
// count (parts), every partition image (store.CheckImage) and the end
// section, without loading anything. An error wraps ErrCorruptSnapshot and
// names the file and offset.
func verifySnapshot(path string, parts, chunk int) error {
	r, err := wal.OpenDirectChunk(path, chunk) // it reads ahead in chunks
	if err != nil {
		return err
	}
	defer r.Close()
	bad := func(off int64, format string, args ...any) error {
		return fmt.Errorf("%w: %s offset %d: %s", ErrCorruptSnapshot, path, off, fmt.Sprintf(format, args...))
	}
	var (
		off      int64
		hdr      [9]byte
		body     []byte
		sections int
	)
	for n := 0; ; n++ {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return bad(off, "no end section (%v)", err)
		}
		kind, size := hdr[0], binary.LittleEndian.Uint32(hdr[1:])
		if size > maxSection {
			return bad(off, "section of %d bytes", size)
		}
		body = slices.Grow(body[:0], int(size))[:size]
		if _, err := io.ReadFull(r, body); err != nil {
			return bad(off, "section of %d bytes cut short (%v)", size, err)
		}
		crc := crc32.Update(crc32.Update(0, crcTable, hdr[:1]), crcTable, body)
		if want := binary.LittleEndian.Uint32(hdr[5:]); crc != want {
			return bad(off, "crc %08x, want %08x", crc, want)
		}
		switch {
		case n == 0:
			if kind != secHeader || len(body) != 8+8+16+4 || string(body[:8]) != snapMagic {
				return bad(off, "not a format 3 header (kind %d, %d bytes)", kind, len(body))
			}
			if got := binary.LittleEndian.Uint32(body[32:]); int(got) != parts {
				return bad(off, "%d partitions, want %d", got, parts)
			}
		case kind == secPartition:
			if _, err := store.CheckImage(body); err != nil {
				return bad(off, "partition image: %v", err)
			}
			sections++
		case kind == secEnd:
			if len(body) != 12 {
				return bad(off, "end section of %d bytes", len(body))
			}
			if got := binary.LittleEndian.Uint32(body); int(got) != sections || sections != parts {
				return bad(off, "end section counts %d partitions, read %d of %d", got, sections, parts)
			}
			var more [1]byte
			if _, err := io.ReadFull(r, more[:]); err != io.EOF {
				return bad(off+int64(len(hdr))+int64(size), "bytes after the end section")
			}
			return nil
		default:
			return bad(off, "unknown section kind %d", kind)
		}
		off += int64(len(hdr)) + int64(size)
	}
}
