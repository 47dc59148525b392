package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dirState is every file under dir with its content, except the lock file.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == LockFile {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestSecondNodeOnDataDirFailsAndTouchesNothing is issue 12 case 1: a second
// node on a data directory in use fails at Open, naming the directory and the
// holder, and neither its Open nor its Close changes a file of the first's.
func TestSecondNodeOnDataDirFailsAndTouchesNothing(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	cfg := durableConfig(t, dir, clk)
	cfg.SegmentBytes = 4 << 10 // several segments, so that sealed and active ones exist
	a := openNode(t, cfg)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 100 {
		if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
			t.Fatal(err)
		}
	}
	before := dirState(t, dir)

	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Open(context.Background())
	if !errors.Is(err, ErrDataDirLocked) || !strings.Contains(err.Error(), dir) ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid=%d ", os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrDataDirLocked naming %s and pid %d", err, dir, os.Getpid())
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close of the node that failed to open: %v", err)
	}
	after := dirState(t, dir)
	for path, content := range before {
		if after[path] != content {
			t.Errorf("%s changed by the second node (%d bytes, was %d)", path, len(after[path]), len(content))
		}
	}
	for path := range after {
		if _, ok := before[path]; !ok {
			t.Errorf("%s created by the second node", path)
		}
	}

	// The first node goes on; once it is closed the directory is free again.
	for range 20 {
		if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
			t.Fatal(err)
		}
	}
	want := peekAll(t, a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c := openNode(t, cfg)
	defer c.Close()
	got := peekAll(t, c)
	for i := range want {
		if fmt.Sprint(want[i].Used) != fmt.Sprint(got[i].Used) {
			t.Fatalf("peek %d after restart: used %v, want %v", i, got[i].Used, want[i].Used)
		}
	}
}
