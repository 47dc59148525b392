//go:build linux

package node

// Test helpers of package node for its external tests (package node_test).
var (
	SmallDisk = smallDisk
	FillDisk  = fillDisk
)
