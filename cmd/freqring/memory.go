package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/freqring/freqring/node"
)

// This file resolves serve's --max-memory: a size, 0 for no limit, or auto
// (a fraction of the container's cgroup memory limit, when there is one, or
// else of the machine's memory).

// cgroupShare is the part of a cgroup's memory limit that --max-memory auto
// takes, as a fraction: the rest is for what the Go runtime does not
// govern (the binary, thread stacks outside the heap, the kernel's
// accounting of the WAL's page cache that is not reclaimed at once).
const cgroupShare = 0.9

// maxMemory resolves the value of --max-memory: auto (the default) reads the
// cgroup limit from root (the file system at /). It returns the budget in
// bytes (0: no limit) and how it was found, for the log.
func maxMemory(v string, root fs.FS) (int64, string, error) {
	if v != "auto" {
		n, err := parseSize(v)
		if err != nil {
			return 0, "", usagef("--max-memory %q: %v", v, err)
		}
		if n != 0 && n < node.MinMaxMemory {
			return 0, "", usagef("--max-memory %q: %d bytes is below the least a node runs in, 128MiB (0 means no limit)", v, n)
		}
		return n, "--max-memory", nil
	}
	limit, file, err := cgroupMemoryLimit(root)
	if err != nil {
		return 0, "", fmt.Errorf("--max-memory auto: %w", err)
	}
	if limit == 0 {
		// No container limit: the machine's memory is the limit. Without
		// one, the Go heap may grow to twice what is live before it
		// collects: at 100M recipients, 28 GB on a 24 GiB machine.
		total, err := memTotal(root)
		if err != nil || total == 0 {
			return 0, "no cgroup memory limit, and no MemTotal in /proc/meminfo", nil
		}
		return int64(float64(total) * cgroupShare), fmt.Sprintf("%.0f%% of the machine's memory (no cgroup memory limit; /proc/meminfo MemTotal %d bytes)", cgroupShare*100, total), nil
	}
	n := int64(float64(limit) * cgroupShare)
	if n < node.MinMaxMemory {
		return 0, "", usagef("--max-memory auto: %.0f%% of the cgroup memory limit %d bytes (/%s) is below the least a node runs in, 128MiB: raise the limit, or set --max-memory 0 for no limit", cgroupShare*100, limit, file)
	}
	return n, fmt.Sprintf("%.0f%% of the cgroup memory limit %d bytes (/%s)", cgroupShare*100, limit, file), nil
}

// memTotal returns the machine's memory in bytes from proc/meminfo under
// root, 0 if it has no MemTotal line.
func memTotal(root fs.FS) (int64, error) {
	b, err := fs.ReadFile(root, "proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 || kb > math.MaxInt64>>10 {
				return 0, fmt.Errorf("/proc/meminfo: bad MemTotal %q", f[1])
			}
			return kb << 10, nil
		}
	}
	return 0, nil
}

// followMappedMemory keeps the Go runtime's memory limit at
// node.GoMemoryLimit(budget, mapped()+node.ResidentOutsideGo()) as the store
// maps memory outside the heap and the binary's pages come and go, reading
// both every period, until ctx is done.
func followMappedMemory(ctx context.Context, budget int64, mapped func() int64, period time.Duration) {
	followOutside(ctx, budget, func() int64 { return mapped() + node.ResidentOutsideGo() }, period)
}

