package wal

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestDirectFilesRoundTrip: WriteFileAtomicDirect writes exactly the bytes
// given, whatever their length and however write cuts them up, and
// OpenDirect reads exactly the file back, whole blocks directly and the
// last partial block through the page cache.
func TestDirectFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, directAlign - 1, directAlign, directAlign + 1, directChunk - 1, directChunk, directChunk + 5000, 3*directChunk + 123} {
		want := make([]byte, size)
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		for _, piece := range []int{1 << 30, 7, 100_003} {
			if piece == 7 && size > 1<<20 {
				continue // a few million 7-byte writes add nothing
			}
			name := "f"
			err := WriteFileAtomicDirect(dir, name, func(w io.Writer) error {
				for rest := want; len(rest) > 0; {
					n := min(piece, len(rest))
					if _, err := w.Write(rest[:n]); err != nil {
						return err
					}
					rest = rest[n:]
				}
				return nil
			})
			if err != nil {
				t.Fatalf("size %d, writes of %d: %v", size, piece, err)
			}
			path := filepath.Join(dir, name)
			if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("size %d, writes of %d: file of %d bytes differs (%v)", size, piece, len(got), err)
			}
			r, err := OpenDirect(path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := readInPieces(r, 65_537)
			if cerr := r.Close(); cerr != nil {
				t.Fatalf("size %d: Close: %v", size, cerr)
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("size %d: OpenDirect read %d bytes that differ (%v)", size, len(got), err)
			}
			if err := r.Close(); !errors.Is(err, os.ErrClosed) {
				t.Fatalf("size %d: a second Close returned %v, want os.ErrClosed", size, err)
			}
		}
	}
}

// TestDirectChunkBoundsBuffers: WriteFileAtomicDirectChunk and
// OpenDirectChunk move a file of many chunks exactly, allocating about
// three chunks (the writer: two, and the smaller ones it doubled from) and
// two (the reader) of the size asked for, rounded up to 4 KiB, however
// large the file.
func TestDirectChunkBoundsBuffers(t *testing.T) {
	dir := t.TempDir()
	want := make([]byte, 10<<20+777)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	allocated := func(f func()) int64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		f()
		runtime.ReadMemStats(&ms)
		return int64(ms.TotalAlloc - before)
	}
	const slack = 64 << 10 // the file, the goroutine, the rounding of each buffer up to 4 KiB
	for _, size := range []int{5000, 256 << 10, 1 << 20} {
		chunk := int64(chunkSize(size))
		var err error
		wrote := allocated(func() {
			err = WriteFileAtomicDirectChunk(dir, "f", size, func(w io.Writer) error {
				for rest := want; len(rest) > 0; {
					n, err := w.Write(rest[:min(100_003, len(rest))])
					if err != nil {
						return err
					}
					rest = rest[n:]
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if wrote > 3*chunk+slack {
			t.Errorf("chunk %d: writing %d bytes allocated %d, want at most 3 chunks (%d)", size, len(want), wrote, 3*chunk)
		}
		var got []byte
		buf := make([]byte, 65_537)
		read := allocated(func() {
			var r io.ReadCloser
			if r, err = OpenDirectChunk(filepath.Join(dir, "f"), size); err != nil {
				return
			}
			defer r.Close()
			got = make([]byte, 0, len(want))
			for {
				n, rerr := r.Read(buf)
				got = append(got, buf[:n]...)
				if rerr == io.EOF {
					return
				}
				if err = rerr; err != nil {
					return
				}
			}
		}) - int64(len(want))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: read %d bytes of %d that differ (%v)", size, len(got), len(want), err)
		}
		if read > 2*chunk+slack {
			t.Errorf("chunk %d: reading allocated %d, want at most 2 chunks (%d)", size, read, 2*chunk)
		}
		t.Logf("chunk %d: the writer allocated %d bytes, the reader %d", chunk, wrote, read)
	}
}

// readInPieces reads r to its end in reads of up to n bytes.
func readInPieces(r io.Reader, n int) ([]byte, error) {
	var out []byte
	buf := make([]byte, n)
	for {
		k, err := r.Read(buf)
		out = append(out, buf[:k]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// TestDirectWriterWithoutDirectIO: where the file system refuses O_DIRECT
// (openDirect falls back to the page cache), the writer and the reader still
// move every byte.
func TestDirectWriterWithoutDirectIO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), (directChunk+12345)/16)
	w := newDirectWriter(f, false, directChunk)
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, err = os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	d := newDirectReader(f, false, directChunk)
	got, err := readInPieces(d, 1<<20)
	d.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes of %d that differ (%v)", len(got), len(want), err)
	}
}

// TestDirectWriterFailure: a chunk the goroutine fails to write fails the
// writes after it and the flush, and stop returns.
func TestDirectWriterFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path) // read-only: every write fails
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newDirectWriter(f, false, directChunk)
	defer w.stop()
	chunk := make([]byte, directChunk)
	var werr error
	for i := 0; i < 4 && werr == nil; i++ {
		_, werr = w.Write(chunk)
	}
	if werr == nil {
		t.Fatal("writes to a read-only file succeeded")
	}
	if err := w.flush(); err == nil {
		t.Fatal("flush after a failed write succeeded")
	}
}
