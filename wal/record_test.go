package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

func TestAppendRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		typ     byte
		payload []byte
	}{
		{"empty data", recData, nil},
		{"one byte", recData, []byte{0}},
		{"text", recData, []byte("k=v")},
		{"header", recHeader, make([]byte, segHeaderLen)},
		{"64 KiB", recData, bytes.Repeat([]byte{0xa5}, 64<<10)},
		{"max payload", recData, make([]byte, MaxPayload)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("xyz")
			b := appendRecord(append([]byte(nil), prefix...), tt.typ, tt.payload)
			if !bytes.Equal(b[:len(prefix)], prefix) {
				t.Fatalf("appendRecord changed the bytes before it")
			}
			if got, want := len(b), len(prefix)+recordHeaderLen+len(tt.payload); got != want {
				t.Fatalf("len = %d, want %d", got, want)
			}
			typ, p, n, err := readRecord(b, len(prefix))
			if err != nil {
				t.Fatalf("readRecord: %v", err)
			}
			if typ != tt.typ || !bytes.Equal(p, tt.payload) || n != len(b)-len(prefix) {
				t.Fatalf("readRecord = type %d, %d payload bytes, n %d; want type %d, %d bytes, n %d",
					typ, len(p), n, tt.typ, len(tt.payload), len(b)-len(prefix))
			}
		})
	}
}

func TestAppendRecordLayout(t *testing.T) {
	b := appendRecord(nil, recData, []byte("ab"))
	// The check value of CRC-32C: the checksum is Castagnoli, not IEEE.
	if got := crc32c([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("CRC-32C check value = %08x, want e3069283", got)
	}
	// size 2, crc = CRC-32C("\x02ab"), type 2, payload.
	want := []byte{2, 0, 0, 0, 0, 0, 0, 0, 2, 'a', 'b'}
	binary.LittleEndian.PutUint32(want[4:], crc32c([]byte("\x02ab")))
	if !bytes.Equal(b, want) {
		t.Fatalf("appendRecord = % x, want % x", b, want)
	}
}

func TestReadRecordErrors(t *testing.T) {
	valid := appendRecord(nil, recData, []byte("payload"))
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), valid...)) }
	withUnknownType := func(typ byte) []byte {
		b := appendRecord(nil, recData, []byte("payload"))
		b[8] = typ
		binary.LittleEndian.PutUint32(b[4:], crc32c(b[8:]))
		return b
	}
	tests := []struct {
		name       string
		b          []byte
		want       error
		reason     string
		wantIntact bool
	}{
		{"empty", nil, ErrTornTail, "short header: 0 of 9", false},
		{"short header", valid[:5], ErrTornTail, "short header: 5 of 9", false},
		{"zero header", make([]byte, 9), ErrTornTail, "all-zero header", false},
		{"zero header and more", make([]byte, 100), ErrTornTail, "all-zero header", false},
		{"short payload", valid[:len(valid)-1], ErrTornTail, "short payload: 6 of 7", false},
		{"size over max", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b, MaxPayload+1)
			return b
		}), ErrCorrupt, "over the maximum", false},
		{"size max uint32", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b, ^uint32(0))
			return b
		}), ErrCorrupt, "over the maximum", false},
		{"flipped payload bit", mutate(func(b []byte) []byte { b[10] ^= 1; return b }), ErrCorrupt, "crc ", false},
		{"flipped type", mutate(func(b []byte) []byte { b[8] = recHeader; return b }), ErrCorrupt, "crc ", false},
		{"flipped crc", mutate(func(b []byte) []byte { b[5] ^= 0x80; return b }), ErrCorrupt, "crc ", false},
		{"zero type with a crc", mutate(func(b []byte) []byte { b[8] = 0; return b }), ErrCorrupt, "crc ", false},
		{"unknown type 3", withUnknownType(3), ErrCorrupt, "unknown record type 3", true},
		{"unknown type 0", withUnknownType(0), ErrCorrupt, "unknown record type 0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, n, err := readRecord(tt.b, 0)
			if err != tt.want || n != 0 {
				t.Fatalf("readRecord = n %d, err %v; want n 0, err %v", n, err, tt.want)
			}
			reason, intact := describeRecord(tt.b, 0)
			if !strings.Contains(reason, tt.reason) || intact != tt.wantIntact {
				t.Fatalf("describeRecord = %q, intact %v; want it to contain %q, intact %v", reason, intact, tt.reason, tt.wantIntact)
			}
		})
	}
}

