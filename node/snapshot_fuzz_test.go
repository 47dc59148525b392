package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// frameSnapshot writes a snapshot file whose header and other sections are
// valid and whose partition section (or, with legacy, format 2 shard section)
// body is body, CRC and all, so that the fuzzer reaches the section parser
// instead of stopping at the CRC.
func frameSnapshot(t *testing.T, path string, body []byte, legacy bool, parts int) {
	var buf bytes.Buffer
	sw := sectionWriter{w: &buf}
	magic := snapMagic
	if legacy {
		magic = snapMagicV2
	}
	h := binary.LittleEndian.AppendUint64([]byte(magic), uint64(t0))
	h = binary.LittleEndian.AppendUint64(h, 1)
	h = binary.LittleEndian.AppendUint64(h, 0)
	if legacy {
		sw.section(secHeader, h)
		d := binary.LittleEndian.AppendUint16(nil, uint16(len(DefaultDomain)))
		d = append(d, DefaultDomain...)
		d = binary.LittleEndian.AppendUint32(d, 4)
		sw.section(secDomain, d)
		sw.section(secShard, body)
		e := binary.LittleEndian.AppendUint32(nil, 1)
		e = binary.LittleEndian.AppendUint32(e, 1)
		e = binary.LittleEndian.AppendUint64(e, 0)
		sw.section(secEnd, e)
	} else {
		h = binary.LittleEndian.AppendUint32(h, uint32(parts))
		sw.section(secHeader, h)
		sw.section(secPartition, body)
		e := binary.LittleEndian.AppendUint32(nil, uint32(parts))
		e = binary.LittleEndian.AppendUint64(e, 0)
		sw.section(secEnd, e)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// FuzzLoadSnapshot: any partition section (or format 2 shard section),
// correctly framed, loads or fails with ErrCorruptSnapshot; it never panics.
func FuzzLoadSnapshot(f *testing.F) {
	// A real partition image as a seed.
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
	for p := range n.store.Partitions() {
		if n.store.PartitionLen(p) > 0 {
			img, _ := n.store.AppendImage(nil, p)
			f.Add(img, false)
			break
		}
	}
	// A format 2 shard body: shard 0, seq 1, one record, no ids.
	legacy := binary.LittleEndian.AppendUint32(nil, 0)
	legacy = binary.LittleEndian.AppendUint64(legacy, 1)
	legacy = binary.LittleEndian.AppendUint32(legacy, 0)
	legacy = binary.LittleEndian.AppendUint32(legacy, 0)
	f.Add(legacy, true)
	f.Add([]byte{0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, body []byte, legacy bool) {
		path := filepath.Join(t.TempDir(), snapName(1))
		frameSnapshot(t, path, body, legacy, 1)
		m, err := New(Config{Name: "fuzz", Placement: ring.Config{PartitionCount: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.loadSnapshot(path, t0); err != nil && !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("error %v does not wrap ErrCorruptSnapshot", err)
		}
	})
}
