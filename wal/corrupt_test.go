package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// activeSegment appends records of assorted sizes to a fresh log's only
// segment and closes it. It returns the segment's path and the records.
func activeSegment(t *testing.T, dir string) (string, []rec) {
	t.Helper()
	l := openT(t, Options{Dir: dir, SegmentBytes: 1 << 20, noSpare: true})
	rng := rand.New(rand.NewPCG(12, 2))
	var recs []rec
	for i := range 40 {
		recs = append(recs, appendT(t, l, fmt.Sprintf("send-%02d-%s", i, strings.Repeat("x", rng.IntN(120)))))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, segmentName(1)), recs
}

// TestCorruptActiveSegment is issue 12 case 2: damage in the middle of the
// active (last) segment with intact records after it is corruption, not a
// torn tail. Open refuses, naming the file and offset and changing nothing;
// with SkipCorrupt it skips exactly the damaged records, keeps and replays
// every intact one after them, counts the skipped bytes, and seals the
// segment, so that new appends follow the damage in a clean segment. Each
// case damages the records whose indexes it lists (-1 is the segment header),
// as etcd's and pebble's torn-write tests do, at every kind of offset.
func TestCorruptActiveSegment(t *testing.T) {
	type damage func(b []byte, recs []rec)
	at := func(recs []rec, i int) int { // offset of record i; -1 is the segment header
		if i < 0 {
			return 0
		}
		return int(recs[i].pos.Offset)
	}
	flip := func(i, k int, mask byte) damage { // byte k of record i
		return func(b []byte, recs []rec) { b[at(recs, i)+k] ^= mask }
	}
	tests := []struct {
		name    string
		damage  damage
		damaged []int
	}{
		{"size bit", flip(20, 0, 0x04), []int{20}},
		{"size over MaxPayload", flip(20, 3, 0x80), []int{20}},
		{"size over-long past intact records", func(b []byte, recs []rec) {
			binary.LittleEndian.PutUint32(b[at(recs, 20):], uint32(at(recs, 25)-at(recs, 20)))
		}, []int{20}},
		{"size past the end", func(b []byte, recs []rec) {
			binary.LittleEndian.PutUint32(b[at(recs, 20):], uint32(len(b)))
		}, []int{20}},
		{"crc", flip(20, 5, 0xff), []int{20}},
		{"type byte", flip(20, 8, 0x03), []int{20}},
		{"payload", flip(20, 11, 0x01), []int{20}},
		{"last payload byte", func(b []byte, recs []rec) { b[at(recs, 21)-1] ^= 0x40 }, []int{20}},
		{"zeroed header", func(b []byte, recs []rec) { clear(b[at(recs, 20) : at(recs, 20)+recordHeaderLen]) }, []int{20}},
		{"zeroed range over two records", func(b []byte, recs []rec) {
			clear(b[at(recs, 19)+12 : at(recs, 20)+12])
		}, []int{19, 20}},
		{"first record after the segment header", flip(0, 10, 0x20), []int{0}},
		{"segment header", flip(-1, 0, 0x01), []int{-1}},
		{"several spots", func(b []byte, recs []rec) {
			for _, i := range []int{3, 17, 18, 30} {
				b[at(recs, i)+recordHeaderLen] ^= 0x08
			}
		}, []int{3, 17, 18, 30}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testCorruptActive(t, tt.damage, tt.damaged)
		})
	}
	// Every single byte of one record, flipped, is found and skipped alone.
	dir := t.TempDir()
	_, recs := activeSegment(t, dir)
	for k := range int(recLen(recs[20])) {
		t.Run(fmt.Sprintf("byte %d of a record", k), func(t *testing.T) {
			testCorruptActive(t, flip(20, k, 0x10), []int{20})
		})
	}
}

func testCorruptActive(t *testing.T, damage func(b []byte, recs []rec), damaged []int) {
	t.Helper()
	dir := t.TempDir()
	path, recs := activeSegment(t, dir)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	damage(b, recs)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var kept []rec
	var skipped int64
	isDamaged := map[int]bool{}
	for _, i := range damaged {
		isDamaged[i] = true
		if i < 0 {
			skipped += segHeaderRecordLen
		} else {
			skipped += recLen(recs[i])
		}
	}
	for i, r := range recs {
		if !isDamaged[i] {
			kept = append(kept, r)
		}
	}
	first := int64(0)
	if damaged[0] >= 0 {
		first = recs[damaged[0]].pos.Offset
	}

	// Refused, naming the file and the offset, with the hint; nothing changes.
	_, err = Open(Options{Dir: dir, SegmentBytes: 1 << 20, noSpare: true})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("%s offset %d:", path, first)) ||
		!strings.Contains(err.Error(), "--skip-corrupt") {
		t.Fatalf("Open: %v, want ErrCorrupt naming %s offset %d and --skip-corrupt", err, path, first)
	}
	if after, _ := os.ReadFile(path); string(after) != string(b) {
		t.Fatalf("the refused Open changed the segment")
	}
	if names := dirNames(t, dir); len(names) != 1 {
		t.Fatalf("the refused Open left files %v", names)
	}

	// Skipped: exactly the damaged records go, every intact one stays.
	var logs logRecorder
	opts := Options{Dir: dir, SegmentBytes: 1 << 20, noSpare: true, SkipCorrupt: true, Logger: logs.logger()}
	l := openT(t, opts)
	equalRecs(t, replayAll(t, l, Position{}), kept)
	if st := l.Stats(); st.SkippedBytes != skipped || st.TornBytes != 0 {
		t.Fatalf("Stats: skipped %d, torn %d bytes; want %d skipped, none torn", st.SkippedBytes, st.TornBytes, skipped)
	}
	if msg := fmt.Sprintf("level=ERROR msg=\"wal: skipped damaged bytes\" file=%s offset=%d", path, first); !strings.Contains(logs.String(), msg) {
		t.Fatalf("no log %q in\n%s", msg, logs.String())
	}
	// Open's count (the scan) and Replay agree.
	s, err := scanSegment(b, path, 1, true, true, 0, nil)
	if err != nil || s.records != len(kept) {
		t.Fatalf("scan counts %d records (%v), Replay yields %d", s.records, err, len(kept))
	}
	segs := l.Segments()
	if len(segs) != 2 || !segs[0].Sealed {
		t.Fatalf("segments %+v: want the damaged one sealed and a fresh one", segs)
	}
	more := appendT(t, l, "after")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openT(t, opts)
	equalRecs(t, replayAll(t, l, Position{}), append(kept, more))
	l.Close()
	// The damage stays on disk: without SkipCorrupt, Open still refuses.
	if _, err := Open(Options{Dir: dir, SegmentBytes: 1 << 20, noSpare: true}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open without SkipCorrupt after a skip: %v, want ErrCorrupt", err)
	}
}
