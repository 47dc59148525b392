package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/wal"
)

// oldSections frames sections as formats 1 to 3 did: | kind u8 | size u32
// | crc u32 = CRC-32C(kind + body) | body |.
type oldSections struct{ buf bytes.Buffer }

func (o *oldSections) section(kind uint8, body []byte) {
	var hdr [9]byte
	hdr[0] = kind
	binary.LittleEndian.PutUint32(hdr[1:], uint32(len(body)))
	binary.LittleEndian.PutUint32(hdr[5:], crc32.Update(crc32.Update(0, wal.Castagnoli, hdr[:1]), wal.Castagnoli, body))
	o.buf.Write(hdr[:])
	o.buf.Write(body)
}

// frameSnapshot writes a snapshot file whose header and other sections are
// valid and whose partition section (or, with legacy, format 2 shard section)
// body is body, CRC and all, so that the fuzzer reaches the section parser
// instead of stopping at the CRC. format is 4 (wal's framing) or 3 (the
// framing of formats 1 to 3); a legacy one is format 2.
func frameSnapshot(t *testing.T, path string, body []byte, legacy bool, parts, format int) {
	var buf bytes.Buffer
	sw := sectionWriter{w: &buf}
	old := &oldSections{}
	section := func(kind uint8, b []byte) {
		if format == 4 && !legacy {
			sw.section(kind, b)
		} else {
			old.section(kind, b)
		}
	}
	magic := snapMagic
	switch {
	case legacy:
		magic = snapMagicV2
	case format == 3:
		magic = snapMagicV3
	}
	h := binary.LittleEndian.AppendUint64([]byte(magic), uint64(t0))
	h = binary.LittleEndian.AppendUint64(h, 1)
	h = binary.LittleEndian.AppendUint64(h, 0)
	if legacy {
		section(secHeader, h)
		d := binary.LittleEndian.AppendUint16(nil, uint16(len(DefaultDomain)))
		d = append(d, DefaultDomain...)
		d = binary.LittleEndian.AppendUint32(d, 4)
		section(secDomain, d)
		section(secShard, body)
		e := binary.LittleEndian.AppendUint32(nil, 1)
		e = binary.LittleEndian.AppendUint32(e, 1)
		e = binary.LittleEndian.AppendUint64(e, 0)
		section(secEnd, e)
	} else {
		h = binary.LittleEndian.AppendUint32(h, uint32(parts))
		section(secHeader, h)
		section(secPartition, body)
		e := binary.LittleEndian.AppendUint32(nil, uint32(parts))
		e = binary.LittleEndian.AppendUint64(e, 0)
		section(secEnd, e)
	}
	buf.Write(old.buf.Bytes())
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fuzzSeedImage returns a real partition image of a one-partition node.
func fuzzSeedImage(f *testing.F) []byte {
	n, err := New(Config{Name: "seed", Placement: ring.Config{PartitionCount: 1}})
	if err != nil {
		f.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		f.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"a", "b", "c", "d", "e"}, RequestIds: []uint64{1, 2, 3, 4, 5}}); err != nil {
		f.Fatal(err)
	}
	img, _ := n.store.AppendImage(nil, 0)
	return img
}

// fuzzLoad loads a snapshot framed around body, which must load or fail
// with ErrCorruptSnapshot.
func fuzzLoad(t *testing.T, body []byte, legacy bool, format int) {
	path := filepath.Join(t.TempDir(), snapName(1))
	frameSnapshot(t, path, body, legacy, 1, format)
	m, err := New(Config{Name: "fuzz", Placement: ring.Config{PartitionCount: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.loadSnapshot(path, t0); err != nil && !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("error %v does not wrap ErrCorruptSnapshot", err)
	}
}

// FuzzLoadSnapshot: any partition section of a format 4 snapshot (or
// format 2 shard section), correctly framed, loads or fails with
// ErrCorruptSnapshot; it never panics.
func FuzzLoadSnapshot(f *testing.F) {
	f.Add(fuzzSeedImage(f), false)
	// A format 2 shard body: shard 0, seq 1, one record, no ids.
	legacy := binary.LittleEndian.AppendUint32(nil, 0)
	legacy = binary.LittleEndian.AppendUint64(legacy, 1)
	legacy = binary.LittleEndian.AppendUint32(legacy, 0)
	legacy = binary.LittleEndian.AppendUint32(legacy, 0)
	f.Add(legacy, true)
	f.Add([]byte{0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, body []byte, legacy bool) { fuzzLoad(t, body, legacy, 4) })
}

// FuzzLoadSnapshotV3 is FuzzLoadSnapshot for a format 3 snapshot, in the
// framing of formats 1 to 3.
func FuzzLoadSnapshotV3(f *testing.F) {
	f.Add(fuzzSeedImage(f))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) { fuzzLoad(t, body, false, 3) })
}