// TestReadRecordTruncated checks that every proper prefix of a valid record,
// at any offset, reads as a torn tail (etcd TestReadRecord).
func TestReadRecordTruncated(t *testing.T) {
	var log []byte
	log = appendSegHeader(log, segHeader{version: formatVersion, seq: 7, created: 42})
	for _, p := range []string{"", "a", "hello, world", strings.Repeat("x", 300)} {
		log = appendRecord(log, recData, []byte(p))
	}
	off := 0
	for off < len(log) {
		_, _, n, err := readRecord(log, off)
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		for cut := off; cut < off+n; cut++ {
			if _, _, _, err := readRecord(log[:cut], off); err != ErrTornTail {
				t.Fatalf("record at %d cut at %d: err = %v, want ErrTornTail", off, cut, err)
			}
		}
		off += n
	}
}

func TestSegHeaderRoundTrip(t *testing.T) {
	h := segHeader{version: formatVersion, seq: 0x0102030405060708, created: -5}
	b := appendSegHeader(nil, h)
	if len(b) != segHeaderRecordLen {
		t.Fatalf("header record is %d bytes, want %d", len(b), segHeaderRecordLen)
	}
	typ, p, _, err := readRecord(b, 0)
	if err != nil || typ != recHeader {
		t.Fatalf("readRecord = type %d, err %v", typ, err)
	}
	if got, ok := parseSegHeader(p); !ok || got != h {
		t.Fatalf("parseSegHeader = %+v, %v; want %+v", got, ok, h)
	}
	if _, ok := parseSegHeader(p[:segHeaderLen-1]); ok {
		t.Fatalf("parseSegHeader accepted a short header")
	}
}

func TestSegmentName(t *testing.T) {
	f := func(name string, want uint64, wantOK bool) {
		t.Helper()
		got, ok := parseSegmentName(name)
		if got != want || ok != wantOK {
			t.Fatalf("parseSegmentName(%q) = %d, %v; want %d, %v", name, got, ok, want, wantOK)
		}
	}
	f("0000000000000001.wal", 1, true)
	f("00000000000000ff.wal", 255, true)
	f("ffffffffffffffff.wal", ^uint64(0), true)
	f("00000000000000FF.wal", 0, false)
	f("0000000000000000.wal", 0, false)
	f("000000000000001.wal", 0, false)
	f("0000000000000001.wal.tmp", 0, false)
	f("000000000000000g.wal", 0, false)
	f("snapshot", 0, false)
	if got := segmentName(255); got != "00000000000000ff.wal" {
		t.Fatalf("segmentName(255) = %q", got)
	}
}

func TestAppendRecordAllocs(t *testing.T) {
	p := bytes.Repeat([]byte("0123456789"), 100)
	buf := make([]byte, 0, 64<<10)
	allocs := testing.AllocsPerRun(100, func() {
		buf = appendRecord(buf[:0], recData, p)
	})
	if allocs != 0 {
		t.Fatalf("appendRecord allocates %v times per call, want 0", allocs)
	}
	allocs = testing.AllocsPerRun(100, func() {
		if _, _, _, err := readRecord(buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("readRecord allocates %v times per call, want 0", allocs)
	}
}

func FuzzReadRecord(f *testing.F) {
	f.Add(appendRecord(nil, recData, []byte("k=v")))
	f.Add(appendRecord(nil, recData, nil))
	f.Add(appendSegHeader(nil, segHeader{version: formatVersion, seq: 1, created: 1}))
	f.Add(appendRecord(appendRecord(nil, recData, []byte("a")), recData, []byte("b")))
	f.Add(make([]byte, 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, p, n, err := readRecord(b, 0)
		reason, intact := describeRecord(b, 0)
		switch {
		case err == nil:
			if !bytes.Equal(appendRecord(nil, typ, p), b[:n]) {
				t.Fatalf("round trip differs for %x", b[:n])
			}
			if reason != "valid record" || !intact {
				t.Fatalf("describeRecord = %q, %v for a valid record", reason, intact)
			}
		case errors.Is(err, ErrTornTail), errors.Is(err, ErrCorrupt):
			if n != 0 || p != nil {
				t.Fatalf("error %v with n %d and %d payload bytes", err, n, len(p))
			}
			if reason == "valid record" {
				t.Fatalf("describeRecord calls %x valid, readRecord says %v", b, err)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, Castagnoli) }
