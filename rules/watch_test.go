package rules

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// watchLog records what Watch reported.
type watchLog struct {
	sets   []*Set
	errors []string
}

func startWatch(t *testing.T, path string, now chan struct{}) (*watchLog, context.CancelFunc, <-chan error) {
	t.Helper()
	wl := &watchLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		done <- Watch(ctx, path, WatchConfig{Interval: time.Second, Now: now,
			Reload: func(rs *Set) { wl.sets = append(wl.sets, rs) },
			Failed: func(err error) { wl.errors = append(wl.errors, err.Error()) }})
	}()
	t.Cleanup(func() { cancel(); <-exited }) // a failed test still ends Watch inside the bubble
	return wl, cancel, done
}

// tick lets Watch read the file once more and settle.
func tick() {
	time.Sleep(time.Second)
	synctest.Wait()
}

func limitYAML(limit string) string {
	return strings.Replace(string(DefaultYAML()), "limit: 15", "limit: "+limit, 1)
}

func TestWatchReloadsChangedFilesAndReportsBadOnesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		write := func(s string) {
			if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(string(DefaultYAML()))
		now := make(chan struct{})
		wl, cancel, done := startWatch(t, path, now)

		tick()
		if len(wl.sets)+len(wl.errors) != 0 {
			t.Fatalf("unchanged file: %d reloads, errors %q", len(wl.sets), wl.errors)
		}
		write(limitYAML("30"))
		tick()
		if len(wl.sets) != 1 || wl.sets[0].Domain("default").Rule(0).Limit != 30 {
			t.Fatalf("after an edit: %d reloads, want 1 with limit 30", len(wl.sets))
		}
		tick()
		if len(wl.sets) != 1 {
			t.Fatalf("no change since: %d reloads, want still 1", len(wl.sets))
		}

		write(limitYAML("0")) // invalid
		tick()
		tick()
		tick()
		if len(wl.sets) != 1 || len(wl.errors) != 1 {
			t.Fatalf("a bad file for 3 reads: %d reloads, errors %q; want 1 reload, 1 error", len(wl.sets), wl.errors)
		}
		if want := path + ":8:"; !strings.Contains(wl.errors[0], want) || !strings.Contains(wl.errors[0], "limit 0") {
			t.Fatalf("error %q does not name %s and the field", wl.errors[0], want)
		}
		now <- struct{}{} // SIGHUP on a bad file reports it again
		synctest.Wait()
		if len(wl.errors) != 2 {
			t.Fatalf("forced read of a bad file: errors %q, want 2", wl.errors)
		}

		write(limitYAML("20"))
		tick()
		if len(wl.sets) != 2 || wl.sets[1].Domain("default").Rule(0).Limit != 20 {
			t.Fatalf("after fixing the file: %d reloads, want 2 with limit 20", len(wl.sets))
		}
		now <- struct{}{} // SIGHUP on an unchanged file reloads it
		synctest.Wait()
		if len(wl.sets) != 3 || wl.sets[2].Hash() != wl.sets[1].Hash() {
			t.Fatalf("forced read: %d reloads, want 3, the last the same rules", len(wl.sets))
		}

		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		tick()
		tick()
		if len(wl.errors) != 3 || !strings.Contains(wl.errors[2], "no such file") {
			t.Fatalf("removed file: errors %q, want one more naming it", wl.errors)
		}
		write(limitYAML("20"))
		tick()
		if len(wl.sets) != 4 {
			t.Fatalf("file back: %d reloads, want 4", len(wl.sets))
		}
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("Watch returned %v, want context.Canceled", err)
		}
	})
}

// A Kubernetes ConfigMap volume holds rules.yaml -> ..data/rules.yaml and
// ..data -> ..<timestamp>/; an update writes a new timestamped directory and
// renames a new ..data symlink over the old one.
func TestWatchSeesAConfigMapSymlinkSwap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		version := func(name, content string) {
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, "rules.yaml"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(name, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		version("..2026_11_23_1", string(DefaultYAML()))
		path := filepath.Join(dir, "rules.yaml")
		if err := os.Symlink(filepath.Join("..data", "rules.yaml"), path); err != nil {
			t.Fatal(err)
		}
		wl, cancel, done := startWatch(t, path, nil)
		tick()
		version("..2026_11_23_2", limitYAML("40"))
		tick()
		if len(wl.sets) != 1 || wl.sets[0].Domain("default").Rule(0).Limit != 40 || len(wl.errors) != 0 {
			t.Fatalf("after the swap: %d reloads, errors %q; want 1 with limit 40", len(wl.sets), wl.errors)
		}
		cancel()
		<-done
	})
}
