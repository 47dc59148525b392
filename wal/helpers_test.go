package wal

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	t0 = int64(1_700_000_000_000_000_000) // unix ns
	d  = int64(time.Second)
)

// testClock is a clock the test sets: t0 + k*d.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(t0)
	return c
}

func (c *testClock) Now() int64       { return c.ns.Load() }
func (c *testClock) set(k int64)      { c.ns.Store(t0 + k*d) }
func (c *testClock) at(k int64) int64 { return t0 + k*d }

// logRecorder collects the log's output for assertions.
type logRecorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *logRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

func (r *logRecorder) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// openT opens a Log and closes it at the end of the test unless the test did.
func openT(t testing.TB, opts Options) *Log {
	t.Helper()
	l, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type rec struct {
	pos     Position
	payload string
}

func replayAll(t testing.TB, l *Log, from Position) []rec {
	t.Helper()
	var got []rec
	err := l.Replay(from, func(pos Position, p []byte) error {
		got = append(got, rec{pos, string(p)})
		return nil
	})
	if err != nil {
		t.Fatalf("Replay(%v): %v", from, err)
	}
	return got
}

func appendT(t testing.TB, l *Log, payload string) rec {
	t.Helper()
	pos, err := l.Append(context.Background(), []byte(payload))
	if err != nil {
		t.Fatalf("Append(%q): %v", payload, err)
	}
	return rec{pos, payload}
}

func payloads(rs []rec) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.payload
	}
	return out
}

func equalRecs(t testing.TB, got, want []rec) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("records differ\n got %v\nwant %v", got, want)
	}
}

// copyDir copies the regular files of src into a new directory.
func copyDir(t testing.TB, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// gate holds the flusher in testHookFlush, after it takes a batch and before
// it writes it: step lets one batch through, release all of them.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate     { return &gate{ch: make(chan struct{})} }
func (g *gate) wait()    { <-g.ch }
func (g *gate) step()    { g.ch <- struct{}{} }
func (g *gate) release() { g.once.Do(func() { close(g.ch) }) }

// spareHook returns an Options.testHookPrepared that reports on the returned
// channel that the preparer made a spare segment ready for a cut. Reports
// that nobody received yet coalesce, so that the hook never blocks.
func spareHook() (func(), <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

func allZero(b []byte) bool { return zeroSuffix(b) == len(b) }

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
