package wal

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestFrameTruncated: every proper prefix of a frame is a torn frame, for
// ReadFrame and ReadFrameFrom (io.EOF for the empty one); the whole frame
// reads back, and a frame over max or with a flipped byte is corrupt.
func TestFrameTruncated(t *testing.T) {
	payload := []byte("a snapshot section, say")
	f := AppendFrame(nil, 5, payload)
	if h := AppendFrameHeader(nil, 5, payload); !bytes.Equal(h, f[:FrameHeaderLen]) {
		t.Fatalf("AppendFrameHeader %x, AppendFrame's header %x", h, f[:FrameHeaderLen])
	}
	for k := 0; k < len(f); k++ {
		if _, _, _, err := ReadFrame(f[:k], 0, 1<<20); !errors.Is(err, ErrTornTail) {
			t.Fatalf("ReadFrame of %d of %d bytes: %v, want ErrTornTail", k, len(f), err)
		}
		_, _, _, err := ReadFrameFrom(bytes.NewReader(f[:k]), nil, 1<<20)
		if k == 0 && err != io.EOF || k > 0 && !errors.Is(err, ErrTornTail) {
			t.Fatalf("ReadFrameFrom of %d of %d bytes: %v", k, len(f), err)
		}
	}
	typ, p, n, err := ReadFrame(f, 0, len(payload))
	if err != nil || typ != 5 || !bytes.Equal(p, payload) || n != len(f) {
		t.Fatalf("ReadFrame: %d %q %d %v", typ, p, n, err)
	}
	typ, p, _, err = ReadFrameFrom(bytes.NewReader(f), make([]byte, 2), len(payload))
	if err != nil || typ != 5 || !bytes.Equal(p, payload) {
		t.Fatalf("ReadFrameFrom: %d %q %v", typ, p, err)
	}
	if _, _, _, err := ReadFrame(f, 0, len(payload)-1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadFrame over max: %v", err)
	}
	if _, _, _, err := ReadFrameFrom(bytes.NewReader(f), nil, len(payload)-1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadFrameFrom over max: %v", err)
	}
	for i := range f {
		d := bytes.Clone(f)
		d[i] ^= 0x40
		if _, _, _, err := ReadFrame(d, 0, 1<<20); err == nil {
			t.Fatalf("byte %d flipped: read", i)
		}
	}
}

// FuzzReadFrame: what ReadFrame and ReadFrameFrom accept, they read alike,
// and it frames back to the same bytes.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, 1, []byte("k=v")))
	f.Add(AppendFrame(nil, 4, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, p, n, err := ReadFrame(b, 0, 1<<16)
		typ2, p2, _, err2 := ReadFrameFrom(bytes.NewReader(b), nil, 1<<16)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("ReadFrame %v, ReadFrameFrom %v", err, err2)
		}
		if err != nil {
			return
		}
		if typ != typ2 || !bytes.Equal(p, p2) || !bytes.Equal(AppendFrame(nil, typ, p), b[:n]) {
			t.Fatalf("round trip differs for %x", b[:n])
		}
	})
}
