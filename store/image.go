package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/freqring/freqring/window"
)

// ErrBadImage reports partition image bytes that AppendImage did not write.
var ErrBadImage = errors.New("store: bad partition image")

// A partition image is every record and request id of one partition, for
// snapshots and for moving a partition to another node. Layout,
// little-endian:
//
//	version     u8   1 to ImageVersion
//	partition   u32  the partition's number
//	partitions  u32  the store's partition count
//	seq         u64  the partition's sequence number when the image was taken
//	domains     u16  count, then each:
//	  name      u16 length, bytes
//	  records   u32 count, then each: key u64, length u16, record (window's
//	            record format v in version v: 3 adds the counting
//	            algorithms' states, 2 and 1 are read from older releases)
//	  ids       u32 count, then each: mixed key u64 (id ^ key*φ), decision time u64 (unix ms)
//
// An image carries no request id whose send was refunded (taken back, or
// marked unconfirmed): to the store that merges it such an id is unknown,
// so a new attempt under it is decided afresh and a repeated refund of it
// fails as unknown, as on the store that wrote the image. Carried as
// recorded, a retry would be answered as admitted and sent uncounted, and
// a repeated refund would take back a send it never recorded.
//
// An image has no checksum of its own: it travels inside framed, checksummed
// containers (snapshot sections, peer messages). Versions may only be added;
// MergeImage reads every version, and AppendImageVersion writes any, for
// peers that read nothing newer.
const ImageVersion = 3

// AppendImage appends partition p's image to dst and returns it with the
// number of records it holds. It holds p's lock while it copies.
func (s *Store) AppendImage(dst []byte, p int) ([]byte, int64) {
	dst, n, _ := s.appendImage(dst, p, false, ImageVersion) // the current version cannot fail
	return dst, n
}

// AppendImageVersion is AppendImage writing image version v (1 to
// ImageVersion), with close as in CloseAndAppendImage. An older version
// rewrites every record in its record format, for peers of an older
// binary; a record holding counter states (rules of the counting
// algorithms, which no older release can load) cannot be rewritten, and
// the call fails wrapping window.ErrNeedsFormat3, leaving dst and the
// partition as they were.
func (s *Store) AppendImageVersion(dst []byte, p int, close bool, v int) ([]byte, int64, error) {
	if v < 1 || v > ImageVersion {
		return dst, 0, fmt.Errorf("store: image version %d, not 1 to %d", v, ImageVersion)
	}
	return s.appendImage(dst, p, close, v)
}

// CloseAndAppendImage closes partition p (see Close) and appends its image
// to dst, under one hold of its lock: no check is decided between the two,
// so the image holds every send the partition admitted.
func (s *Store) CloseAndAppendImage(dst []byte, p int) ([]byte, int64) {
	dst, n, _ := s.appendImage(dst, p, true, ImageVersion) // the current version cannot fail
	return dst, n
}

// recordFormat returns the window record format of image version v: the
// two numbers have moved together so far.
func recordFormat(v int) int { return v }

// imageAhead is how many index entries ahead of the one it copies
// appendImage prefetches slots.
const imageAhead = 16

func (s *Store) appendImage(dst []byte, p int, close bool, v int) ([]byte, int64, error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	start := len(dst)
	dst = append(dst, byte(v))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(p))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s.parts)))
	dst = binary.LittleEndian.AppendUint64(dst, pt.seq)
	var n uint16
	ids := make([]int, len(pt.spaces)) // per domain: the ids the image carries
	for i, sp := range pt.spaces {
		if sp != nil {
			for range sp.ids.unrefunded {
				ids[i]++
			}
		}
		if sp != nil && (sp.records > 0 || ids[i] > 0) {
			n++
		}
	}
	dst = binary.LittleEndian.AppendUint16(dst, n)
	var records int64
	for id, sp := range pt.spaces {
		if sp == nil || (sp.records == 0 && ids[id] == 0) {
			continue
		}
		name := s.domainName(id)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
		dst = append(dst, name...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(sp.records))
		t := &sp.index
		for pos := range t.len {
			// The entries are in home order, their slots anywhere in the
			// partition's slabs: prefetch those some entries ahead.
			if a := pos + imageAhead; a < t.len && t.key(a) != 0 {
				sp.prefetchSlot(t.ref(a))
			}
			k := t.key(pos)
			if k == 0 {
				continue
			}
			r := t.ref(pos)
			rec := sp.slabs[r.class()].bytes(r.slot()) // the whole slot: a record ignores bytes after it
			if f := recordFormat(v); f != window.RecordFormat {
				// The slot held a record this store wrote: it decodes, and
				// fails only for counter states format f cannot carry.
				var err error
				if rec, err = window.ConvertRecord(&pt.scratch, rec, window.RecordFormat, f); err != nil {
					return dst[:start], 0, fmt.Errorf("store: partition %d, domain %q: image version %d: %w", p, name, v, err)
				}
			}
			dst = binary.LittleEndian.AppendUint64(dst, k)
			dst = binary.LittleEndian.AppendUint16(dst, uint16(len(rec)))
			dst = append(dst, rec...)
		}
		records += sp.records
		dst = binary.LittleEndian.AppendUint32(dst, uint32(ids[id]))
		for e := range sp.ids.unrefunded {
			dst = binary.LittleEndian.AppendUint64(dst, e.key)
			dst = binary.LittleEndian.AppendUint64(dst, uint64(e.at))
		}
	}
	if close {
		pt.closed = true
	}
	return dst, records, nil
}

