package window

import (
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

func randomState(rng *rand.Rand) *state {
	s := &state{tag: uint16(rng.Uint32())}
	s.newest = t0 + rng.Int64N(1<<40)
	span := int64(1) << rng.IntN(40)
	n := rng.IntN(60)
	if rng.IntN(10) == 0 {
		n = 900 + rng.IntN(100)
	}
	base := s.newest
	if rng.IntN(4) == 0 {
		base -= rng.Int64N(span) // recipient log older than newest
	}
	for range n {
		s.recip = append(s.recip, base-rng.Int64N(span))
	}
	slices.Sort(s.recip)
	for j := range rng.IntN(8) {
		m := 1 + rng.IntN(20)
		off := len(s.ctimes)
		shared := n > 0 && rng.IntN(2) == 0 // entries mostly from the recipient log, as sends record them
		for range m {
			if shared && rng.IntN(8) != 0 {
				s.ctimes = append(s.ctimes, s.recip[rng.IntN(n)])
				continue
			}
			s.ctimes = append(s.ctimes, s.newest-rng.Int64N(span))
		}
		slices.Sort(s.ctimes[off:])
		s.clogs = append(s.clogs, contentLog{fp: rng.Uint32() + uint32(j), off: int32(off), n: int32(m)})
	}
	if rng.IntN(3) == 0 {
		addRandomCounters(rng, s)
	}
	return s
}

// addRandomCounters gives s up to MaxRules counter states of random
// algorithms and values, sorted by id as pruning leaves them.
func addRandomCounters(rng *rand.Rand, s *state) {
	id := rng.Uint32() >> 8
	for range 1 + rng.IntN(MaxRules) {
		alg := Algorithm(1 + rng.IntN(int(FixedWindow)))
		m := 2
		if alg.isBucket() {
			m += rng.IntN(2) // the time it was last full
		}
		if alg == FixedWindow {
			m += rng.IntN(2) // the debt carried in (Borrow)
		}
		if alg == SlidingCounter {
			m = 2 + rng.IntN(60)
			if rng.IntN(20) == 0 {
				m = MaxBuckets + 2
			}
		}
		off := len(s.cvals)
		s.cvals = append(s.cvals, s.newest-rng.Int64N(min(s.newest+1, 1<<uint(rng.IntN(45)))))
		most := 50
		if alg.isBucket() {
			most = 55
		}
		for range m - 1 {
			s.cvals = append(s.cvals, rng.Int64N(1<<uint(1+rng.IntN(most))))
		}
		s.counters = append(s.counters, counterState{id: id, alg: alg, off: int32(off), n: int32(m)})
		id += 1 + rng.Uint32()>>12
	}
}

func statesEqual(a, b *state) bool {
	if a.tag != b.tag || a.newest != b.newest || !slices.Equal(a.recip, b.recip) || len(a.clogs) != len(b.clogs) {
		return false
	}
	for j := range a.clogs {
		ca, cb := a.clogs[j], b.clogs[j]
		if ca.fp != cb.fp || !slices.Equal(a.ctimes[ca.off:ca.off+ca.n], b.ctimes[cb.off:cb.off+cb.n]) {
			return false
		}
	}
	if len(a.counters) != len(b.counters) {
		return false
	}
	for j := range a.counters {
		ca, cb := a.counters[j], b.counters[j]
		if ca.id != cb.id || ca.alg != cb.alg || !slices.Equal(a.cvals[ca.off:ca.off+ca.n], b.cvals[cb.off:cb.off+cb.n]) {
			return false
		}
	}
	return true
}

// withoutCounters returns a copy of s without its counter states.
func withoutCounters(s *state) *state {
	c := *s
	c.counters, c.cvals = nil, nil
	return &c
}

func TestCodecRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	var got state
	for i := range 5000 {
		s := randomState(rng)
		b := s.encode(nil)
		// A record may sit in a larger slot: trailing bytes are ignored.
		b = append(b, 0xff, 0xff, 0xff)
		if err := got.decode(b); err != nil {
			t.Fatalf("case %d: decode: %v", i, err)
		}
		if !statesEqual(s, &got) {
			t.Fatalf("case %d: round trip differs:\n in %+v\nout %+v", i, s, got)
		}
	}
}

