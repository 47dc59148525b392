package main

import (
	"context"
	"errors"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"testing/synctest"
	"time"
)

func TestParseSize(t *testing.T) {
	f := func(in string, want int64) {
		t.Helper()
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	f("0", 0)
	f("1073741824", 1<<30)
	f("1024B", 1024)
	f("12GiB", 12<<30)
	f("800MiB", 800<<20)
	f("1.5GiB", 3<<29)
	f("2Gi", 2<<30)
	f("64KiB", 64<<10)
	f("1TiB", 1<<40)
	bad := func(in, want string) {
		t.Helper()
		if got, err := parseSize(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseSize(%q) = %d, %v; want an error containing %q", in, got, err, want)
		}
	}
	bad("", "want a size such as 12GiB")
	bad("12GB", `unit "GB" is not one of B, KiB, MiB, GiB, TiB`)
	bad("12G", `unit "G" is not one of`)
	bad("12 GiB", "want a size such as")
	bad("-1", "want a size such as")
	bad("1.5", "want a size such as") // a fraction of a byte
	bad("1.2.3GiB", "want a size such as")
	bad("GiB", "want a size such as")
	bad("99999999999TiB", "more than")
}

func TestMaxMemoryFlag(t *testing.T) {
	none := fstest.MapFS{}
	for _, tc := range []struct {
		v    string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"12GiB", 12 << 30, ""},
		{"800MiB", 800 << 20, ""},
		{"auto", 0, ""}, // no cgroup limit and no /proc/meminfo
		{"12GB", 0, `--max-memory "12GB": unit "GB"`},
		{"lots", 0, `--max-memory "lots": unit "lots"`},
		{"100MiB", 0, `--max-memory "100MiB": 104857600 bytes is below the least a node runs in, 128MiB`},
	} {
		got, _, err := maxMemory(tc.v, none)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, new(usageError)) {
				t.Errorf("%q: %d, %v; want a usage error containing %q", tc.v, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %d, %v; want %d", tc.v, got, err, tc.want)
		}
	}
	// Without a cgroup limit, auto takes 90% of the machine's memory.
	host := fstest.MapFS{"proc/meminfo": {Data: []byte("MemTotal:       24576000 kB\nMemFree:         1000 kB\n")}}
	if got, from, err := maxMemory("auto", host); err != nil || got != 24576000*1024*9/10 || !strings.Contains(from, "machine's memory") {
		t.Errorf("auto without a cgroup limit: %d (%s), %v; want 90%% of MemTotal", got, from, err)
	}
	// auto takes 90% of the cgroup's limit, before the machine's memory.
	host["sys/fs/cgroup/memory.max"] = &fstest.MapFile{Data: []byte("2147483648\n")}
	if got, _, err := maxMemory("auto", host); err != nil || got != 1932735283 {
		t.Errorf("auto under a 2GiB cgroup on a bigger machine: %d, %v; want 90%% of the cgroup's", got, err)
	}
	v2 := fstest.MapFS{"sys/fs/cgroup/memory.max": {Data: []byte("2147483648\n")}}
	if got, from, err := maxMemory("auto", v2); err != nil || got != 1932735283 || !strings.Contains(from, "/sys/fs/cgroup/memory.max") {
		t.Errorf("auto under a 2GiB cgroup: %d (%s), %v; want 90%%", got, from, err)
	}
	small := fstest.MapFS{"sys/fs/cgroup/memory.max": {Data: []byte("134217728\n")}}
	if _, _, err := maxMemory("auto", small); err == nil || !strings.Contains(err.Error(), "--max-memory auto: 90% of the cgroup memory limit 134217728 bytes") {
		t.Errorf("auto under a 128MiB cgroup: %v", err)
	}
	// A bad value on the command line stops serve before it listens: exit 2.
	code, _, errOut := runCmd(context.Background(), "serve", "--max-memory", "12GB", "--listen", "127.0.0.1:0")
	if code != 2 || !strings.Contains(errOut, `--max-memory "12GB"`) {
		t.Errorf("serve --max-memory 12GB: exit %d, %s", code, errOut)
	}
}