// followOutside keeps the Go runtime's memory limit at
// node.GoMemoryLimit(budget, outside()), reading outside every period,
// until ctx is done.
func followOutside(ctx context.Context, budget int64, outside func() int64, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	last := budget
	for {
		if limit := node.GoMemoryLimit(budget, outside()); limit != last {
			debug.SetMemoryLimit(limit)
			last = limit
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// hugePageMode returns the kernel's transparent huge page mode (always,
// madvise or never) from sys/kernel/mm/transparent_hugepage/enabled under
// root, "" if it cannot tell. The Go heap gets huge pages only with always;
// the store's mapped slabs with madvise too.
func hugePageMode(root fs.FS) string {
	b, err := fs.ReadFile(root, "sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	for _, f := range strings.Fields(string(b)) {
		if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
			return f[1 : len(f)-1]
		}
	}
	return ""
}

// sizeUnits are the units parseSize takes: powers of 1024, spelled as
// GOMEMLIMIT spells them or as Kubernetes quantities do.
var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
}

// parseSize parses a byte size: a non-negative number (with a fraction
// only when it has a unit) and an optional unit of sizeUnits, such as
// 12GiB, 1.5GiB, 800Mi, 1073741824 or 0.
func parseSize(s string) (int64, error) {
	num := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	unit := s[len(num):]
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("unit %q is not one of B, KiB, MiB, GiB, TiB (powers of 1024; Ki, Mi, Gi, Ti also do); want a size such as 12GiB or 800MiB, or 0 for no limit", unit)
	}
	if num == "" || strings.Trim(num, "0123456789.") != "" || strings.Count(num, ".") > 1 || (mult == 1 && strings.Contains(num, ".")) {
		return 0, fmt.Errorf("want a size such as 12GiB, 800MiB or 1073741824 (bytes), or 0 for no limit")
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("want a size such as 12GiB, 800MiB or 1073741824 (bytes), or 0 for no limit")
	}
	b := f * float64(mult)
	if b >= math.MaxInt64 {
		return 0, fmt.Errorf("more than %d bytes", int64(math.MaxInt64))
	}
	if mult == 1 {
		return strconv.ParseInt(num, 10, 64) // exact
	}
	return int64(b), nil
}

// cgroupUnlimited is the least cgroup v1 value that means no limit: the
// kernel reports an unset limit as about 2^63 rounded down to a page.
const cgroupUnlimited = 1 << 62

// cgroupMemoryLimit returns the memory limit, in bytes, of the cgroup this
// process runs in, with the file it came from (a path in root), or 0 if
// there is none. root is the file system at /: it reads proc/self/cgroup
// for the process's cgroup paths, then, for each directory from that path
// up to the top, cgroup v2's sys/fs/cgroup/<dir>/memory.max and cgroup
// v1's sys/fs/cgroup/memory/<dir>/memory.limit_in_bytes, and returns the
// smallest limit set. Walking up finds the limit both when the cgroup
// file system is the container's own (its path is "/") and when it is the
// host's, and a parent's smaller limit. Files that do not exist are
// skipped; a file that does not parse is an error naming it.
func cgroupMemoryLimit(root fs.FS) (limit int64, file string, err error) {
	v1, v2 := "/", "/"
	if b, err := fs.ReadFile(root, "proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			// hierarchy-ID:controller-list:cgroup-path
			id, rest, ok1 := strings.Cut(line, ":")
			ctrls, p, ok2 := strings.Cut(rest, ":")
			switch {
			case !ok1 || !ok2:
			case id == "0" && ctrls == "":
				v2 = p
			case hasController(ctrls, "memory"):
				v1 = p
			}
		}
	}
	var found int64
	try := func(name string, v2 bool) error {
		b, err := fs.ReadFile(root, name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		s := strings.TrimSpace(string(b))
		if v2 && s == "max" {
			return nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("/%s: %q is not a memory limit in bytes", name, s)
		}
		if !v2 && n >= cgroupUnlimited {
			return nil
		}
		if found == 0 || n < found {
			found, file = n, name
		}
		return nil
	}
	for _, dir := range ancestors(v2) {
		if err := try(path.Join("sys/fs/cgroup", dir, "memory.max"), true); err != nil {
			return 0, "", err
		}
	}
	for _, dir := range ancestors(v1) {
		if err := try(path.Join("sys/fs/cgroup/memory", dir, "memory.limit_in_bytes"), false); err != nil {
			return 0, "", err
		}
	}
	return found, file, nil
}

// hasController reports whether a comma-separated controller list names c.
func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// ancestors returns a cgroup path and each of its parents, relative and
// cleaned, ending with "." (the top): "/a/b" gives a/b, a, ".".
func ancestors(p string) []string {
	p = strings.Trim(path.Clean("/"+p), "/")
	var out []string
	for p != "" && p != "." {
		if !fs.ValidPath(p) {
			break // ".." and the like: not a path in this file system
		}
		out = append(out, p)
		p = path.Dir(p)
	}
	return append(out, ".")
}