// ImageHeader is what an image says about itself.
type ImageHeader struct {
	Version    int    // the image's version: 1 to ImageVersion
	Partition  int    // the partition the image was taken of
	Partitions int    // the partition count of the store it was taken from
	Seq        uint64 // that partition's sequence number then
}

// MergeStats count what MergeImage did.
type MergeStats struct {
	Records       int64 // records added or merged
	Merged        int64 // of Records, merged into a record already here
	Idle          int64 // records skipped: their newest send was outside every window
	UnknownDomain int64 // records of a domain bind did not know
	// Unknown holds UnknownDomain by domain name; nil when there are none.
	Unknown    map[string]int64
	IDs        int64 // request ids remembered
	DroppedIDs int64 // request ids dropped: taken under another partition count, or past the horizon
}

// MergeImage merges an image into the store as a set union of sends: a
// recipient that has a record here gets the union of both records'
// (window.Domain.Merge); one that has none gets the image's record. Records
// whose newest send is at or before now minus their domain's longest window
// are skipped. bind resolves a domain name to its Ref; records of names it
// does not know are skipped and counted. The partition's sequence number is
// raised to the image's.
//
// An image taken under another partition count is spread by key over this
// store's partitions; its request ids, which cannot be placed, are dropped
// and counted.
//
// The image is checked whole before anything changes: a malformed one
// returns an error wrapping ErrBadImage and changes nothing. A record that
// fails to merge (window.ErrCorruptRecord, window.ErrFull) stops the merge
// there, with the records before it merged.
func (s *Store) MergeImage(img []byte, now int64, bind func(name string) (Ref, bool)) (ImageHeader, MergeStats, error) {
	var ms MergeStats
	h, err := CheckImage(img)
	if err != nil {
		return h, ms, err
	}
	sameLayout := h.Partitions == len(s.parts)
	r := imageReader{b: img[imageHeaderLen:]}
	nd := int(r.u16())
	for range nd {
		name := string(r.take(int(r.u16())))
		ref, known := bind(name)
		nrec := int(r.u32())
		start := r.b
		for range nrec {
			r.record()
		}
		recs := start[:len(start)-len(r.b)]
		nid := int(r.u32())
		ids := r.take(16 * nid)
		if !known {
			ms.UnknownDomain += int64(nrec)
			if nrec > 0 {
				if ms.Unknown == nil {
					ms.Unknown = map[string]int64{}
				}
				ms.Unknown[name] += int64(nrec)
			}
			ms.DroppedIDs += int64(nid)
			continue
		}
		cutoff := now - ref.rules.Longest()
		if sameLayout {
			err = s.mergeRecords(h.Partition, ref, recs, nrec, cutoff, recordFormat(h.Version), &ms)
			if err == nil {
				s.mergeIDs(h.Partition, ref, ids, now, &ms)
			}
		} else {
			err = s.spreadRecords(ref, recs, nrec, cutoff, recordFormat(h.Version), &ms)
			ms.DroppedIDs += int64(nid)
		}
		if err != nil {
			return h, ms, err
		}
	}
	if sameLayout {
		s.RaiseSeq(h.Partition, h.Seq)
	} else {
		for p := range s.parts {
			s.RaiseSeq(p, h.Seq)
		}
	}
	return h, ms, nil
}

const imageHeaderLen = 1 + 4 + 4 + 8

