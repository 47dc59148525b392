//go:build race

package store

// raceEnabled reports a -race build, whose sync.Pool drops items at random
// (so allocation counts mean nothing).
const raceEnabled = true
