package wal

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Direct I/O moves a file's bytes between the disk and this process's own
// buffers, bypassing the page cache. A snapshot is written once and read
// back once, and a node holding 100M recipients writes 12.7 GB of it: through
// the page cache that is 12.7 GB of fresh cache pages for the kernel to
// allocate and later reclaim beside the store's own memory, for bytes nobody
// reads again soon. Both directions keep two chunks, so that the disk moves
// one while the caller fills or reads the other; the chunk size is the
// caller's (WriteFileAtomicDirectChunk, OpenDirectChunk), 8 MiB by default,
// so that a process with little memory can spend less on them.
const (
	// directAlign is the alignment direct I/O needs of buffers, file
	// offsets and lengths: 4 KiB covers every logical block size Linux uses.
	directAlign = 4096
	// directChunk is how many bytes each direct read or write moves by
	// default.
	directChunk = 8 << 20
	// firstChunk is the writer's first chunk, which doubles up to the
	// chunk size while the file grows, so that a small file does not cost
	// two chunks of fresh memory.
	firstChunk = 64 << 10
)

// chunkSize returns the chunk size for a caller's size: directChunk for 0
// or less, else size rounded up to a multiple of directAlign.
func chunkSize(size int) int {
	if size <= 0 {
		return directChunk
	}
	return (size + directAlign - 1) &^ (directAlign - 1)
}

// alignedBuffer returns n bytes whose first byte is directAlign-aligned.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1))
	return b[off : off+n : off+n]
}

// directWriter copies writes into aligned chunks and hands each full chunk
// to a goroutine that writes it to f, with direct I/O while direct holds. It
// holds at most two chunks of size bytes, and before those the smaller ones
// it doubled from, copied and dropped: about three chunks in all.
// flush writes the tail: whole blocks directly, the file's last partial
// block through the page cache. stop ends the goroutine and must be called
// once the writer is no longer used. Not safe for concurrent use.
type directWriter struct {
	f      *os.File
	direct bool          // f is open with O_DIRECT; the goroutine's until stop
	size   int           // bytes of a full-size chunk, a multiple of directAlign
	cur    []byte        // the chunk being filled
	n      int           // bytes in cur
	chunks int           // full-size chunks made: at most 2
	full   chan []byte   // chunks for the goroutine to write
	free   chan []byte   // chunks written, to fill again
	done   chan struct{} // closed when the goroutine returns
	failed atomic.Bool   // the goroutine's werr is set
	werr   error         // the goroutine's first error; the caller's after done
	closed bool          // full is closed
}

// newDirectWriter returns a writer to f in chunks of size bytes, a
// multiple of directAlign.
func newDirectWriter(f *os.File, direct bool, size int) *directWriter {
	w := &directWriter{f: f, direct: direct, size: size, cur: alignedBuffer(min(firstChunk, size)),
		full: make(chan []byte, 1), free: make(chan []byte, 2), done: make(chan struct{})}
	if len(w.cur) == size {
		w.chunks++
	}
	go w.loop()
	return w
}

// loop writes the chunks sent on full until it is closed; after an error it
// drops the rest.
func (w *directWriter) loop() {
	defer close(w.done)
	for b := range w.full {
		if w.werr == nil {
			if w.werr = w.write(b); w.werr != nil {
				w.failed.Store(true)
			}
		}
		w.free <- b
	}
}

func (w *directWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if w.failed.Load() {
			w.stop()
			return total - len(p), w.werr
		}
		c := copy(w.cur[w.n:], p)
		w.n += c
		p = p[c:]
		if w.n == len(w.cur) {
			w.next()
		}
	}
	return total, nil
}

// next makes room in cur, which is full: a chunk smaller than w.size is
// replaced by one twice its size (at most w.size) holding its bytes; a
// full-size one goes to the goroutine, and cur becomes the second chunk, or
// the first once the goroutine has written it.
func (w *directWriter) next() {
	if len(w.cur) < w.size {
		b := alignedBuffer(min(2*len(w.cur), w.size))
		copy(b, w.cur)
		w.cur = b
		if len(b) == w.size {
			w.chunks++
		}
		return
	}
	w.full <- w.cur
	if w.chunks < 2 {
		w.cur = alignedBuffer(w.size)
		w.chunks++
	} else {
		w.cur = <-w.free
	}
	w.n = 0
}

// write writes b, a whole number of blocks while w.direct. A file system
// that took O_DIRECT at open but refuses it on a write (EINVAL) gets the
// rest of the file through the page cache; should the refused write have
// written part of b, only the rest is written again.
func (w *directWriter) write(b []byte) error {
	n, err := w.f.Write(b)
	if w.direct && errors.Is(err, syscall.EINVAL) {
		if err = w.buffered(); err == nil {
			_, err = w.f.Write(b[n:])
		}
	}
	return err
}

// buffered turns direct I/O off for the rest of the file.
func (w *directWriter) buffered() error {
	if !w.direct {
		return nil
	}
	w.direct = false
	return setDirect(w.f, false)
}