// CheckImage checks the structure of img (every length, count and record
// header) and returns its header. A nil error means MergeImage will not
// refuse it as malformed.
func CheckImage(img []byte) (ImageHeader, error) {
	var h ImageHeader
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadImage, fmt.Sprintf(format, args...))
	}
	if len(img) < imageHeaderLen+2 {
		return h, bad("%d bytes, shorter than a header", len(img))
	}
	if v := img[0]; v < 1 || v > ImageVersion {
		return h, bad("version %d, this store reads 1 to %d", v, ImageVersion)
	}
	h.Version = int(img[0])
	h.Partition = int(binary.LittleEndian.Uint32(img[1:]))
	h.Partitions = int(binary.LittleEndian.Uint32(img[5:]))
	h.Seq = binary.LittleEndian.Uint64(img[9:])
	if h.Partitions < 1 || h.Partitions > MaxPartitions || h.Partition >= h.Partitions {
		return h, bad("partition %d of %d", h.Partition, h.Partitions)
	}
	r := imageReader{b: img[imageHeaderLen:]}
	nd := int(r.u16())
	for d := range nd {
		name := r.take(int(r.u16()))
		if r.err == nil && len(name) == 0 {
			return h, bad("domain %d has an empty name", d)
		}
		nrec := uint64(r.u32())
		if nrec > uint64(len(r.b))/10 { // a record takes at least 10 bytes
			return h, bad("domain %q: %d records in %d bytes", name, nrec, len(r.b))
		}
		for i := range nrec {
			r.u64()
			n := int(r.u16())
			rec := r.take(n)
			if r.err != nil {
				return h, bad("domain %q record %d: %v", name, i, r.err)
			}
			if n == 0 || n > window.MaxRecordBytes {
				return h, bad("domain %q record %d: %d bytes", name, i, n)
			}
			if _, err := window.RecordNewest(rec); err != nil {
				return h, bad("domain %q record %d: %v", name, i, err)
			}
		}
		nid := uint64(r.u32())
		if nid > uint64(len(r.b))/16 {
			return h, bad("domain %q: %d request ids in %d bytes", name, nid, len(r.b))
		}
		r.take(int(16 * nid))
		if r.err != nil {
			return h, bad("domain %d: %v", d, r.err)
		}
	}
	if r.err != nil {
		return h, bad("%v", r.err)
	}
	if len(r.b) != 0 {
		return h, bad("%d bytes after the last domain", len(r.b))
	}
	return h, nil
}

// mergeAhead is how many records ahead of the one it merges mergeRecords
// prefetches index entries: enough misses in flight to cover one's latency
// with the work of merging the records between.
const mergeAhead = 16

// mergeRecords merges n checked records (key, length, bytes) into partition
// p's space of ref. Into an empty space they go straight in: an image holds
// each (key, tag) once.
func (s *Store) mergeRecords(p int, ref Ref, recs []byte, n int, cutoff int64, format int, ms *MergeStats) error {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	sp := pt.space(ref.id, true)
	fresh := sp.records == 0
	sp.index.reserve(n)
	r := imageReader{b: recs}
	// ahead reads mergeAhead records in front of r, whose index entries it
	// prefetches: entries go in at random positions of a table larger than
	// the CPU's caches, so each insert would otherwise wait for a miss.
	ahead := imageReader{b: recs}
	for range min(n, mergeAhead) {
		sp.index.prefetchHome(storedKey(ahead.record()))
	}
	for i := range n {
		if i+mergeAhead < n {
			sp.index.prefetchHome(storedKey(ahead.record()))
		}
		key := storedKey(r.u64())
		rec := r.take(int(r.u16()))
		if err := s.mergeOne(pt, sp, ref, key, rec, cutoff, format, fresh, ms); err != nil {
			return fmt.Errorf("store: partition %d domain %q: %w", p, ref.rules.Name(), err)
		}
	}
	return nil
}

// spreadRecords merges n checked records into the partitions their keys
// fall in under this store's partition count.
func (s *Store) spreadRecords(ref Ref, recs []byte, n int, cutoff int64, format int, ms *MergeStats) error {
	r := imageReader{b: recs}
	for range n {
		key := storedKey(r.u64())
		rec := r.take(int(r.u16()))
		p := s.PartitionOf(key)
		pt := &s.parts[p]
		pt.mu.Lock()
		err := s.mergeOne(pt, pt.space(ref.id, true), ref, key, rec, cutoff, format, false, ms)
		pt.mu.Unlock()
		if err != nil {
			return fmt.Errorf("store: partition %d domain %q: %w", p, ref.rules.Name(), err)
		}
	}
	return nil
}

