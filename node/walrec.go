package node

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrBadPayload reports a WAL payload this node cannot decode.
var ErrBadPayload = errors.New("node: bad wal payload")

// A WAL payload holds the sends one Check recorded, so that a restarted node
// can rebuild its records. Layout (uvarint unless noted):
//
//	version   byte 1
//	base      unix ms of the first send
//	domains   count, then each: length, name bytes
//	sends     count, then each:
//	  domain  index into the domains above
//	  key     8 bytes LE: xxhash64 of the recipient
//	  tag     2 bytes LE: its CRC-32C tag
//	  seq     the send's sequence number in its shard
//	  at      zigzag varint: decision time - base, ms
//	  flags   byte: bit 0 = a content hash follows, bit 1 = a request id follows,
//	          bit 2 = a refund (version 3 on): the send at that time is taken back,
//	          bit 3 = unconfirmed (version 4 on): the send of this request id
//	          was not confirmed to its caller (its backup refused it), so a
//	          retry is decided afresh (store.Unconfirmed); nothing is counted
//	  content 8 bytes LE, if flagged
//	  id      8 bytes LE, if flagged (version 2 on)
//	  cost
//
// Fields may only be added under a new version; the decoder reads every
// version up to its own. A payload is written in version 2 unless it holds a
// refund (version 3) or an unconfirmed mark (version 4), so that a binary of
// an earlier release still reads everything but those (which it refuses by
// version rather than misread).
//
// A payload whose first byte is walImages instead holds partition images
// this node merged (taken over from a peer, or filled as a backup):
//
//	kind      byte 0x80
//	images    count, then each: length, a store image
//
// Replaying one merges the images again, which changes nothing that is
// already there (a merge is a set union).
const (
	walVersion = 4 // the newest version this node reads
	walImages  = 0x80
)

// decodeImages calls fn for each image of an image payload.
func decodeImages(p []byte, fn func(img []byte) error) error {
	r := walReader{b: p}
	if k := r.byte(); k != walImages {
		return fmt.Errorf("%w: kind %#x, not an image payload", ErrBadPayload, k)
	}
	cnt := r.uvarint()
	if r.err != nil {
		return fmt.Errorf("%w: %v", ErrBadPayload, r.err)
	}
	if cnt > uint64(len(p)) {
		return fmt.Errorf("%w: %d images in %d bytes", ErrBadPayload, cnt, len(p))
	}
	for i := range cnt {
		img := r.take(r.uvarint())
		if r.err != nil {
			return fmt.Errorf("%w: image %d: %v", ErrBadPayload, i, r.err)
		}
		if err := fn(img); err != nil {
			return err
		}
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the last image", ErrBadPayload, len(r.b))
	}
	return nil
}

func appendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

// walSend is one recorded send as the WAL keeps it.
type walSend struct {
	domain  string
	key     uint64
	tag     uint16
	seq     uint64
	at      int64 // unix ms
	content uint64
	cost    int
	id      uint64 // request id, 0 for none
	refund  bool   // takes back the send at at instead (MODE_REFUND)
	// unconfirmed marks the send of request id as not confirmed to its
	// caller instead (store.Unconfirmed): it counts nothing.
	unconfirmed bool
}

// walSendMinBytes is the fewest bytes a send takes in a payload: its domain
// index, key, tag, seq, time, flags and cost, each at its shortest.
const walSendMinBytes = 1 + 8 + 2 + 1 + 1 + 1 + 1

// walSendTypicalBytes is what a send with a content and a request id
// usually takes: the minimum, the two 8-byte fields and a few varint bytes
// more.
const walSendTypicalBytes = walSendMinBytes + 8 + 8 + 4

// walEncoder builds one payload. The zero value is ready; reset reuses it.
type walEncoder struct {
	domains []string
	sends   []byte
	n       int
	base    int64
	out     []byte
	version byte // the payload's version: 2, 3 with a refund, 4 with an unconfirmed mark
}

func (e *walEncoder) reset() {
	e.domains, e.sends, e.n, e.out, e.version = e.domains[:0], e.sends[:0], 0, e.out[:0], 0
}

