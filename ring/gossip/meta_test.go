package gossip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/freqring/freqring/ring"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []meta{
		{State: StateJoining, Boot: 1, GRPC: "10.0.0.1:7000"},
		{State: StateServing, Boot: 1<<64 - 1, GRPC: "[fe80::1%eth0]:7000"},
		{State: StateLeaving, GRPC: ""},
		{State: StateServing, Boot: 42, GRPC: string(bytes.Repeat([]byte{'h'}, maxGRPCAddr))},
		{State: StateServing, Boot: 9, GRPC: "h:1", Agreed: true, Version: "v1.2.3 (abc)",
			Key: agreementKey{rules: 1<<64 - 1, protocol: 3, placement: ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}}},
		{State: StateLeaving, GRPC: string(bytes.Repeat([]byte{'h'}, maxGRPCAddr)), Agreed: true,
			Version: string(bytes.Repeat([]byte{'v'}, maxVersion)), Key: agreementKey{placement: ring.Config{PartitionCount: 65536}}},
		{State: StateServing, GRPC: "h:1", Agreed: true, Version: "v", Clocked: true},
		{State: StateServing, GRPC: "h:1", Agreed: true, Version: "v", Clocked: true, Skewed: true, Offset: -10500 * time.Millisecond},
		{State: StateServing, GRPC: string(bytes.Repeat([]byte{'h'}, maxGRPCAddr)), Agreed: true,
			Version: string(bytes.Repeat([]byte{'v'}, maxVersion)), Clocked: true, Skewed: true, Offset: time.Duration(maxOffsetMillis) * time.Millisecond},
	} {
		b := m.append(nil)
		if len(b) > 512 {
			t.Fatalf("%d bytes of metadata, memberlist's MetaMaxSize is 512", len(b))
		}
		got, err := decodeMeta(b)
		if err != nil || got != m {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
		// Fields added later are appended after the clock; a decoder
		// ignores them.
		if m.Clocked {
			if got, err := decodeMeta(append(b, 0xff, 0x01)); err != nil || got != m {
				t.Fatalf("with trailing bytes: %+v, %v", got, err)
			}
		}
		// Every truncated prefix is an error, but the one that ends after
		// the address, which is the metadata of a binary without the
		// agreement fields.
		legacy := m
		legacy.Agreed, legacy.Key, legacy.Version = false, agreementKey{}, ""
		legacy.Clocked, legacy.Skewed, legacy.Offset = false, false, 0
		unclocked := m
		unclocked.Clocked, unclocked.Skewed, unclocked.Offset = false, false, 0
		for n := range len(b) {
			if m.Agreed && n == len(legacy.append(nil)) {
				if got, err := decodeMeta(b[:n]); err != nil || got != legacy {
					t.Fatalf("decode of the legacy prefix: %+v, %v", got, err)
				}
				continue
			}
			if m.Clocked && n == len(unclocked.append(nil)) {
				if got, err := decodeMeta(b[:n]); err != nil || got != unclocked {
					t.Fatalf("decode of the prefix without the clock: %+v, %v", got, err)
				}
				continue
			}
			if _, err := decodeMeta(b[:n]); !errors.Is(err, ErrBadMeta) {
				t.Fatalf("decode of %d of %d bytes: %v, want ErrBadMeta", n, len(b), err)
			}
		}
	}
}

func TestMetaGolden(t *testing.T) {
	// The layout is on the wire between versions of freqring: it may only grow.
	b := meta{State: StateServing, Boot: 0x0102030405060708, GRPC: "h:1"}.append(nil)
	want := []byte{1, 2, 8, 7, 6, 5, 4, 3, 2, 1, 3, 'h', ':', '1'}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoding %x, want %x", b, want)
	}
}

func TestMetaGoldenAgreement(t *testing.T) {
	m := meta{State: StateServing, Boot: 0x0102030405060708, GRPC: "h:1", Agreed: true, Version: "v",
		Key: agreementKey{rules: 0x1112131415161718, protocol: 2, placement: ring.Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}}}
	want := []byte{1, 2, 8, 7, 6, 5, 4, 3, 2, 1, 3, 'h', ':', '1',
		0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 2, 0, 0, 0, 0x0f, 0x01, 0, 0, 20, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0xf4, 0x3f, 1, 'v'}
	if b := m.append(nil); !bytes.Equal(b, want) {
		t.Fatalf("encoding %x, want %x", b, want)
	}
}

func TestMetaGoldenClock(t *testing.T) {
	m := meta{State: StateServing, GRPC: "h:1", Agreed: true, Version: "v", Clocked: true, Skewed: true, Offset: -1500 * time.Millisecond}
	b := m.append(nil)
	// The clock follows the version: flags 1 (skewed), then -1500 ms as a
	// zigzag varint (2999 = 0xb7 0x17).
	if want := []byte{1, 'v', 1, 0xb7, 0x17}; !bytes.HasSuffix(b, want) {
		t.Fatalf("encoding ends %x, want %x", b[len(b)-5:], want)
	}
	for name, tail := range map[string][]byte{
		"unknown flag":       {2, 0},
		"no offset":          {1},
		"non-minimal offset": {0, 0x80, 0x00},
		"offset too large":   binary.AppendVarint([]byte{0}, maxOffsetMillis+1),
	} {
		unclocked := m
		unclocked.Clocked = false
		if _, err := decodeMeta(append(unclocked.append(nil), tail...)); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: %v, want ErrBadMeta", name, err)
		}
	}
}

func TestMetaRejects(t *testing.T) {
	good := meta{State: StateServing, Boot: 7, GRPC: "h:1"}.append(nil)
	for name, edit := range map[string]func([]byte) []byte{
		"version 2":     func(b []byte) []byte { b[0] = 2; return b },
		"state 0":       func(b []byte) []byte { b[1] = 0; return b },
		"state 4":       func(b []byte) []byte { b[1] = 4; return b },
		"length 4":      func(b []byte) []byte { b[10] = 4; return b },
		"length varint": func(b []byte) []byte { return append(b[:10], 0x80) },
		"length long":   func(b []byte) []byte { return append(b[:10], 0x83, 0x00, 'h', ':', '1') },
		"length 256":    func(b []byte) []byte { return append(append(b[:10], 0x80, 0x02), make([]byte, 256)...) },
		"agreement cut": func(b []byte) []byte { return append(b, make([]byte, agreementBytes-1)...) },
		"no version":    func(b []byte) []byte { return append(b, make([]byte, agreementBytes)...) },
		"version long":  func(b []byte) []byte { return append(append(b, make([]byte, agreementBytes)...), 2, 'v') },
		"version 65": func(b []byte) []byte {
			return append(append(append(b, make([]byte, agreementBytes)...), 65), bytes.Repeat([]byte{'v'}, 65)...)
		},
	} {
		if _, err := decodeMeta(edit(bytes.Clone(good))); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: %v, want ErrBadMeta", name, err)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(meta{State: StateServing, Boot: 7, GRPC: "10.0.0.1:7000"}.append(nil))
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(meta{State: StateServing, GRPC: "h:1", Agreed: true, Version: "v1", Key: agreementKey{rules: 5, protocol: 1}}.append(nil))
	f.Add(meta{State: StateServing, GRPC: "h:1", Agreed: true, Version: "v1", Clocked: true, Skewed: true, Offset: 3 * time.Second}.append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		enc := m.append(nil)
		if !bytes.HasPrefix(b, enc) {
			t.Fatalf("decode(%x) = %+v, which encodes to %x, not a prefix of the input", b, m, enc)
		}
	})
}
