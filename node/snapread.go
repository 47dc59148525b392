package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
)

// This file reads snapshots back: a section reader for either framing, the
// load (loadSnapshot), with a reader per format (loadPartitions for formats
// 3 and 4, loadLegacy for formats 1 and 2), and the check of a snapshot
// just written (verifySnapshot).

// sectionReader reads the sections of a snapshot from r: in wal's framing
// (format 4) or in the one formats 1 to 3 wrote (kind u8 | size u32 |
// crc u32 | body), which the first byte tells apart (a format 4 file starts
// with its header's size, at least 36; an older one with the header's kind,
// 1). off is the offset of the next section. It is used by one goroutine.
type sectionReader struct {
	r          io.Reader
	path       string
	walFraming bool
	off        int64 // the offset of the next section
	cur        int64 // the offset of the section next read last
	started    bool
}

// next reads the next section into buf (grown as needed; body is a
// sub-slice of the buf it returns). It returns io.EOF at the end of the
// file, before any byte of a section, and ErrCorruptSnapshot, naming the
// file and offset, for a section cut short or damaged.
func (s *sectionReader) next(buf []byte) (kind byte, body, newBuf []byte, err error) {
	s.cur = s.off
	r := s.r
	if !s.started {
		s.started = true
		var first [1]byte
		if _, err := io.ReadFull(s.r, first[:]); err != nil {
			return 0, nil, buf, s.bad("no header section (%v)", err)
		}
		s.walFraming = first[0] != secHeader
		r = io.MultiReader(bytes.NewReader(first[:]), s.r)
	}
	if s.walFraming {
		kind, body, buf, err = wal.ReadFrameFrom(r, buf, maxSection)
	} else {
		kind, body, buf, err = readOldSection(r, buf)
	}
	switch {
	case err == io.EOF:
		return 0, nil, buf, io.EOF
	case err != nil:
		return 0, nil, buf, s.bad("%v", err)
	}
	s.off += wal.FrameHeaderLen + int64(len(body))
	return kind, body, buf, nil
}

// bad returns ErrCorruptSnapshot naming the file and the offset of the
// section read last.
func (s *sectionReader) bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s offset %d: %s", ErrCorruptSnapshot, s.path, s.cur, fmt.Sprintf(format, args...))
}

// readOldSection reads one section of the framing formats 1 to 3 wrote:
// kind u8 | size u32 | crc u32 = CRC-32C(kind + body) | body.
func readOldSection(r io.Reader, buf []byte) (kind byte, body, newBuf []byte, err error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return 0, nil, buf, io.EOF
		}
		return 0, nil, buf, fmt.Errorf("section header cut short (%v)", err)
	}
	kind, size := hdr[0], binary.LittleEndian.Uint32(hdr[1:])
	if size > maxSection {
		return 0, nil, buf, fmt.Errorf("section of %d bytes", size)
	}
	buf = slices.Grow(buf[:0], int(size))[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, buf, fmt.Errorf("section of %d bytes cut short (%v)", size, err)
	}
	crc := crc32.Update(crc32.Update(0, wal.Castagnoli, hdr[:1]), wal.Castagnoli, buf)
	if want := binary.LittleEndian.Uint32(hdr[5:]); crc != want {
		return 0, nil, buf, fmt.Errorf("crc %08x, want %08x", crc, want)
	}
	return kind, buf, buf, nil
}

// snapshotHeader is a snapshot's header section, read.
type snapshotHeader struct {
	format  int // 1 to 4
	created int64
	from    wal.Position
	parts   uint64 // formats 3 and 4
}

// readHeader reads a snapshot's first section, its header.
func readHeader(s *sectionReader) (snapshotHeader, error) {
	var h snapshotHeader
	kind, body, _, err := s.next(nil)
	if err == io.EOF {
		return h, s.bad("no header section")
	}
	if err != nil {
		return h, err
	}
	if kind != secHeader {
		return h, s.bad("first section is of kind %d, not a header", kind)
	}
	br := walReader{b: body}
	switch magic := string(br.take(8)); {
	case magic == snapMagic:
		h.format = 4
	case magic == snapMagicV3:
		h.format = 3
	case magic == snapMagicV2:
		h.format = 2
	case magic == snapMagicV1:
		h.format = 1
	default:
		return h, s.bad("unknown format %q", magic)
	}
	if (h.format == 4) != s.walFraming {
		return h, s.bad("a format %d header in the other format's framing", h.format)
	}
	h.created = int64(br.u64())
	h.from = wal.Position{Seq: br.u64(), Offset: int64(br.u64())}
	if h.format >= 3 {
		h.parts = br.u64n(4)
	}
	if br.err != nil {
		return h, s.bad("header: %v", br.err)
	}
	return h, nil
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
	s := &sectionReader{r: r, path: path}
	h, err := readHeader(s)
	if err != nil {
		return nil, err
	}
	ss := &snapshotState{file: path, created: h.created, from: h.from}
	ld := n.newSnapshotLoader(ss, nowMs)
	if h.format >= 3 {
		err = ld.loadPartitions(s, f, h)
	} else {
		err = ld.loadLegacy(s, f, h.format)
	}
	if lerr := ld.finish(); err == nil {
		err = lerr
	}
	if err != nil {
		return nil, err
	}
	ss.stats.Bytes = s.off
	return ss, nil
}

