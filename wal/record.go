package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Record types. The numbers are part of the on-disk format: they may only be
// added, never changed or reused. Type 0 is never written, so that an all-zero
// header (a zero-filled tail) can never be taken for a record.
const (
	recHeader byte = 1 // segment header; the first record of every segment
	recData   byte = 2 // one opaque payload handed to Append
)

const (
	// MaxPayload is the largest payload, in bytes, that a record may carry.
	// Decoders check a record's size against it before using the size.
	MaxPayload = 16 << 20

	// recordHeaderLen is the framing before the payload: size u32, crc u32, type u8.
	recordHeaderLen = 9

	// formatVersion is written in every segment header. Open refuses versions it
	// does not know.
	formatVersion = 1

	// segHeaderLen is the payload of a recHeader record:
	// version u32 | seq u64 | created i64 (unix ns), little-endian.
	segHeaderLen = 20

	// segHeaderRecordLen is the size of a segment's header record, which is
	// also the offset of the segment's first data record.
	segHeaderRecordLen = recordHeaderLen + segHeaderLen
)

var (
	// ErrCorrupt reports a damaged record: a bad checksum, a size over
	// MaxPayload, an unknown record type, or any damage inside a sealed segment
	// or with an intact record after it.
	ErrCorrupt = errors.New("wal: corrupt record")
	// ErrTornTail reports an incomplete record: a short header, a short payload
	// or an all-zero header. At the end of the last segment it marks the end of
	// the log; Open truncates it, unless only zeros follow (the unused part of
	// a pre-zeroed segment).
	ErrTornTail = errors.New("wal: torn record")
	// ErrClosed is returned by calls on a closed Log.
	ErrClosed = errors.New("wal: log closed")
	// ErrTooLarge is returned by Append for a payload over MaxPayload.
	ErrTooLarge = errors.New("wal: payload too large")
)

// appendRecord appends one framed record (AppendFrame) to dst and returns
// the extended slice. The caller checks len(p) <= MaxPayload.
func appendRecord(dst []byte, typ byte, p []byte) []byte { return AppendFrame(dst, typ, p) }

// readRecord decodes the record that starts at b[off:] (ReadFrame, of at
// most MaxPayload bytes). It returns the record type, the payload (a
// sub-slice of b, not a copy) and the record's length n including framing.
// Errors are the bare sentinels, so that scanning does not allocate;
// describeRecord explains a failure for error messages:
//
//   - ErrTornTail: fewer than 9 bytes left, an all-zero header, or a payload
//     longer than the bytes left;
//   - ErrCorrupt: a size over MaxPayload, a checksum mismatch, or an unknown
//     type (checked after the checksum, so a record with a valid checksum and
//     an unknown type comes from a newer writer, not from damage).
func readRecord(b []byte, off int) (typ byte, payload []byte, n int, err error) {
	typ, payload, n, err = ReadFrame(b, off, MaxPayload)
	if err == nil && typ != recHeader && typ != recData {
		return 0, nil, 0, ErrCorrupt
	}
	return typ, payload, n, err
}

// describeRecord explains why readRecord(b, off) fails, for error and log
// messages. intact reports that the framing and checksum are valid, so the
// problem is in what the record says (an unknown type), not in its bytes.
func describeRecord(b []byte, off int) (reason string, intact bool) {
	rest := b[off:]
	if len(rest) < recordHeaderLen {
		return fmt.Sprintf("short header: %d of %d bytes", len(rest), recordHeaderLen), false
	}
	size := binary.LittleEndian.Uint32(rest)
	want := binary.LittleEndian.Uint32(rest[4:])
	typ := rest[8]
	switch {
	case size == 0 && want == 0 && typ == 0:
		return "all-zero header", false
	case size > MaxPayload:
		return fmt.Sprintf("size %d over the maximum %d", size, MaxPayload), false
	case int(size) > len(rest)-recordHeaderLen:
		return fmt.Sprintf("short payload: %d of %d bytes", len(rest)-recordHeaderLen, size), false
	}
	if got := crc32.Checksum(rest[8:recordHeaderLen+int(size)], Castagnoli); got != want {
		return fmt.Sprintf("crc %08x, want %08x", got, want), false
	}
	if typ != recHeader && typ != recData {
		return fmt.Sprintf("unknown record type %d", typ), true
	}
	return "valid record", true
}

// segHeader is the payload of a segment's header record.
type segHeader struct {
	version uint32
	seq     uint64
	created int64 // unix ns
}

func appendSegHeader(dst []byte, h segHeader) []byte {
	var p [segHeaderLen]byte
	binary.LittleEndian.PutUint32(p[0:], h.version)
	binary.LittleEndian.PutUint64(p[4:], h.seq)
	binary.LittleEndian.PutUint64(p[12:], uint64(h.created))
	return appendRecord(dst, recHeader, p[:])
}

// parseSegHeader decodes a header payload. Extra bytes after the known
// fields are allowed, for later versions that extend the header.
func parseSegHeader(p []byte) (segHeader, bool) {
	if len(p) < segHeaderLen {
		return segHeader{}, false
	}
	return segHeader{
		version: binary.LittleEndian.Uint32(p[0:]),
		seq:     binary.LittleEndian.Uint64(p[4:]),
		created: int64(binary.LittleEndian.Uint64(p[12:])),
	}, true
}
