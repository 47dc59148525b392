//go:build !linux

package store

import "errors"

type mapping struct{ whole, aligned []byte }

// mapAligned refuses: chunks come from the Go heap on this platform.
func mapAligned(size, align, huge int) (mapping, error) { return mapping{}, errors.ErrUnsupported }

func unmapRegion(r []byte) {}

func inside(p *byte, r []byte) bool { return false }
