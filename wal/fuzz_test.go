package wal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fuzzSegment returns a valid segment image with a few records.
func fuzzSegment(seq uint64, payloads ...string) []byte {
	b := appendSegHeader(nil, segHeader{version: formatVersion, seq: seq, created: t0})
	for _, p := range payloads {
		b = appendRecord(b, recData, []byte(p))
	}
	return b
}

// FuzzOpen opens a log whose segment 1 holds arbitrary bytes, as the last
// segment or as a sealed one (followed by a valid segment 2), with and without
// SkipCorrupt. Open must not panic; if it succeeds, every replayed record must
// be an intact record of the original bytes at the position it is reported
// at, and the log must take an append and survive a reopen.
func FuzzOpen(f *testing.F) {
	seg := fuzzSegment(1, "a", "", "hello, world", "k=v")
	f.Add(seg, false, false)
	f.Add(seg, true, false)
	f.Add(seg[:len(seg)-3], false, false)
	f.Add(seg[:len(seg)-3], true, true)
	f.Add(append(seg[:40:40], make([]byte, 20)...), false, false)
	flipped := bytes.Clone(seg)
	flipped[45] ^= 0x10
	f.Add(flipped, true, true)
	f.Add(flipped, false, true)
	f.Add([]byte{}, false, false)
	f.Add(seg[:10], true, true)
	// Pre-zeroed: zeros after the records, with and without a torn write.
	prezeroed := append(bytes.Clone(seg), make([]byte, 200)...)
	f.Add(prezeroed, false, false)
	f.Add(prezeroed, true, false)
	torn := bytes.Clone(prezeroed)
	copy(torn[len(seg):], fuzzSegment(1, "torn")[segHeaderRecordLen:][:7])
	f.Add(torn, false, false)
	f.Add(torn, false, true)

	seg2 := fuzzSegment(2, "segment two")
	f.Fuzz(func(t *testing.T, data []byte, sealed, skip bool) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, segmentName(1)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if sealed {
			if err := os.WriteFile(filepath.Join(dir, segmentName(2)), seg2, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// Small segments: every Open starts a preparer that zeroes a spare.
		opts := Options{Dir: dir, Sync: SyncNone, SkipCorrupt: skip, SegmentBytes: 4 << 10}
		l, err := Open(opts)
		if err != nil {
			return
		}
		var got []rec
		var prev Position
		err = l.Replay(Position{}, func(pos Position, p []byte) error {
			orig := data
			if pos.Seq == 2 {
				orig = seg2
			}
			want := appendRecord(nil, recData, p)
			if pos.Offset < 0 || pos.Offset+int64(len(want)) > int64(len(orig)) ||
				!bytes.Equal(orig[pos.Offset:pos.Offset+int64(len(want))], want) {
				t.Fatalf("replayed %q at %v, not an intact record there", p, pos)
			}
			if len(got) > 0 && pos.Compare(prev) <= 0 {
				t.Fatalf("replay out of order: %v after %v", pos, prev)
			}
			prev = pos
			got = append(got, rec{pos, string(p)})
			return nil
		})
		if err != nil {
			l.Close()
			t.Fatalf("Replay after a successful Open: %v", err)
		}
		r, err := l.Append(context.Background(), []byte("appended"))
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		got = append(got, rec{r, "appended"})

		l, err = Open(opts)
		if err != nil {
			t.Fatalf("second Open: %v", err)
		}
		defer l.Close()
		equalRecs(t, replayAll(t, l, Position{}), got)
	})
}

// FuzzScanSegment runs the segment scanner on arbitrary bytes in memory, much
// faster than FuzzOpen. Every record it reports must be intact where it says;
// a torn tail has no intact data record after it (that would be corruption);
// in the last segment, the kept prefix b[:good] must scan as a sealed
// segment, cleanly or (after skips) with the same skips, and give the same
// records (repair is idempotent, and Replay sees what Open counted).
func FuzzScanSegment(f *testing.F) {
	seg := fuzzSegment(1, "a", "", "hello, world", "k=v")
	f.Add(seg, false, false)
	f.Add(seg[:len(seg)-3], true, false)
	flipped := bytes.Clone(seg)
	flipped[45] ^= 0x10
	f.Add(flipped, false, true)
	f.Add(append(bytes.Clone(seg), make([]byte, 30)...), true, false)
	f.Fuzz(func(t *testing.T, b []byte, last, skip bool) {
		var offs []int64
		s, err := scanSegment(b, "seg", 1, last, skip, 0, func(off int64, p []byte) error {
			want := appendRecord(nil, recData, p)
			if off < 0 || off+int64(len(want)) > int64(len(b)) || !bytes.Equal(b[off:off+int64(len(want))], want) {
				t.Fatalf("record %q at %d is not intact there", p, off)
			}
			if len(offs) > 0 && off <= offs[len(offs)-1] {
				t.Fatalf("record at %d after %d", off, offs[len(offs)-1])
			}
			offs = append(offs, off)
			return nil
		})
		if err != nil {
			return
		}
		if s.good < 0 || s.good > int64(len(b)) || s.records != len(offs) {
			t.Fatalf("scan = %+v for %d bytes and %d records", s, len(b), len(offs))
		}
		if s.torn != "" {
			if off, ok := resync(b, int(s.good)+1, len(b)); ok {
				t.Fatalf("torn tail at %d (%s) with an intact record at %d", s.good, s.torn, off)
			}
		}
		if !last || s.good == 0 {
			return
		}
		var again []int64
		s2, err := scanSegment(b[:s.good], "seg", 1, false, skip, 0, func(off int64, p []byte) error {
			again = append(again, off)
			return nil
		})
		if err != nil || s2.good != s.good || s2.skipped != s.skipped || !slices.Equal(again, offs) {
			t.Fatalf("prefix %d of %d bytes rescans as %+v, %v with records at %v, want %v", s.good, len(b), s2, err, again, offs)
		}
	})
}
