package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// State is what a member announces about itself in its gossip metadata.
type State uint8

// States. The numbers are on the wire: they may only be added, never changed.
const (
	StateJoining State = 1 // up, getting ready; a member, not in the ring
	StateServing State = 2 // answering checks; in the ring
	StateLeaving State = 3 // draining before Leave; out of the ring, still reachable for handoff
)

func (s State) String() string {
	switch s {
	case StateJoining:
		return "joining"
	case StateServing:
		return "serving"
	case StateLeaving:
		return "leaving"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

func (s State) valid() bool { return s >= StateJoining && s <= StateLeaving }

// ErrBadMeta is returned (wrapped) for node metadata that does not decode.
var ErrBadMeta = errors.New("gossip: bad node metadata")

// metaVersion is the first byte of the metadata. Fields are only ever appended
// and decoders ignore trailing bytes, so version 1 stays readable by every
// later binary; the version changes only if an existing field changes meaning.
const metaVersion = 1

// maxGRPCAddr bounds the gRPC address so the metadata stays far below
// memberlist's MetaMaxSize (512 bytes).
const maxGRPCAddr = 255

// meta is a member's gossip metadata, little-endian:
//
//	| version u8 = 1 | state u8 | boot u64 | uvarint len | gRPC addr |
//	| rules u64 | protocol u32 | partitions u32 | virtual nodes u32 | load f64 |
//	| uvarint len | binary version |
//	| clock flags u8 | varint clock offset ms |
//
// The second and third lines are the agreement (agree.go), appended by
// binaries since issue 12; metadata that ends after the address has none
// (Agreed false). The last line is the clock (clock.go), appended since
// issue 46; metadata that ends after the version has none (Clocked false).
// Clock flags: bit 0, the member's clock is beyond MaxClockSkew of the
// majority's; the other bits are zero.
type meta struct {
	State   State
	Boot    uint64 // random per Start
	GRPC    string // gRPC host:port
	Agreed  bool   // the agreement fields are present
	Key     agreementKey
	Version string
	Clocked bool          // the clock fields are present (only with Agreed)
	Skewed  bool          // clock flag bit 0: out of every ring (clock.go)
	Offset  time.Duration // the member's clock minus the majority's when Skewed was last set or cleared; ms on the wire
}

// agreementBytes is the fixed part of the agreement fields.
const agreementBytes = 8 + 4 + 4 + 4 + 8

func (m meta) append(dst []byte) []byte {
	dst = append(dst, metaVersion, byte(m.State))
	dst = binary.LittleEndian.AppendUint64(dst, m.Boot)
	dst = binary.AppendUvarint(dst, uint64(len(m.GRPC)))
	dst = append(dst, m.GRPC...)
	if !m.Agreed {
		return dst
	}
	dst = binary.LittleEndian.AppendUint64(dst, m.Key.rules)
	dst = binary.LittleEndian.AppendUint32(dst, m.Key.protocol)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.Key.placement.PartitionCount))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(m.Key.placement.ReplicationFactor))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(m.Key.placement.Load))
	dst = binary.AppendUvarint(dst, uint64(len(m.Version)))
	dst = append(dst, m.Version...)
	if !m.Clocked {
		return dst
	}
	var flags byte
	if m.Skewed {
		flags |= clockFlagSkewed
	}
	dst = append(dst, flags)
	return binary.AppendVarint(dst, min(max(m.Offset.Milliseconds(), -maxOffsetMillis), maxOffsetMillis))
}

// clockFlagSkewed is bit 0 of the clock flags; the other bits are zero.
const clockFlagSkewed = 1

func decodeMeta(b []byte) (meta, error) {
	const head = 1 + 1 + 8
	if len(b) < head {
		return meta{}, fmt.Errorf("%w: %d bytes, want at least %d", ErrBadMeta, len(b), head)
	}
	if b[0] != metaVersion {
		return meta{}, fmt.Errorf("%w: version %d, want %d", ErrBadMeta, b[0], metaVersion)
	}
	m := meta{State: State(b[1]), Boot: binary.LittleEndian.Uint64(b[2:])}
	if !m.State.valid() {
		return meta{}, fmt.Errorf("%w: state %d", ErrBadMeta, b[1])
	}
	n, k := binary.Uvarint(b[head:])
	if k <= 0 || k != uvarintLen(n) { // truncated, overflowing or not minimal
		return meta{}, fmt.Errorf("%w: bad address length", ErrBadMeta)
	}
	rest := b[head+k:]
	if n > maxGRPCAddr || n > uint64(len(rest)) {
		return meta{}, fmt.Errorf("%w: address length %d, %d bytes left, max %d", ErrBadMeta, n, len(rest), maxGRPCAddr)
	}
	m.GRPC = string(rest[:n])
	rest = rest[n:]
	if len(rest) == 0 {
		return m, nil // a binary from before the agreement fields
	}
	if len(rest) < agreementBytes {
		return meta{}, fmt.Errorf("%w: agreement fields: %d bytes, want at least %d", ErrBadMeta, len(rest), agreementBytes)
	}
	m.Agreed = true
	m.Key.rules = binary.LittleEndian.Uint64(rest)
	m.Key.protocol = binary.LittleEndian.Uint32(rest[8:])
	m.Key.placement.PartitionCount = int(binary.LittleEndian.Uint32(rest[12:]))
	m.Key.placement.ReplicationFactor = int(binary.LittleEndian.Uint32(rest[16:]))
	m.Key.placement.Load = math.Float64frombits(binary.LittleEndian.Uint64(rest[20:]))
	rest = rest[agreementBytes:]
	n, k = binary.Uvarint(rest)
	if k <= 0 || k != uvarintLen(n) {
		return meta{}, fmt.Errorf("%w: bad version length", ErrBadMeta)
	}
	rest = rest[k:]
	if n > maxVersion || n > uint64(len(rest)) {
		return meta{}, fmt.Errorf("%w: version length %d, %d bytes left, max %d", ErrBadMeta, n, len(rest), maxVersion)
	}
	m.Version = string(rest[:n])
	rest = rest[n:]
	if len(rest) == 0 {
		return m, nil // a binary from before the clock fields
	}
	if rest[0]&^clockFlagSkewed != 0 {
		return meta{}, fmt.Errorf("%w: clock flags %#x", ErrBadMeta, rest[0])
	}
	m.Clocked, m.Skewed = true, rest[0]&clockFlagSkewed != 0
	off, k := binary.Varint(rest[1:])
	if k <= 0 || k != len(binary.AppendVarint(nil, off)) {
		return meta{}, fmt.Errorf("%w: bad clock offset", ErrBadMeta)
	}
	if off > maxOffsetMillis || off < -maxOffsetMillis {
		return meta{}, fmt.Errorf("%w: clock offset %d ms beyond ±%d", ErrBadMeta, off, int64(maxOffsetMillis))
	}
	m.Offset = time.Duration(off) * time.Millisecond
	return m, nil
}

// maxOffsetMillis bounds a published clock offset (about 106 days), so that
// it converts to a Duration without overflow.
const maxOffsetMillis = int64(1<<53) / int64(time.Millisecond)

func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}