// stop waits for the chunks handed to the goroutine to be written and ends
// it. It may be called more than once.
func (w *directWriter) stop() {
	if !w.closed {
		w.closed = true
		close(w.full)
	}
	<-w.done
}

// flush writes everything: the chunks handed on, then what cur holds,
// whole blocks directly and the rest of the file's last block through the
// page cache. Nothing may be written after it.
func (w *directWriter) flush() error {
	w.stop()
	if w.werr != nil {
		return w.werr
	}
	whole := w.n
	if w.direct {
		whole &^= directAlign - 1
	}
	if whole > 0 {
		if err := w.write(w.cur[:whole]); err != nil {
			return err
		}
	}
	if whole < w.n {
		if err := w.buffered(); err != nil {
			return err
		}
		if _, err := w.f.Write(w.cur[whole:w.n]); err != nil {
			return err
		}
	}
	w.n = 0
	return nil
}

// OpenDirect is OpenDirectChunk with 8 MiB chunks.
func OpenDirect(path string) (io.ReadCloser, error) { return OpenDirectChunk(path, 0) }

// OpenDirectChunk opens path for reading with direct I/O where its file
// system allows it, and through the page cache where not. A goroutine reads
// ahead one aligned chunk of size bytes (rounded up to a multiple of 4 KiB;
// 0 means 8 MiB), or the file's size if smaller, while the caller reads the
// previous one: the reader holds two chunks. Not safe for concurrent use.
func OpenDirectChunk(path string, size int) (io.ReadCloser, error) {
	f, direct, err := openDirect(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return newDirectReader(f, direct, chunkSize(size)), nil
}

// newDirectReader starts reading f ahead in chunks of size bytes (a
// multiple of directAlign), or of the file's size rounded up to a block if
// that is smaller.
func newDirectReader(f *os.File, direct bool, size int) *directReader {
	if st, err := f.Stat(); err == nil && st.Size() < int64(size) {
		size = int(st.Size()+directAlign) &^ (directAlign - 1)
	}
	d := &directReader{f: f, direct: direct, full: make(chan chunk, 1), free: make(chan []byte, 2),
		quit: make(chan struct{}), done: make(chan struct{})}
	d.free <- alignedBuffer(size)
	d.free <- alignedBuffer(size)
	go d.loop()
	return d
}

// directReader hands its caller the chunks its goroutine reads. After a
// direct read fails with EINVAL, or returns part of a block (the file's
// last), the goroutine reads the rest through the page cache.
type directReader struct {
	f      *os.File
	direct bool // the goroutine's
	cur    chunk
	r      int // cur.data[:r] is returned
	full   chan chunk
	free   chan []byte
	quit   chan struct{} // closed by Close
	done   chan struct{} // closed when the goroutine returns
	closed bool          // Close was called
}

// chunk is one read of the goroutine: data is a prefix of buf; err is io.EOF
// or the error that ended the file's data after it.
type chunk struct {
	buf, data []byte
	err       error
}

func (d *directReader) loop() {
	defer close(d.done)
	var off int64
	for {
		var b []byte
		select {
		case b = <-d.free:
		case <-d.quit:
			return
		}
		n, err := d.fill(b, off)
		off += int64(n)
		select {
		case d.full <- chunk{buf: b, data: b[:n], err: err}:
		case <-d.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

// fill reads into b from offset off until b is full (nil error) or the
// file ends (io.EOF) or a read fails.
func (d *directReader) fill(b []byte, off int64) (int, error) {
	w := 0
	for w < len(b) {
		n, err := pread(d.f, b[w:], off+int64(w))
		if d.direct && errors.Is(err, syscall.EINVAL) {
			// The file system took O_DIRECT at open and refuses it now.
			d.direct = false
			if err = setDirect(d.f, false); err == nil {
				continue
			}
		}
		if err != nil {
			return w, err
		}
		if n == 0 {
			return w, io.EOF
		}
		w += n
		if d.direct && n&(directAlign-1) != 0 {
			// The next offset is not aligned: read on through the cache.
			d.direct = false
			if err := setDirect(d.f, false); err != nil {
				return w, err
			}
		}
	}
	return w, nil
}

func (d *directReader) Read(p []byte) (int, error) {
	for d.r == len(d.cur.data) {
		if d.cur.err != nil {
			return 0, d.cur.err
		}
		if d.cur.buf != nil {
			d.free <- d.cur.buf
		}
		d.cur, d.r = <-d.full, 0
	}
	n := copy(p, d.cur.data[d.r:])
	d.r += n
	return n, nil
}

// Close ends the read-ahead and closes the file. A second Close returns
// os.ErrClosed, as an *os.File's does.
func (d *directReader) Close() error {
	if d.closed {
		return os.ErrClosed
	}
	d.closed = true
	close(d.quit)
	<-d.done
	return d.f.Close()
}