func TestCgroupMemoryLimit(t *testing.T) {
	const unlimitedV1 = "9223372036854771712\n"
	for _, tc := range []struct {
		name string
		fs   fstest.MapFS
		want int64
		file string
		err  string
	}{
		{name: "no cgroup files", fs: fstest.MapFS{}},
		{name: "v2 in a container (own namespace)", fs: fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("2147483648\n")},
		}, want: 2 << 30, file: "sys/fs/cgroup/memory.max"},
		{name: "v2 max means none", fs: fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("max\n")},
		}},
		{name: "v2 host view: the process's cgroup and a smaller parent", fs: fstest.MapFS{
			"proc/self/cgroup":                           {Data: []byte("0::/kubepods/pod1/ctr\n")},
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": {Data: []byte("4294967296\n")},
			"sys/fs/cgroup/kubepods/pod1/memory.max":     {Data: []byte("3221225472\n")},
			"sys/fs/cgroup/kubepods/memory.max":          {Data: []byte("max\n")},
		}, want: 3 << 30, file: "sys/fs/cgroup/kubepods/pod1/memory.max"},
		{name: "v1 in a container (mount root is the container's cgroup)", fs: fstest.MapFS{
			"proc/self/cgroup":                           {Data: []byte("12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")},
			"sys/fs/cgroup/memory/memory.limit_in_bytes": {Data: []byte("1073741824\n")},
		}, want: 1 << 30, file: "sys/fs/cgroup/memory/memory.limit_in_bytes"},
		{name: "v1 host view, unlimited", fs: fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("4:memory:/jobs/a\n0::/\n")},
			"sys/fs/cgroup/memory/jobs/a/memory.limit_in_bytes": {Data: []byte(unlimitedV1)},
			"sys/fs/cgroup/memory/memory.limit_in_bytes":        {Data: []byte(unlimitedV1)},
		}},
		{name: "v1 controllers listed together", fs: fstest.MapFS{
			"proc/self/cgroup": {Data: []byte("3:cpu,memory:/jobs/b\n")},
			"sys/fs/cgroup/memory/jobs/b/memory.limit_in_bytes": {Data: []byte("536870912\n")},
		}, want: 512 << 20, file: "sys/fs/cgroup/memory/jobs/b/memory.limit_in_bytes"},
		{name: "a path that climbs out is cut at the top", fs: fstest.MapFS{
			"proc/self/cgroup":         {Data: []byte("0::/../..\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")},
		}, want: 1 << 30, file: "sys/fs/cgroup/memory.max"},
		{name: "garbage", fs: fstest.MapFS{
			"sys/fs/cgroup/memory.max": {Data: []byte("lots\n")},
		}, err: `/sys/fs/cgroup/memory.max: "lots" is not a memory limit in bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, file, err := cgroupMemoryLimit(tc.fs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%d, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || file != tc.file {
				t.Fatalf("%d from %q, %v; want %d from %q", got, file, err, tc.want, tc.file)
			}
		})
	}
}

func TestHugePageMode(t *testing.T) {
	for data, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise never\n":   "",
	} {
		root := fstest.MapFS{"sys/kernel/mm/transparent_hugepage/enabled": {Data: []byte(data)}}
		if got := hugePageMode(root); got != want {
			t.Errorf("%q: %q, want %q", data, got, want)
		}
	}
	if got := hugePageMode(fstest.MapFS{}); got != "" {
		t.Errorf("no file: %q", got)
	}
}

// TestFollowMappedMemory checks that the Go runtime's memory limit follows
// the memory outside it (the store's mappings, the binary's pages) within a
// period, and stops following when the context ends.
func TestFollowMappedMemory(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	const budget = int64(1) << 50 // far above anything this test holds
	synctest.Test(t, func(t *testing.T) {
		var mapped atomic.Int64
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			followOutside(ctx, budget, mapped.Load, time.Second)
			close(done)
		}()
		synctest.Wait()
		mapped.Store(1 << 40)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := debug.SetMemoryLimit(-1); got != budget-1<<40 {
			t.Fatalf("limit %d after the store mapped 1 TiB, want %d", got, budget-1<<40)
		}
		cancel()
		<-done
		mapped.Store(2 << 40)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := debug.SetMemoryLimit(-1); got != budget-1<<40 {
			t.Fatalf("limit changed to %d after the follower stopped", got)
		}
	})
}

// TestFollowMappedMemoryCountsResidentPages: on Linux the limit serve
// follows leaves out the binary's resident pages too, beside the store's
// mapped memory.
func TestFollowMappedMemoryCountsResidentPages(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/status")
	}
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	const budget = int64(1) << 50
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			followMappedMemory(ctx, budget, func() int64 { return 1 << 40 }, time.Second)
			close(done)
		}()
		synctest.Wait()
		if got := debug.SetMemoryLimit(-1); got >= budget-1<<40 || got < budget-1<<40-1<<30 {
			t.Fatalf("limit %d, want below budget - mapped (%d) by the binary's pages", got, budget-1<<40)
		}
		cancel()
		<-done
	})
}