// snapshotLoader merges a snapshot's partition images into the store with a
// worker per core, while its sections are read.
type snapshotLoader struct {
	n       *Node
	ss      *snapshotState
	work    chan imageWork
	workers sync.WaitGroup
	bodies  sync.Pool  // *[]byte: section buffers, back from the workers
	mu      sync.Mutex // guards err and ss.unknown
	err     error      // the first merge's error
	records atomic.Int64
	skipped atomic.Int64
	dropped int64 // bytes from the start whose page cache is dropped
}

// imageWork is one partition image of a snapshot, for a loading worker.
type imageWork struct {
	img *[]byte
	off int64 // the section's offset in the file, for errors
}

// newSnapshotLoader starts the workers that merge ss's images at nowMs.
func (n *Node) newSnapshotLoader(ss *snapshotState, nowMs int64) *snapshotLoader {
	ld := &snapshotLoader{n: n, ss: ss, work: make(chan imageWork, 4)}
	v := n.view.Load()
	for range max(1, runtime.GOMAXPROCS(0)) {
		ld.workers.Go(func() {
			for w := range ld.work {
				_, ms, err := n.store.MergeImage(*w.img, nowMs, v.bindName)
				ld.records.Add(ms.Records)
				ld.skipped.Add(ms.Idle + ms.UnknownDomain)
				ld.mu.Lock()
				if ms.Unknown != nil {
					ss.unknown = addCounts(ss.unknown, ms.Unknown)
				}
				if err != nil && ld.err == nil {
					ld.err = fmt.Errorf("%w: %s offset %d: %v", ErrCorruptSnapshot, ss.file, w.off, err)
				}
				ld.mu.Unlock()
				ld.bodies.Put(w.img)
			}
		})
	}
	return ld
}

// buffer returns a section buffer, one a worker gave back if there is one.
func (ld *snapshotLoader) buffer() *[]byte {
	if buf, ok := ld.bodies.Get().(*[]byte); ok {
		return buf
	}
	return new([]byte)
}

// finish waits for the workers and returns the first merge's error.
func (ld *snapshotLoader) finish() error {
	close(ld.work)
	ld.workers.Wait()
	ld.ss.stats.Records += ld.records.Load()
	ld.ss.stats.Skipped += ld.skipped.Load()
	return ld.err
}

// advise drops from the page cache what the reads left there, every
// dropCachedStep bytes, and all of it at the end.
func (ld *snapshotLoader) advise(f *os.File, off int64, end bool) {
	if end || off-ld.dropped >= dropCachedStep {
		dropCached(f, ld.dropped, off-ld.dropped)
		ld.dropped = off
	}
}

// loadPartitions reads the sections of a format 3 or 4 snapshot after its
// header h: one partition image a partition, each handed to a worker, then
// the end section.
func (ld *snapshotLoader) loadPartitions(s *sectionReader, f *os.File, h snapshotHeader) error {
	if h.parts < 1 || h.parts > store.MaxPartitions {
		return s.bad("%d partitions", h.parts)
	}
	ss := ld.ss
	ss.parts = make([]uint64, h.parts)
	ss.resnap = int(h.parts) != ld.n.store.Partitions() || h.format != 4
	sections := 0
	for {
		body := ld.buffer()
		kind, b, buf, err := s.next(*body)
		*body = buf
		if err != nil {
			return s.endMissing(err)
		}
		off := s.cur
		switch kind {
		case secPartition:
			if len(b) < 17 { // version, partition, partitions, seq
				return s.bad("partition image of %d bytes", len(b))
			}
			p := binary.LittleEndian.Uint32(b[1:])
			if int(p) >= len(ss.parts) {
				return s.bad("partition %d of %d", p, len(ss.parts))
			}
			ss.parts[p] = binary.LittleEndian.Uint64(b[9:])
			*body = b
			// The worker takes the section's buffer as it is, rather than
			// a copy, and puts it back in bodies when done.
			ld.work <- imageWork{img: body, off: off}
			sections++
		case secEnd:
			br := walReader{b: b}
			if want := uint32(br.u64n(4)); want != uint32(sections) || int(want) != len(ss.parts) || br.err != nil {
				return s.bad("end section counts %d partitions, read %d of %d (%v)", want, sections, len(ss.parts), br.err)
			}
			ld.advise(f, s.off, true)
			return nil
		default:
			return s.bad("unknown section kind %d in a format %d snapshot", kind, h.format)
		}
		ld.advise(f, s.off, false)
	}
}

