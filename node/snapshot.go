package node

import (
	"bufio"
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

	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// ErrCorruptSnapshot reports a snapshot file that fails its checks.
var ErrCorruptSnapshot = errors.New("node: corrupt snapshot")

// A snapshot holds every record of a node and, per shard, the sequence number
// of the last send it includes, so that a restart loads it and replays only
// the WAL from the position it names. Files are named "%016x.snap" after the
// WAL segment replay starts at, and written atomically (wal.WriteFileAtomic).
// A file is a series of sections, each framed
//
//	| kind u8 | size u32 | crc u32 = CRC-32C(kind + body) | body (size bytes) |
//
// little-endian, in this order:
//
//	header   "FRQSNAP2", created unix ms u64, replay position: segment u64, offset u64
//	domain   name length u16, name, shards u32 (once per domain)
//	shard    shard u32, seq u64, records u32, then each: key u64, length u16, record;
//	         then request ids u32, then each: mixed key u64, decision time u64
//	         (once per shard of the domain before it)
//	end      domains u32, shards u32, records u64
//
// A missing end section means a truncated file.
const (
	snapMagic         = "FRQSNAP2"
	snapMagicV1       = "FRQSNAP1" // no request ids; still read
	secHeader   uint8 = 1
	secDomain   uint8 = 2
	secShard    uint8 = 3
	secEnd      uint8 = 4
	maxSection        = 1 << 30
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

// sectionWriter frames sections onto w.
type sectionWriter struct {
	w   *bufio.Writer
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

// writeSnapshot writes every record of every domain to dir as the snapshot
// whose replay starts at from, locking one shard at a time.
func (n *Node) writeSnapshot(dir string, from wal.Position, nowMs int64) (snapshotStats, error) {
	var st snapshotStats
	err := wal.WriteFileAtomic(dir, snapName(from.Seq), func(w io.Writer) error {
		cw := &countingWriter{w: w}
		sw := sectionWriter{w: bufio.NewWriterSize(cw, 1<<20)}
		body := binary.LittleEndian.AppendUint64([]byte(snapMagic), uint64(nowMs))
		body = binary.LittleEndian.AppendUint64(body, from.Seq)
		body = binary.LittleEndian.AppendUint64(body, uint64(from.Offset))
		if err := sw.section(secHeader, body); err != nil {
			return err
		}
		var shards uint32
		var buf []byte
		for _, name := range n.cfg.Rules.names {
			s := n.domains[name].store
			body = binary.LittleEndian.AppendUint16(body[:0], uint16(len(name)))
			body = append(body, name...)
			body = binary.LittleEndian.AppendUint32(body, uint32(len(s.shards)))
			if err := sw.section(secDomain, body); err != nil {
				return err
			}
			for i := range s.shards {
				var cnt int64
				buf, cnt = s.dumpShard(i, buf[:0])
				st.Records += cnt
				if err := sw.section(secShard, buf); err != nil {
					return err
				}
				shards++
			}
		}
		body = binary.LittleEndian.AppendUint32(body[:0], uint32(len(n.cfg.Rules.names)))
		body = binary.LittleEndian.AppendUint32(body, shards)
		body = binary.LittleEndian.AppendUint64(body, uint64(st.Records))
		if err := sw.section(secEnd, body); err != nil {
			return err
		}
		if err := sw.w.Flush(); err != nil {
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

// dumpShard appends shard i's section body to buf: its number, sequence
// number and records. It holds the shard's lock while it copies.
func (st *store) dumpShard(i int, buf []byte) ([]byte, int64) {
	sh := &st.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	buf = binary.LittleEndian.AppendUint32(buf, uint32(i))
	buf = binary.LittleEndian.AppendUint64(buf, sh.seq)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(sh.records))
	t := &sh.index
	for pos := range t.len {
		k := t.key(pos)
		if k == 0 {
			continue
		}
		r := t.ref(pos)
		rec := sh.slabs[r.class()].bytes(r.slot())
		buf = binary.LittleEndian.AppendUint64(buf, k)
		buf = binary.LittleEndian.AppendUint16(buf, uint16(len(rec)))
		buf = append(buf, rec...)
	}
	buf = binary.LittleEndian.AppendUint32(buf, uint32(sh.ids.len()))
	for _, gen := range []map[uint64]int64{sh.ids.prev, sh.ids.cur} {
		for k, at := range gen {
			buf = binary.LittleEndian.AppendUint64(buf, k)
			buf = binary.LittleEndian.AppendUint64(buf, uint64(at))
		}
	}
	return buf, sh.records
}

// snapshotState is what a loaded snapshot says about the WAL.
type snapshotState struct {
	file    string
	from    wal.Position         // replay the WAL from here
	created int64                // unix ms
	seqs    map[string]shardSeqs // per domain: the sequence number each shard's records include
	stats   snapshotStats
}

// shardSeqs are a domain's shard sequence numbers in a snapshot, and how
// keys mapped to those shards.
type shardSeqs struct {
	shift uint
	seq   []uint64
}

// covered reports whether the send with key and seq is already in the snapshot.
func (s *snapshotState) covered(domain string, key, seq uint64) bool {
	ss, ok := s.seqs[domain]
	if !ok {
		return false
	}
	return seq <= ss.seq[storedKey(key)>>ss.shift]
}

// loadSnapshot loads path into the node's stores, skipping records whose
// newest send is at or before their domain's longest window before nowMs.
func (n *Node) loadSnapshot(path string, nowMs int64) (*snapshotState, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	ss := &snapshotState{file: path, seqs: map[string]shardSeqs{}}
	bad := func(off int64, format string, args ...any) error {
		return fmt.Errorf("%w: %s offset %d: %s", ErrCorruptSnapshot, path, off, fmt.Sprintf(format, args...))
	}
	// Shard sections load in parallel: one reader (this goroutine: I/O and
	// CRC), and a worker per core inserting records, each shard by one.
	work := make(chan shardWork, 4)
	var (
		loadErr error
		errOnce sync.Once
		records atomic.Int64
		skipped atomic.Int64
		workers sync.WaitGroup
		bodies  sync.Pool
	)
	for range max(1, runtime.GOMAXPROCS(0)) {
		workers.Go(func() {
			for w := range work {
				r, k, err := w.load(nowMs)
				records.Add(r)
				skipped.Add(k)
				if err != nil {
					errOnce.Do(func() { loadErr = fmt.Errorf("%w: %s offset %d: %v", ErrCorruptSnapshot, path, w.off, err) })
				}
				bodies.Put(w.body)
			}
		})
	}
	finish := func() error {
		close(work)
		workers.Wait()
		ss.stats.Records, ss.stats.Skipped = ss.stats.Records+records.Load(), ss.stats.Skipped+skipped.Load()
		return loadErr
	}
	var (
		off      int64
		hdr      [9]byte
		body     []byte
		domain   *domainState
		dname    string
		shards   uint32
		sawEnd   bool
		withIDs  bool
		nSecs    int
		sections uint32
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
		body = slices.Grow(body[:0], int(size))[:size]
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, bad(off, "section of %d bytes cut short (%v)", size, err)
		}
		crc := crc32.Update(crc32.Update(0, crcTable, hdr[:1]), crcTable, body)
		if want := binary.LittleEndian.Uint32(hdr[5:]); crc != want {
			return nil, bad(off, "crc %08x, want %08x", crc, want)
		}
		if nSecs == 0 && kind != secHeader {
			return nil, bad(off, "first section is of kind %d, not a header", kind)
		}
		br := walReader{b: body}
		switch kind {
		case secHeader:
			magic := string(br.take(8))
			if nSecs != 0 || (magic != snapMagic && magic != snapMagicV1) {
				return nil, bad(off, "misplaced header or unknown format")
			}
			withIDs = magic != snapMagicV1
			ss.created = int64(br.u64())
			ss.from = wal.Position{Seq: br.u64(), Offset: int64(br.u64())}
		case secDomain:
			dname = string(br.take(uint64(br.u64n(2))))
			shards = uint32(br.u64n(4))
			if shards == 0 || shards&(shards-1) != 0 || shards > 1<<16 {
				return nil, bad(off, "domain %q has %d shards", dname, shards)
			}
			domain = n.domains[dname]
			ss.seqs[dname] = shardSeqs{shift: uint(64 - bits.Len(uint(shards-1))), seq: make([]uint64, shards)}
		case secShard:
			if dname == "" {
				return nil, bad(off, "shard section before any domain")
			}
			i := uint32(br.u64n(4))
			seq := br.u64()
			if i >= shards {
				return nil, bad(off, "shard %d of %d", i, shards)
			}
			ss.seqs[dname].seq[i] = seq
			// Workers insert the records while the next sections are read.
			buf, _ := bodies.Get().(*[]byte)
			if buf == nil {
				buf = new([]byte)
			}
			*buf = append((*buf)[:0], br.b...)
			br.b = nil
			work <- shardWork{domain: domain, shards: shards, i: int(i), body: buf, off: off, withIDs: withIDs}
			sections++
		case secEnd:
			if want := uint32(br.u64n(4)); want != uint32(len(ss.seqs)) || uint32(br.u64n(4)) != sections {
				return nil, bad(off, "end section counts %d domains, read %d", want, len(ss.seqs))
			}
			sawEnd = true
		default:
			return nil, bad(off, "unknown section kind %d", kind)
		}
		if br.err != nil {
			return nil, bad(off, "section of kind %d: %v", kind, br.err)
		}
		off += int64(len(hdr)) + int64(size)
		nSecs++
	}
	finished = true
	if err := finish(); err != nil {
		return nil, err
	}
	ss.stats.Bytes = off
	return ss, nil
}

// shardWork is one shard section of a snapshot, for a loading worker.
type shardWork struct {
	domain  *domainState // nil: a domain the rules no longer have
	shards  uint32       // the snapshot's shard count for the domain
	i       int          // the section's shard
	body    *[]byte      // the section after its shard number and sequence number
	off     int64        // the section's offset in the file, for errors
	withIDs bool
}

// load inserts the records and request ids of the section, skipping records
// idle at nowMs; it returns how many it loaded and skipped.
func (w shardWork) load(nowMs int64) (records, skipped int64, err error) {
	br := walReader{b: *w.body}
	count := br.u64n(4)
	// Check the count against the bytes before reserving room for it: a
	// record takes at least 10 bytes (key and length).
	if count > uint64(len(br.b))/10 {
		return 0, 0, fmt.Errorf("shard %d: %d records in %d bytes", w.i, count, len(br.b))
	}
	sameLayout := w.domain != nil && len(w.domain.store.shards) == int(w.shards)
	if sameLayout {
		w.domain.store.reserve(w.i, int(count))
	}
	for range count {
		key := br.u64()
		rec := br.take(br.u64n(2))
		if br.err != nil {
			break
		}
		if w.domain == nil {
			skipped++
			continue
		}
		loaded, err := w.domain.store.load(key, rec, nowMs-w.domain.d.Longest())
		if err != nil {
			return records, skipped, fmt.Errorf("shard %d: %v", w.i, err)
		}
		if loaded {
			records++
		} else {
			skipped++
		}
	}
	if w.withIDs {
		// Ids live in their recipient's shard, which only a store of the
		// same layout can tell: after a reshard they are dropped.
		ids := br.u64n(4)
		if ids > uint64(len(br.b))/16 {
			return records, skipped, fmt.Errorf("shard %d: %d request ids in %d bytes", w.i, ids, len(br.b))
		}
		for range ids {
			k, at := br.u64(), int64(br.u64())
			if br.err == nil && sameLayout {
				w.domain.store.loadID(w.i, k, at, nowMs)
			}
		}
	}
	if br.err != nil {
		return records, skipped, fmt.Errorf("shard %d: %v", w.i, br.err)
	}
	if len(br.b) != 0 {
		return records, skipped, fmt.Errorf("shard %d: %d bytes after its last id", w.i, len(br.b))
	}
	return records, skipped, nil
}

// loadID remembers in shard i a request id (mixed with its recipient's key:
// idKey) decided at at, if it is still inside the horizon at now (unix ms).
func (st *store) loadID(i int, k uint64, at, now int64) {
	if now-at >= st.idHorizon {
		return
	}
	sh := &st.shards[i]
	sh.mu.Lock()
	sh.ids.put(k, at, now, st.idHorizon, st.idCap)
	sh.mu.Unlock()
}

// reserve makes room in shard i's index for n more records.
func (st *store) reserve(i, n int) {
	sh := &st.shards[i]
	sh.mu.Lock()
	sh.index.reserve(n)
	sh.mu.Unlock()
}

// load adds rec as a new record of key unless its newest send is at or
// before cutoff (unix ms), and reports whether it did. A snapshot holds each
// (key, tag) once, and the store was empty: no lookup is needed.
func (st *store) load(key uint64, rec []byte, cutoff int64) (bool, error) {
	newest, err := window.RecordNewest(rec)
	if err != nil {
		return false, err
	}
	if newest <= cutoff {
		return false, nil
	}
	key = storedKey(key)
	sh := st.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return true, sh.put(key, -1, rec, false)
}