// mergeOne merges one record, in window record format format, under its
// partition's lock. With fresh, the space held nothing when the merge began
// and no lookup is needed.
func (s *Store) mergeOne(pt *partition, sp *space, ref Ref, key uint64, rec []byte, cutoff int64, format int, fresh bool, ms *MergeStats) error {
	newest, err := window.RecordNewest(rec)
	if err != nil {
		return err
	}
	if newest <= cutoff {
		ms.Idle++
		return nil
	}
	if format != window.RecordFormat {
		c, err := window.ConvertRecord(&pt.scratch, rec, format, window.RecordFormat)
		if err != nil {
			return err
		}
		pt.conv = append(pt.conv[:0], c...)
		rec = pt.conv
	}
	if fresh {
		ms.Records++
		return sp.put(key, -1, rec, false, false)
	}
	tag := window.RecordTag(rec)
	pos, old, other := sp.lookup(key, tag)
	if pos >= 0 {
		out, err := ref.rules.Merge(&pt.scratch, old, rec)
		if err != nil {
			return err
		}
		ms.Records++
		ms.Merged++
		if out == nil { // nothing left inside any window
			return nil
		}
		return sp.put(key, pos, out, false, false)
	}
	ms.Records++
	return sp.put(key, -1, rec, other, false)
}

// MergeRecord merges rec, a record of domain r for key hash key, into
// partition p as MergeImage merges an image's record: a set union with the
// record there, if any. A record whose newest send is at or before now minus
// the domain's longest window is skipped (merged reports false).
func (s *Store) MergeRecord(p int, r Ref, key uint64, rec []byte, now int64) (merged bool, err error) {
	if _, err := window.RecordNewest(rec); err != nil {
		return false, err
	}
	var ms MergeStats
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	err = s.mergeOne(pt, pt.space(r.id, true), r, storedKey(key), rec, now-r.rules.Longest(), window.RecordFormat, false, &ms)
	return ms.Records > 0, err
}

// mergeIDs remembers, in partition p, the request ids (16 bytes each) that
// are still inside the horizon at now.
func (s *Store) mergeIDs(p int, ref Ref, ids []byte, now int64, ms *MergeStats) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	sp := pt.space(ref.id, true)
	for len(ids) >= 16 {
		k, at := binary.LittleEndian.Uint64(ids), int64(binary.LittleEndian.Uint64(ids[8:]))
		ids = ids[16:]
		if now-at >= s.idHorizon {
			ms.DroppedIDs++
			continue
		}
		if _, ok := sp.ids.get(k, now, s.idHorizon); !ok {
			sp.ids.put(k, at, idPrint{}, now, s.idHorizon, s.idCap) // images carry no print
		}
		ms.IDs++
	}
}

// Drop removes every record and request id of partition p and returns the
// number of records removed. Its sequence number is kept, so that sends it
// numbers later never reuse a number.
func (s *Store) Drop(p int) int64 {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var n int64
	for _, sp := range pt.spaces {
		if sp != nil {
			n += sp.records
			pt.mem.held.Add(-sp.heldBytes())
			for c := range sp.slabs {
				sp.slabs[c].held = nil // counted above
				sp.slabs[c].drop()
			}
			sp.index.free()
		}
	}
	pt.spaces = nil
	return n
}

// ForEach calls fn with every record of partition p: its domain, key hash
// and record bytes (its whole slot, which may run past the record; valid
// only during the call), under the partition's lock,
// until fn returns false. fn must not call the store.
func (s *Store) ForEach(p int, fn func(domain string, key uint64, rec []byte) bool) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for id, sp := range pt.spaces {
		if sp == nil {
			continue
		}
		name := s.domainName(id)
		t := &sp.index
		for pos := range t.len {
			// The entries are in home order, their slots anywhere in the
			// partition's slabs: prefetch those some entries ahead.
			if a := pos + imageAhead; a < t.len && t.key(a) != 0 {
				sp.prefetchSlot(t.ref(a))
			}
			k := t.key(pos)
			if k == 0 {
				continue
			}
			r := t.ref(pos)
			rec := sp.slabs[r.class()].bytes(r.slot())
			if !fn(name, k, rec) {
				return
			}
		}
	}
}

// imageReader consumes an image; the first error sticks and reads return 0.
type imageReader struct {
	b   []byte
	err error
}

func (r *imageReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("truncated %s", what)
	}
	r.b = nil
}