// TestCodecFormats: both formats round-trip every state, ConvertRecord
// translates between them exactly.
func TestCodecFormats(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var got state
	var sc Scratch
	for i := range 3000 {
		s := randomState(rng)
		v1 := s.encodeFormat(nil, 1)
		v2 := s.encodeFormat(nil, 2)
		v3 := s.encodeFormat(nil, 3)
		plain := withoutCounters(s)
		if err := got.decodeFormat(v1, 1); err != nil || !statesEqual(plain, &got) {
			t.Fatalf("case %d: format 1 round trip: %v", i, err)
		}
		if err := got.decodeFormat(v2, 2); err != nil || !statesEqual(plain, &got) {
			t.Fatalf("case %d: format 2 round trip: %v", i, err)
		}
		if err := got.decodeFormat(v3, 3); err != nil || !statesEqual(s, &got) {
			t.Fatalf("case %d: format 3 round trip: %v", i, err)
		}
		c, err := ConvertRecord(&sc, v1, 1, 2)
		if err != nil || !slices.Equal(c, v2) {
			t.Fatalf("case %d: ConvertRecord 1->2 = %x, %v; want %x", i, c, err, v2)
		}
		c, err = ConvertRecord(&sc, v2, 2, 1)
		if err != nil || !slices.Equal(c, v1) {
			t.Fatalf("case %d: ConvertRecord 2->1 = %x, %v; want %x", i, c, err, v1)
		}
		want3 := plain.encodeFormat(nil, 3)
		for from, v := range map[int][]byte{1: v1, 2: v2} {
			c, err = ConvertRecord(&sc, v, from, 3)
			if err != nil || !slices.Equal(c, want3) {
				t.Fatalf("case %d: ConvertRecord %d->3 = %x, %v; want %x", i, from, c, err, want3)
			}
		}
		for to, want := range map[int][]byte{1: v1, 2: v2} {
			c, err = ConvertRecord(&sc, v3, 3, to)
			if len(s.counters) > 0 {
				// Counter states cannot travel in an older format: refused, not dropped.
				if !errors.Is(err, ErrNeedsFormat3) || !errors.Is(err, ErrInvalid) {
					t.Fatalf("case %d: ConvertRecord 3->%d with %d counter states: %v, want ErrNeedsFormat3", i, to, len(s.counters), err)
				}
				continue
			}
			if err != nil || !slices.Equal(c, want) {
				t.Fatalf("case %d: ConvertRecord 3->%d = %x, %v; want %x", i, to, c, err, want)
			}
		}
	}
	for _, f := range [][2]int{{4, 3}, {3, 4}, {0, 3}} {
		if _, err := ConvertRecord(&sc, nil, f[0], f[1]); !errors.Is(err, ErrInvalid) {
			t.Fatalf("ConvertRecord %d->%d: %v, want ErrInvalid", f[0], f[1], err)
		}
	}
}

// TestFormat1Golden pins format 1: a record written by the release before
// format 2 (the seed's steady state, rng PCG(7, 7)) still decodes to the
// same sends, and converts to the record format 2 writes for them.
func TestFormat1Golden(t *testing.T) {
	d, _ := NewDomain("default", DefaultRules())
	now := t0 + 86_400_000
	rec := steadyRecord(t, d, rand.New(rand.NewPCG(7, 7)), now)
	old, err := hex.DecodeString(format1Golden)
	if err != nil {
		t.Fatal(err)
	}
	var sc Scratch
	c, err := ConvertRecord(&sc, old, 1, RecordFormat)
	if err != nil || !slices.Equal(c, rec) {
		t.Fatalf("format 1 golden converts to %x, %v; want %x", c, err, rec)
	}
	if len(rec) >= len(old) {
		t.Fatalf("steady state: format 2 takes %d bytes, format 1 %d", len(rec), len(old))
	}
}

func TestCodecEveryTruncationFails(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	var got state
	for range 200 {
		s := randomState(rng)
		b := s.encode(nil)
		for n := range len(b) {
			// The encoder writes no padding byte, so every cut loses bits.
			if err := got.decode(b[:n]); !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("truncated at %d of %d: got %v, want ErrCorruptRecord", n, len(b), got.decode(b[:n]))
			}
		}
	}
}

// FuzzDecodeRecord: arbitrary bytes never panic the decoder, and whatever it
// accepts survives a round trip through the encoder.
func FuzzDecodeRecord(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 8 {
		f.Add(randomState(rng).encode(nil))
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	var fw state // a borrowing fixed-window's [start, n, owed]
	fw.reset(1)
	fw.newest = t0 + 5
	fw.setCounter(&counterRule{id: 0xb0220, alg: FixedWindow}, []int64{t0, 1200, 300})
	f.Add(fw.encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s, again state
		if err := s.decode(b); err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decode error %v does not wrap ErrCorruptRecord", err)
			}
			return
		}
		enc := s.encode(nil)
		if err := again.decode(enc); err != nil {
			t.Fatalf("re-decode of %x: %v", enc, err)
		}
		if !statesEqual(&s, &again) {
			t.Fatalf("round trip differs for %x", b)
		}
	})
}

// FuzzDecodeRecordV2 is FuzzDecodeRecord for format 2, which snapshots and
// peers of the release before counter states still send.
func FuzzDecodeRecordV2(f *testing.F) {
	rng := rand.New(rand.NewPCG(6, 6))
	for range 8 {
		f.Add(randomState(rng).encodeFormat(nil, 2))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s, again state
		if err := s.decodeFormat(b, 2); err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decode error %v does not wrap ErrCorruptRecord", err)
			}
			return
		}
		if len(s.counters) > 0 {
			t.Fatalf("format 2 %x decoded with counter states", b)
		}
		if err := again.decode(s.encode(nil)); err != nil || !statesEqual(&s, &again) {
			t.Fatalf("format 2 %x does not survive conversion to format 3: %v", b, err)
		}
	})
}

