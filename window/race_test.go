//go:build race

package window

// raceEnabled reports a -race build. The engine has no goroutines, so the
// long brute-force comparisons run fewer cases under the race detector
// (which only slows them tenfold here).
const raceEnabled = true
