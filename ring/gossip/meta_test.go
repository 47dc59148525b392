package gossip

import (
	"bytes"
	"errors"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, m := range []meta{
		{State: StateJoining, Boot: 1, GRPC: "10.0.0.1:7000"},
		{State: StateServing, Boot: 1<<64 - 1, GRPC: "[fe80::1%eth0]:7000"},
		{State: StateLeaving, GRPC: ""},
		{State: StateServing, Boot: 42, GRPC: string(bytes.Repeat([]byte{'h'}, maxGRPCAddr))},
	} {
		b := m.append(nil)
		got, err := decodeMeta(b)
		if err != nil || got != m {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
		// Fields added later are appended; a version-1 decoder ignores them.
		if got, err := decodeMeta(append(b, 0xff, 0x01)); err != nil || got != m {
			t.Fatalf("with trailing bytes: %+v, %v", got, err)
		}
		// Every truncated prefix is an error.
		for n := range len(b) {
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
	} {
		if _, err := decodeMeta(edit(bytes.Clone(good))); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: %v, want ErrBadMeta", name, err)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(meta{State: StateServing, Boot: 7, GRPC: "10.0.0.1:7000"}.append(nil))
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
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
