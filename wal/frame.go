package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
)

// Castagnoli is the CRC-32C table behind every checksum freqring writes:
// WAL records, snapshot sections, the usage file, record tags. Read only.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameHeaderLen is the framing before a frame's payload: size u32, crc u32,
// type u8.
const FrameHeaderLen = 9

// AppendFrame appends one frame to dst and returns the extended slice: the
// framing of a WAL record, and of every other file freqring writes
// (snapshots, the usage file), little-endian:
//
//	| size u32 | crc u32 = CRC-32C(type+payload) | type u8 | payload |
//
// It does not allocate when dst has room for len(p)+9 more bytes. The
// caller keeps len(p) within what its reader takes.
func AppendFrame(dst []byte, typ byte, p []byte) []byte {
	off := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p)))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // crc, filled below
	dst = append(append(dst, typ), p...)
	binary.LittleEndian.PutUint32(dst[off+4:], crc32.Checksum(dst[off+8:], Castagnoli))
	return dst
}

// ReadFrame decodes the frame that starts at b[off:], whose payload may be
// at most max bytes. It returns its type, its payload (a sub-slice of b, not
// a copy) and its length n with framing. Errors are the bare sentinels, so
// that scanning does not allocate: ErrTornTail for fewer than 9 bytes left,
// an all-zero header or a payload longer than the bytes left; ErrCorrupt
// for a size over max or a checksum mismatch. The type is the caller's to
// judge.
func ReadFrame(b []byte, off, max int) (typ byte, payload []byte, n int, err error) {
	if off < 0 || off > len(b) {
		panic(fmt.Sprintf("BUG: wal: ReadFrame offset %d outside [0, %d]", off, len(b)))
	}
	rest := b[off:]
	if len(rest) < FrameHeaderLen {
		return 0, nil, 0, ErrTornTail
	}
	size := binary.LittleEndian.Uint32(rest)
	sum := binary.LittleEndian.Uint32(rest[4:])
	typ = rest[8]
	if size == 0 && sum == 0 && typ == 0 {
		return 0, nil, 0, ErrTornTail
	}
	if uint64(size) > uint64(max) {
		return 0, nil, 0, ErrCorrupt
	}
	n = FrameHeaderLen + int(size)
	if n > len(rest) {
		return 0, nil, 0, ErrTornTail
	}
	if crc32.Checksum(rest[8:n], Castagnoli) != sum {
		return 0, nil, 0, ErrCorrupt
	}
	return typ, rest[FrameHeaderLen:n], n, nil
}

// ReadFrameFrom reads the next frame from r, whose payload may be at most
// max bytes, into buf (grown as needed; the payload is a sub-slice of what
// it returns as buf). At the end of r, before any byte of a frame, it
// returns io.EOF; a frame cut short is ErrTornTail, a size over max or a
// checksum mismatch ErrCorrupt, each wrapped with what was read.
func ReadFrameFrom(r io.Reader, buf []byte, max int) (typ byte, payload, newBuf []byte, err error) {
	var hdr [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return 0, nil, buf, io.EOF
		}
		return 0, nil, buf, fmt.Errorf("%w: frame header: %v", ErrTornTail, err)
	}
	size := binary.LittleEndian.Uint32(hdr[:])
	sum := binary.LittleEndian.Uint32(hdr[4:])
	typ = hdr[8]
	if uint64(size) > uint64(max) {
		return 0, nil, buf, fmt.Errorf("%w: frame of %d bytes, more than %d", ErrCorrupt, size, max)
	}
	if cap(buf) < int(size) {
		buf = make([]byte, size)
	}
	payload = buf[:size]
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, buf, fmt.Errorf("%w: frame of %d bytes: %v", ErrTornTail, size, err)
	}
	if got := crc32.Update(crc32.Update(0, Castagnoli, hdr[8:]), Castagnoli, payload); got != sum {
		return 0, nil, buf, fmt.Errorf("%w: frame type %d: crc %08x, want %08x", ErrCorrupt, typ, got, sum)
	}
	return typ, payload, buf, nil
}

// AppendFrameHeader appends the 9 bytes that frame payload p as typ
// (AppendFrame without the payload), for a writer that writes p from where
// it is rather than copy it.
func AppendFrameHeader(dst []byte, typ byte, p []byte) []byte {
	off := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p)))
	dst = binary.LittleEndian.AppendUint32(dst, 0) // crc, filled below
	dst = append(dst, typ)
	crc := crc32.Update(crc32.Update(0, Castagnoli, dst[off+8:]), Castagnoli, p)
	binary.LittleEndian.PutUint32(dst[off+4:], crc)
	return dst
}