func (r *imageReader) u16() uint16 {
	if len(r.b) < 2 {
		r.fail("u16")
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *imageReader) u32() uint32 {
	if len(r.b) < 4 {
		r.fail("u32")
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *imageReader) u64() uint64 {
	if len(r.b) < 8 {
		r.fail("u64")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// record consumes one record (key, length, bytes) and returns its key.
func (r *imageReader) record() uint64 {
	key := r.u64()
	r.take(int(r.u16()))
	return key
}

func (r *imageReader) take(n int) []byte {
	if n < 0 || len(r.b) < n {
		r.fail("bytes")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// SplitImage returns img as images of at most maxBytes each, together
// holding exactly its records and request ids, each with img's header:
// merging them, in any order, is merging img, since MergeImage is a set
// union. A part exceeds maxBytes only if one record with its domain's header
// does (a record is at most window.MaxRecordBytes). An image that fits is
// returned as is. Peer messages and WAL records are bounded (16 MiB), and a
// partition of 100,000 recipients takes more. An error wraps ErrBadImage.
func SplitImage(img []byte, maxBytes int) ([][]byte, error) {
	if _, err := CheckImage(img); err != nil {
		return nil, err
	}
	if len(img) <= maxBytes {
		return [][]byte{img}, nil
	}
	sp := splitter{head: img[:imageHeaderLen], max: maxBytes}
	r := imageReader{b: img[imageHeaderLen:]}
	nd := int(r.u16())
	for range nd {
		sp.name = r.take(int(r.u16()))
		sp.ids, sp.cnt = false, -1
		nrec := int(r.u32())
		for range nrec {
			start := r.b
			r.record()
			sp.add(start[:len(start)-len(r.b)], true)
		}
		sp.endRecords()
		nid := int(r.u32())
		for range nid {
			sp.add(r.take(16), false)
		}
		sp.cnt = -1
	}
	sp.flush()
	return sp.parts, nil
}

// splitter builds the parts of SplitImage. The part being built is cur, its
// domain count at offset imageHeaderLen; within the open domain, cnt is the
// offset of the count (records or ids) being written.
type splitter struct {
	head  []byte
	max   int
	parts [][]byte
	cur   []byte
	name  []byte
	cnt   int  // offset in cur of the open count, -1 when no domain is open
	ids   bool // the open count is of ids (the records are closed)
}

// open starts a new part if there is none, and the domain in it if it is
// not open, with its records closed already when ids are being added.
func (sp *splitter) open() {
	if sp.cur == nil {
		sp.cur = append(append(make([]byte, 0, sp.max), sp.head...), 0, 0)
		sp.cnt = -1
	}
	if sp.cnt >= 0 {
		return
	}
	binary.LittleEndian.PutUint16(sp.cur[imageHeaderLen:], binary.LittleEndian.Uint16(sp.cur[imageHeaderLen:])+1)
	sp.cur = binary.LittleEndian.AppendUint16(sp.cur, uint16(len(sp.name)))
	sp.cur = append(sp.cur, sp.name...)
	if sp.ids {
		sp.cur = binary.LittleEndian.AppendUint32(sp.cur, 0) // no records in this part
	}
	sp.cnt = len(sp.cur)
	sp.cur = binary.LittleEndian.AppendUint32(sp.cur, 0)
}

// add appends one record (key, length, bytes) or id (16 bytes), starting a
// new part first if it would not fit with what opens and closes its domain.
func (sp *splitter) add(item []byte, record bool) {
	need := len(item)
	if record {
		need += 4 // the ids count that closes the domain
	}
	if sp.cnt < 0 {
		need += 2 + len(sp.name) + 4
		if sp.ids {
			need += 4
		}
	}
	if sp.cur != nil && len(sp.cur)+need > sp.max {
		sp.closePart()
	}
	sp.open()
	sp.cur = append(sp.cur, item...)
	binary.LittleEndian.PutUint32(sp.cur[sp.cnt:], binary.LittleEndian.Uint32(sp.cur[sp.cnt:])+1)
}

// endRecords closes the domain's records, in the part being built if the
// domain is open there, and makes what follows ids.
func (sp *splitter) endRecords() {
	if sp.cnt >= 0 {
		sp.cnt = len(sp.cur)
		sp.cur = binary.LittleEndian.AppendUint32(sp.cur, 0)
	}
	sp.ids = true
}

// closePart finishes the part being built: a domain open in it gets an
// empty ids count if its records are still open.
func (sp *splitter) closePart() {
	if sp.cnt >= 0 && !sp.ids {
		sp.cur = binary.LittleEndian.AppendUint32(sp.cur, 0)
	}
	sp.parts = append(sp.parts, sp.cur)
	sp.cur, sp.cnt = nil, -1
}

func (sp *splitter) flush() {
	if sp.cur != nil {
		sp.closePart()
	}
}
