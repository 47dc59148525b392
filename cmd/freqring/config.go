package main

import (
	"flag"
	"strings"
	"time"
)

// expectedForm describes the values flag f takes, for an error about a
// config-file value that f refused with err.
func expectedForm(f *flag.Flag, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	switch g.Get().(type) {
	case int, int64:
		return "an integer, such as " + f.DefValue
	case uint, uint64:
		return "a non-negative integer, such as " + f.DefValue
	case float64:
		return "a number, such as " + f.DefValue
	case bool:
		return "true or false"
	case time.Duration:
		return "a duration with its unit, such as 5ms, 10s or 1m"
	}
	return err.Error()
}

// configKeys lists the keys a config file may set: the names of fs's flags
// with _ for -, except config itself and check-config.
func configKeys(fs *flag.FlagSet) string {
	var keys []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && f.Name != "check-config" {
			keys = append(keys, strings.ReplaceAll(f.Name, "-", "_"))
		}
	})
	return strings.Join(keys, ", ")
}

// unknownConfigKey is the error for a config file's key that names no flag
// of fs: the closest key when one is close, else every key.
func unknownConfigKey(path, key string, fs *flag.FlagSet) error {
	var keys []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && f.Name != "check-config" {
			keys = append(keys, strings.ReplaceAll(f.Name, "-", "_"))
		}
	})
	if s := closest(key, keys); s != "" {
		return usagef("%s: unknown key %q (did you mean %q?)", path, key, s)
	}
	return usagef("%s: unknown key %q; the keys are the flags' names with _ for -: %s", path, key, configKeys(fs))
}

// closest is the candidate nearest to word in edit distance, if it is
// close: at most 1 edit for words of up to 4 bytes, 2 for longer ones, with
// case, _ and - not counted; "" if none is.
func closest(word string, candidates []string) string {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", "-") }
	best, bestD := "", -1
	for _, c := range candidates {
		if d := editDistance(norm(word), norm(c)); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	limit := 2
	if len(word) <= 4 {
		limit = 1
	}
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