func (e *walEncoder) add(s walSend) {
	if e.n == 0 {
		e.base = s.at
	}
	d := -1
	for i, name := range e.domains {
		if name == s.domain {
			d = i
			break
		}
	}
	if d < 0 {
		d = len(e.domains)
		e.domains = append(e.domains, s.domain)
	}
	b := binary.AppendUvarint(e.sends, uint64(d))
	b = binary.LittleEndian.AppendUint64(b, s.key)
	b = binary.LittleEndian.AppendUint16(b, s.tag)
	b = binary.AppendUvarint(b, s.seq)
	b = binary.AppendVarint(b, s.at-e.base)
	var flags byte
	if s.content != 0 {
		flags |= 1
	}
	if s.id != 0 {
		flags |= 2
	}
	e.version = max(e.version, 2)
	if s.refund {
		flags |= 4
		e.version = max(e.version, 3)
	}
	if s.unconfirmed {
		flags |= 8
		e.version = max(e.version, 4)
	}
	b = append(b, flags)
	if s.content != 0 {
		b = binary.LittleEndian.AppendUint64(b, s.content)
	}
	if s.id != 0 {
		b = binary.LittleEndian.AppendUint64(b, s.id)
	}
	e.sends = binary.AppendUvarint(b, uint64(s.cost))
	e.n++
}

// bytes returns the payload; it is valid until the next reset.
func (e *walEncoder) bytes() []byte {
	b := append(e.out[:0], max(e.version, 2))
	b = binary.AppendUvarint(b, uint64(e.base))
	b = binary.AppendUvarint(b, uint64(len(e.domains)))
	for _, d := range e.domains {
		b = binary.AppendUvarint(b, uint64(len(d)))
		b = append(b, d...)
	}
	b = binary.AppendUvarint(b, uint64(e.n))
	e.out = append(b, e.sends...)
	return e.out
}

// decodeWAL calls fn for each send of payload p, in order. Domain names
// passed to fn are valid only during the call.
func decodeWAL(p []byte, fn func(s walSend) error) error {
	r := walReader{b: p}
	v := r.byte()
	if v < 1 || v > walVersion {
		return fmt.Errorf("%w: version %d, this node reads 1 to %d", ErrBadPayload, v, walVersion)
	}
	base := int64(r.uvarint())
	nd := r.uvarint()
	if nd > uint64(len(p)) {
		return fmt.Errorf("%w: %d domains in %d bytes", ErrBadPayload, nd, len(p))
	}
	domains := make([]string, 0, nd)
	for range nd {
		l := r.uvarint()
		domains = append(domains, string(r.take(l)))
	}
	ns := r.uvarint()
	if ns > uint64(len(p)) {
		return fmt.Errorf("%w: %d sends in %d bytes", ErrBadPayload, ns, len(p))
	}
	for i := range ns {
		var s walSend
		d := r.uvarint()
		s.key = r.u64()
		s.tag = uint16(r.u64n(2))
		s.seq = r.uvarint()
		s.at = base + r.varint()
		flags := r.byte()
		if flags&1 != 0 {
			s.content = r.u64()
		}
		if flags&2 != 0 && v >= 2 {
			s.id = r.u64()
		}
		s.refund = flags&4 != 0 && v >= 3
		s.unconfirmed = flags&8 != 0 && v >= 4
		cost := r.uvarint()
		if r.err != nil {
			return fmt.Errorf("%w: send %d: %v", ErrBadPayload, i, r.err)
		}
		if d >= uint64(len(domains)) {
			return fmt.Errorf("%w: send %d names domain %d of %d", ErrBadPayload, i, d, len(domains))
		}
		if cost < 1 || cost > 1<<20 {
			return fmt.Errorf("%w: send %d: cost %d", ErrBadPayload, i, cost)
		}
		s.domain, s.cost = domains[d], int(cost)
		if err := fn(s); err != nil {
			return err
		}
	}
	if r.err != nil {
		return fmt.Errorf("%w: %v", ErrBadPayload, r.err)
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the last send", ErrBadPayload, len(r.b))
	}
	return nil
}

// walReader consumes a payload; the first error sticks and reads return 0.
type walReader struct {
	b   []byte
	err error
}

func (r *walReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("truncated %s", what)
	}
	r.b = nil
}

func (r *walReader) byte() byte {
	if len(r.b) < 1 {
		r.fail("byte")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *walReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *walReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *walReader) u64() uint64 { return r.u64n(8) }

// u64n reads an n-byte little-endian integer, n <= 8.
func (r *walReader) u64n(n int) uint64 {
	if len(r.b) < n {
		r.fail("fixed-width integer")
		return 0
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(r.b[i])
	}
	r.b = r.b[n:]
	return v
}

func (r *walReader) take(n uint64) []byte {
	if uint64(len(r.b)) < n {
		r.fail("string")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
