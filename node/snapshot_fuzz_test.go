package node

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// frameSnapshot writes a snapshot file whose header and domain sections are
// valid and whose shard section body is body, CRC and all, so that the
// fuzzer reaches the section parser instead of stopping at the CRC.
func frameSnapshot(t *testing.T, path string, body []byte) {
	var buf bytes.Buffer
	sw := sectionWriter{w: bufio.NewWriter(&buf)}
	h := binary.LittleEndian.AppendUint64([]byte(snapMagic), uint64(t0))
	h = binary.LittleEndian.AppendUint64(h, 1)
	h = binary.LittleEndian.AppendUint64(h, 0)
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
	sw.w.Flush()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// FuzzLoadSnapshot: any shard section, correctly framed, loads or fails with
// ErrCorruptSnapshot; it never panics.
func FuzzLoadSnapshot(f *testing.F) {
	// A real shard section as a seed.
	n, _ := newTestNode(f)
	if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"a", "b", "c", "d", "e"}, RequestIds: []uint64{1, 2, 3, 4, 5}}); err != nil {
		f.Fatal(err)
	}
	seed, _ := n.domains[DefaultDomain].store.dumpShard(0, nil)
	f.Add(seed)
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		path := filepath.Join(t.TempDir(), snapName(1))
		frameSnapshot(t, path, body)
		m, err := New(Config{Shards: 4, Name: "fuzz"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.loadSnapshot(path, t0); err != nil && !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("error %v does not wrap ErrCorruptSnapshot", err)
		}
	})
}
