package node

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
)

func randomSends(rng *rand.Rand, n int) []walSend {
	out := make([]walSend, n)
	at := t0 + rng.Int64N(1e9)
	for i := range out {
		at += rng.Int64N(2000) - 500 // not monotonic: concurrent batches
		s := walSend{
			domain: []string{"default", "marketing", "otp"}[rng.IntN(3)],
			key:    rng.Uint64(), tag: uint16(rng.Uint32()), seq: rng.Uint64N(1 << 40),
			at: at, cost: 1 + rng.IntN(3),
		}
		if rng.IntN(2) == 0 {
			s.content = rng.Uint64() | 1
		}
		if rng.IntN(2) == 0 {
			s.id = rng.Uint64() | 1
		}
		switch rng.IntN(16) {
		case 0:
			s.refund = true
		case 1:
			s.unconfirmed = s.id != 0
		}
		out[i] = s
	}
	return out
}

func encodeSends(sends []walSend) []byte {
	var e walEncoder
	for _, s := range sends {
		e.add(s)
	}
	return append([]byte(nil), e.bytes()...)
}

func decodeAll(p []byte) ([]walSend, error) {
	var got []walSend
	err := decodeWAL(p, func(s walSend) error { got = append(got, s); return nil })
	return got, err
}

func TestWALPayloadRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	var e walEncoder
	for range 200 {
		sends := randomSends(rng, 1+rng.IntN(150))
		e.reset()
		for _, s := range sends {
			e.add(s)
		}
		got, err := decodeAll(e.bytes())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, sends) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, sends)
		}
	}
}

func TestWALPayloadTruncationFails(t *testing.T) {
	p := encodeSends(randomSends(rand.New(rand.NewPCG(2, 2)), 20))
	for n := range len(p) {
		if _, err := decodeAll(p[:n]); !errors.Is(err, ErrBadPayload) {
			t.Fatalf("cut at %d of %d: %v, want ErrBadPayload", n, len(p), err)
		}
	}
	if _, err := decodeAll(append(p, 0)); !errors.Is(err, ErrBadPayload) {
		t.Fatalf("trailing byte: %v", err)
	}
	bad := append([]byte(nil), p...)
	bad[0] = 9
	if _, err := decodeAll(bad); err == nil || !errors.Is(err, ErrBadPayload) {
		t.Fatalf("version 9: %v", err)
	}
}

// FuzzDecodeWAL: any bytes decode or fail with ErrBadPayload; what decodes
// re-encodes to a payload that decodes to the same sends.
func FuzzDecodeWAL(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 5 {
		f.Add(encodeSends(randomSends(rng, 1+rng.IntN(10))))
	}
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := decodeAll(p)
		if err != nil {
			if !errors.Is(err, ErrBadPayload) {
				t.Fatalf("error %v does not wrap ErrBadPayload", err)
			}
			return
		}
		if len(got) == 0 {
			return
		}
		again, err := decodeAll(encodeSends(got))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("re-encode: %v\n got %+v\nwant %+v", err, again, got)
		}
	})
}

// FuzzDecodeImages: an image payload decodes or fails with ErrBadPayload,
// and what decodes encodes to a payload that decodes to the same images
// (varints may be written longer than needed).
func FuzzDecodeImages(f *testing.F) {
	f.Add(encodeImages(nil, [][]byte{{1, 2, 3}, {}}))
	f.Add([]byte{walImages, 5})
	f.Fuzz(func(t *testing.T, p []byte) {
		var imgs [][]byte
		err := decodeImages(p, func(img []byte) error {
			imgs = append(imgs, img)
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrBadPayload) {
				t.Fatalf("error %v does not wrap ErrBadPayload", err)
			}
			return
		}
		var again [][]byte
		if err := decodeImages(encodeImages(nil, imgs), func(img []byte) error {
			again = append(again, img)
			return nil
		}); err != nil || len(again) != len(imgs) {
			t.Fatalf("re-encoded %d images: %v, %d back", len(imgs), err, len(again))
		}
		for i := range imgs {
			if !bytes.Equal(imgs[i], again[i]) {
				t.Fatalf("image %d differs after a round trip", i)
			}
		}
	})
}
