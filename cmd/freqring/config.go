package main

import (
	"flag"
	"strings"
	"time"

	"github.com/freqring/freqring/internal/suggest"
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
	if s := suggest.Closest(key, keys); s != "" {
		return usagef("%s: unknown key %q (did you mean %q?)", path, key, s)
	}
	return usagef("%s: unknown key %q; the keys are the flags' names with _ for -: %s", path, key, configKeys(fs))
}