// FuzzDecodeRecordV1 is FuzzDecodeRecord for format 1, which snapshots and
// older peers still send.
func FuzzDecodeRecordV1(f *testing.F) {
	rng := rand.New(rand.NewPCG(4, 4))
	for range 8 {
		f.Add(randomState(rng).encodeFormat(nil, 1))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s, again state
		if err := s.decodeFormat(b, 1); err != nil {
			if !errors.Is(err, ErrCorruptRecord) {
				t.Fatalf("decode error %v does not wrap ErrCorruptRecord", err)
			}
			return
		}
		if err := again.decode(s.encode(nil)); err != nil || !statesEqual(&s, &again) {
			t.Fatalf("format 1 %x does not survive conversion to format 3: %v", b, err)
		}
	})
}

// FuzzApply drives Apply from fuzz bytes (an op per 4 bytes) against the
// brute-force reference, with whatever record bytes the fuzzer starts from
// ignored: it tests the engine, not the decoder.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("the quick brown fox jumps over the lazy dog, twice over"))
	d, err := NewDomain("fuzz", []Rule{
		rule("r-2-1s", ScopeRecipient, 2, 1000_000_000),
		rule("r-5-10s", ScopeRecipient, 5, 10_000_000_000),
		rule("c-1-2s", ScopeContent, 1, 2_000_000_000),
		rule("c-3-20s", ScopeContent, 3, 20_000_000_000),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		var (
			s   Scratch
			rec []byte
			ref refRecipient
			now = t0
		)
		for i := 0; i+4 <= len(ops); i += 4 {
			op := ops[i : i+4]
			now += int64(op[0])*50 - 1000 // steps back up to 1 s, forward up to 11.75 s
			it := Item{Content: uint64(op[1] % 4), Cost: 1 + int(op[2]%4)%3, Mode: Mode(op[3] % 3)}
			if now < 0 {
				now = 0
			}
			want := ref.decide(d, now, it)
			var got Decision
			out, err := d.Apply(&s, rec, 0, now, it, &got)
			if err != nil {
				if !errors.Is(err, ErrInvalid) || want.Recorded {
					t.Fatalf("op %d: %v (reference %+v)", i/4, err, want)
				}
				continue
			}
			if got != want {
				t.Fatalf("op %d item %+v:\n got %+v\nwant %+v", i/4, it, got, want)
			}
			if out != nil {
				rec = append(rec[:0], out...)
			}
		}
	})
}

// format1Golden is the record of TestFormat1Golden as the release before
// format 2 wrote it.
const format1Golden = "0100dca95ec9a0f10f80352b2008b0528c04d3dc905030f47a54e84196b8cfb04332c4e0b6a89819d3bf04ec675ed01a39b1ff48fc2e5040f3ed10074cc8a537e1e6171c5a13b8215a94f024599600f9cb4220146c80cc511ca7f6699d78185e034c359191771acfb61c6b415f380000006b415f78342b20"

// TestGapsRoundTrip writes logs of every gap width and many lengths with
// writeGaps (two gaps at a time up to 28 bits) and reads them back with
// readGaps, comparing the stream with one written a bit at a time.
func TestGapsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for wd := uint(1); wd <= maxValueBits; wd++ {
		for n := 1; n <= 41; n++ {
			for lead := uint(0); lead < 64; lead += 13 { // bits already pending in the writer
				log := make([]int64, n)
				log[0] = int64(rng.Uint64N(1 << 40))
				for i := 1; i < n; i++ {
					log[i] = log[i-1] + int64(rng.Uint64N(1<<wd))
				}
				buf := make([]byte, (int(lead)+n*int(wd))/8+8+pad)
				w := bitWriter{buf: buf}
				w.write(0x5a5a5a5a5a5a5a&(1<<min(lead, 56)-1), min(lead, 56))
				w.writeGaps(log, wd)
				size := w.bytes()
				want := make([]byte, len(buf))
				pos := uint(0)
				put := func(v uint64, nb uint) {
					for k := range nb {
						if v>>k&1 == 1 {
							want[(pos+k)/8] |= 1 << ((pos + k) % 8)
						}
					}
					pos += nb
				}
				put(0x5a5a5a5a5a5a5a&(1<<min(lead, 56)-1), min(lead, 56))
				for i := n - 1; i > 0; i-- {
					put(uint64(log[i]-log[i-1]), wd)
				}
				if string(buf[:size]) != string(want[:size]) || size != int(pos+7)/8 {
					t.Fatalf("width %d, %d entries, %d bits before: stream differs", wd, n, lead)
				}
				got := make([]int64, n)
				got[n-1] = log[n-1]
				r := bitReader{b: append(buf[:size:size], make([]byte, pad)...), pos: min(lead, 56), end: uint(size) * 8}
				if oldest := r.readGaps(got[:n-1], log[n-1], wd); oldest != log[0] || r.pos != pos {
					t.Fatalf("width %d, %d entries: oldest %d at bit %d, want %d at %d", wd, n, oldest, r.pos, log[0], pos)
				}
				for i := range got {
					if got[i] != log[i] {
						t.Fatalf("width %d, %d entries: entry %d is %d, want %d", wd, n, i, got[i], log[i])
					}
				}
			}
		}
	}
}
