package store

import (
	"fmt"

	"github.com/freqring/freqring/window"
)

// Explain judges it (as a peek) for the recipient with key hash key and
// verifier tag in partition p at now (unix ms), and lists what each rule
// of r counts (window.Domain.Explain). It changes nothing and fails with
// ErrClosed while the partition is closed (moving). Safe for concurrent
// use: it holds the partition's lock.
func (s *Store) Explain(p int, r Ref, key uint64, tag uint16, now int64, it window.Item) (window.Explanation, error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.closed {
		return window.Explanation{}, fmt.Errorf("%w: partition %d", ErrClosed, p)
	}
	var rec []byte
	if sp := pt.space(r.id, false); sp != nil {
		_, rec, _ = sp.lookup(storedKey(key), tag)
	}
	return r.rules.Explain(&pt.scratch, rec, tag, now, it)
}