// loadLegacy reads the sections of a format 1 or 2 snapshot after its
// header: per domain, its shards, each handed to a worker as a partition
// image of its own (legacyImage), then the end section.
func (ld *snapshotLoader) loadLegacy(s *sectionReader, f *os.File, format int) error {
	ss := ld.ss
	ss.legacy = map[string]shardSeqs{}
	ss.resnap = true
	var (
		buf, image []byte
		dname      string
		shards     uint32
		sections   uint32
	)
	for {
		kind, b, nb, err := s.next(buf)
		buf = nb
		if err != nil {
			return s.endMissing(err)
		}
		br := walReader{b: b}
		switch kind {
		case secDomain:
			dname = string(br.take(uint64(br.u64n(2))))
			shards = uint32(br.u64n(4))
			if shards == 0 || shards&(shards-1) != 0 || shards > 1<<16 {
				return s.bad("domain %q has %d shards", dname, shards)
			}
			ss.legacy[dname] = shardSeqs{shift: uint(64 - bits.Len(uint(shards-1))), seq: make([]uint64, shards)}
		case secShard:
			if dname == "" {
				return s.bad("shard section before any domain")
			}
			i := uint32(br.u64n(4))
			seq := br.u64()
			if i >= shards {
				return s.bad("shard %d of %d", i, shards)
			}
			ss.legacy[dname].seq[i] = seq
			// The rest is a domain block of a partition image: records,
			// then (format 2) request ids. Under one image of a store of
			// partition count 1 that differs from this one's, MergeImage
			// spreads the records by key and drops the ids.
			image = legacyImage(image[:0], dname, br.b, format, ld.n.store.Partitions())
			br.b = nil
			img := ld.buffer()
			*img = append((*img)[:0], image...)
			ld.work <- imageWork{img: img, off: s.cur}
			sections++
		case secEnd:
			if want := uint32(br.u64n(4)); want != uint32(len(ss.legacy)) || uint32(br.u64n(4)) != sections {
				return s.bad("end section counts %d domains, read %d", want, len(ss.legacy))
			}
			ld.advise(f, s.off, true)
			return nil
		default:
			return s.bad("unknown section kind %d in a format %d snapshot", kind, format)
		}
		if br.err != nil {
			return s.bad("section of kind %d: %v", kind, br.err)
		}
		ld.advise(f, s.off, false)
	}
}

// endMissing is the error of a snapshot whose sections ended with err
// before the end section.
func (s *sectionReader) endMissing(err error) error {
	if errors.Is(err, io.EOF) {
		return s.bad("no end section (%v)", err)
	}
	return err
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

// verifySnapshot reads back a snapshot that this node just wrote (format
// 4), streaming, with direct I/O in chunks of chunk bytes (0: wal's default)
// where the file system allows it (the disk's bytes, not the page cache's),
// and checks every section's framing and crc, the partition count (parts),
// every partition image (store.CheckImage) and the end section, without
// loading anything. An error wraps ErrCorruptSnapshot and names the file
// and offset.
func verifySnapshot(path string, parts, chunk int) error {
	r, err := wal.OpenDirectChunk(path, chunk) // it reads ahead in chunks
	if err != nil {
		return err
	}
	defer r.Close()
	s := &sectionReader{r: r, path: path}
	h, err := readHeader(s)
	if err != nil {
		return err
	}
	if h.format != 4 || int(h.parts) != parts {
		return s.bad("a format %d header of %d partitions, want format 4 and %d", h.format, h.parts, parts)
	}
	var body []byte
	for sections := 0; ; {
		kind, b, buf, err := s.next(body)
		body = buf
		if err != nil {
			return s.endMissing(err)
		}
		switch kind {
		case secPartition:
			if _, err := store.CheckImage(b); err != nil {
				return s.bad("partition image: %v", err)
			}
			sections++
		case secEnd:
			if len(b) != 12 {
				return s.bad("end section of %d bytes", len(b))
			}
			if got := binary.LittleEndian.Uint32(b); int(got) != sections || sections != parts {
				return s.bad("end section counts %d partitions, read %d of %d", got, sections, parts)
			}
			if _, _, _, err := s.next(nil); err != io.EOF {
				return s.bad("bytes after the end section")
			}
			return nil
		default:
			return s.bad("unknown section kind %d", kind)
		}
	}
}
