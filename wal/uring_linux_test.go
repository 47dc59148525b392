//go:build linux

package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newURingT returns a ring, or skips the test where the kernel or a
// seccomp profile refuses io_uring (the log then uses fsync(2), which the
// other tests cover with PlainFsync).
func newURingT(t *testing.T) *uring {
	t.Helper()
	u, err := newURing()
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	t.Cleanup(u.close)
	return u
}

func TestURingParamsLayout(t *testing.T) {
	if got := unsafe.Sizeof(ioUringParams{}); got != 120 {
		t.Fatalf("sizeof(io_uring_params) = %d, want 120", got)
	}
}

// TestURingFsync: the ring fsyncs a file, reports fsync's own errors for a
// descriptor that cannot be fsynced (a pipe: EINVAL; a closed one: EBADF)
// and goes on working after them.
func TestURingFsync(t *testing.T) {
	u := newURingT(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	closed, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	for i, tc := range []struct {
		fd   int
		want error
	}{
		{int(f.Fd()), nil},
		{int(w.Fd()), unix.EINVAL},
		{int(f.Fd()), nil},
		{closed, unix.EBADF},
		{int(f.Fd()), nil},
	} {
		if _, err := f.WriteString(fmt.Sprintf("record %d\n", i)); err != nil {
			t.Fatal(err)
		}
		ok, err := u.fsync(tc.fd)
		if !ok || !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Fatalf("fsync %d (fd %d) = %v, %v; want true, %v", i, tc.fd, ok, err, tc.want)
		}
	}
}

// TestURingGivesUpWithoutCompletion: a wait whose completion never comes
// (here: nothing was submitted) ends at its deadline with !ok, so the
// caller fsyncs another way instead of holding the segment for good.
func TestURingGivesUpWithoutCompletion(t *testing.T) {
	u := newURingT(t)
	start := time.Now()
	ok, err := u.wait(start.Add(50 * time.Millisecond))
	if ok || err == nil || !strings.Contains(err.Error(), "no completion") {
		t.Fatalf("wait with nothing in flight = %v, %v; want false, no completion", ok, err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("wait took %v past a 50ms deadline", took)
	}
}

// TestLogFsyncPaths: a log fsyncs through the ring by default where there
// is one, and with fsync(2) under PlainFsync; when the ring breaks (here:
// its eventfd closed under it) the log says so once and goes on with
// fsync(2), losing no record.
func TestLogFsyncPaths(t *testing.T) {
	newURingT(t) // skips where there is no io_uring
	plain := openT(t, Options{Dir: t.TempDir(), PlainFsync: true})
	if plain.ur != nil {
		t.Fatal("PlainFsync: the log has an io_uring")
	}
	appendT(t, plain, "plain")
	if st := plain.Stats(); st.Fsyncs == 0 {
		t.Fatalf("PlainFsync: no fsync counted: %+v", st)
	}

	var logs logRecorder
	dir := t.TempDir()
	l := openT(t, Options{Dir: dir, Logger: logs.logger()})
	if l.ur == nil {
		t.Fatal("the log has no io_uring, though newURing works here")
	}
	var want []rec
	want = append(want, appendT(t, l, "through the ring"))
	l.ur.ev.Close()
	for i := range 3 {
		want = append(want, appendT(t, l, fmt.Sprintf("after the ring broke %d", i)))
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "io_uring failed"); n != 1 {
		t.Fatalf("%d warnings of a broken ring, want 1:\n%s", n, logs.String())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	equalRecs(t, replayAll(t, openT(t, Options{Dir: dir, PlainFsync: true}), Position{}), want)
}
