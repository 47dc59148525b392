package store

import (
	"errors"
	"fmt"

	"github.com/freqring/freqring/window"
)

// ErrRefundUnknown reports a refund whose request id names no send the
// store remembers for the recipient: never recorded with that id, or
// recorded longer ago than the id horizon (Config.IDHorizon).
var ErrRefundUnknown = errors.New("store: no recorded send with this request id")

// Refund takes back the send that request id recorded for the recipient with
// key hash key and tag in domain r, in partition p (open), so that it no
// longer counts (window.Domain.Remove). it carries the send's content: a
// content the id's send is known not to have fails with ErrIDReused; its cost
// is the send's when the store knows it, else it.Cost. A refund is done once:
// a refund of an id refunded before changes nothing and returns again. A
// refund gets seq, its partition's next sequence number, as a recorded send
// does, so that it reaches the WAL and the backup in order; cost is that of
// the send taken back. dec is filled as a peek of the recipient at now after
// the refund, with At the refunded send's time (for the WAL), Admitted set and
// Recorded not. An id the store does not remember fails with
// ErrRefundUnknown.
func (s *Store) Refund(p int, r Ref, key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (seq uint64, cost int, again bool, err error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return s.refund(pt, p, &pt.scratch, r, key, tag, now, it, id, dec)
}

// refund is Refund with partition p's lock held; pt is &s.parts[p].
func (s *Store) refund(pt *partition, p int, ws *window.Scratch, r Ref, key uint64, tag uint16, now int64, it window.Item, id uint64, dec *window.Decision) (seq uint64, cost int, again bool, err error) {
	key = storedKey(key)
	if pt.closed {
		return 0, 0, false, fmt.Errorf("%w: partition %d", ErrClosed, p)
	}
	sp := pt.space(r.id, false)
	var e idEntry
	ok := false
	if sp != nil && id != 0 {
		e, ok = sp.ids.get(idKey(id, key), now, s.idHorizon)
	}
	if !ok {
		return 0, 0, false, fmt.Errorf("%w: request id %d, within the last %d ms", ErrRefundUnknown, id, s.idHorizon)
	}
	want := printOf(it, false)
	want.cost = 0 // the refund's cost is the send's
	if f := want.mismatch(e.idPrint); f != "" {
		return 0, 0, false, fmt.Errorf("%w: request id %d recorded a send of other %s than the refund's", ErrIDReused, id, f)
	}
	if e.cost != 0 {
		it.Cost = int(e.cost)
	}
	cost = max(it.Cost, 1)
	if !e.refunded {
		if err := s.unrecord(pt, sp, ws, r, key, tag, e.at, it); err != nil {
			return 0, 0, false, err
		}
		sp.ids.markRefunded(idKey(id, key))
		pt.seq++
		seq = pt.seq
	}
	_, rec, _ := sp.lookup(key, tag)
	if _, err := r.rules.Apply(ws, rec, tag, now, window.Item{Content: it.Content, Mode: window.Peek}, dec); err != nil {
		return 0, 0, false, err
	}
	dec.Admitted, dec.Recorded, dec.DeniedBy, dec.RetryAfter, dec.At = true, false, -1, 0, e.at
	for i := range dec.NumRules {
		dec.Rules[i].RetryAfter = 0
	}
	return seq, cost, e.refunded, nil
}

// Unrecord takes back a send recorded at time at (unix ms), as Refund does,
// in partition p whether open or closed: a node replays a refund from its WAL
// this way, and a backup applies its owner's. A refund of a remembered id
// that was refunded already changes nothing and returns applied false. A
// nonzero seq raises the partition's sequence number to seq if it is below
// (replay); seq 0 numbers an applied refund with the partition's next
// sequence number (a backup), which it returns.
func (s *Store) Unrecord(p int, r Ref, key uint64, tag uint16, at int64, it window.Item, id, seq uint64, now int64) (_ uint64, applied bool, err error) {
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return s.unrecordLocked(pt, &pt.scratch, r, key, tag, at, it, id, seq, now)
}

// unrecordLocked is Unrecord with the partition's lock held; pt is the
// partition. The engine works in ws: the partition's scratch, or one the
// caller owns.
func (s *Store) unrecordLocked(pt *partition, ws *window.Scratch, r Ref, key uint64, tag uint16, at int64, it window.Item, id, seq uint64, now int64) (_ uint64, applied bool, err error) {
	key = storedKey(key)
	pt.seq = max(pt.seq, seq)
	sp := pt.space(r.id, false)
	if sp != nil && id != 0 {
		if e, ok := sp.ids.get(idKey(id, key), now, s.idHorizon); ok && e.refunded {
			return seq, false, nil
		}
	}
	if sp != nil {
		if err := s.unrecord(pt, sp, ws, r, key, tag, at, it); err != nil {
			return seq, false, err
		}
		if id != 0 {
			sp.ids.markRefunded(idKey(id, key))
		}
	}
	if seq == 0 {
		pt.seq++
		seq = pt.seq
	}
	return seq, true, nil
}

// unrecord removes the send at at from the recipient's record in sp, with
// the partition's lock held.
func (s *Store) unrecord(pt *partition, sp *space, ws *window.Scratch, r Ref, key uint64, tag uint16, at int64, it window.Item) error {
	pos, rec, other := sp.lookup(key, tag)
	if pos < 0 {
		return nil // nothing left to take back: the record expired
	}
	out, removed, emptied, err := r.rules.Remove(ws, rec, tag, at, it)
	switch {
	case err != nil:
		return err
	case emptied:
		sp.drop(pos)
	case removed > 0 || out != nil: // out alone: a counter state gave some back
		return sp.put(key, pos, out, other, false)
	}
	return nil
}

// Recorded reports whether the send of request id for the recipient with
// key hash key in domain r, in partition p, is remembered at now (unix ms)
// as recorded and neither refunded nor taken back: an answer that repeats
// the first decision of id rests on it.
func (s *Store) Recorded(p int, r Ref, key, id uint64, now int64) (recorded bool) {
	s.withID(p, r, key, id, func(c *idCache, k uint64) {
		e, ok := c.get(k, now, s.idHorizon)
		recorded = ok && !e.refunded
	})
	return recorded
}

// Unconfirmed notes that the send request id recorded for the recipient with
// key hash key in domain r, in partition p, was not confirmed to its caller
// (its backup refused it, say): a retry of id is then decided and recorded
// afresh, as after a refund, instead of answered as recorded with the first
// decision, which may have been made from a record that lacked sends
// admitted elsewhere. The record keeps counting the send, which can only
// deny early. It reports whether the store remembered id.
func (s *Store) Unconfirmed(p int, r Ref, key, id uint64) (known bool) {
	s.withID(p, r, key, id, func(c *idCache, k uint64) { known = c.markRefunded(k) })
	return known
}

// withID calls fn with the id cache of domain r in partition p and the
// cache key of request id for the recipient with key hash key, under the
// partition's lock; it does nothing for id 0 or a domain without a record
// there.
func (s *Store) withID(p int, r Ref, key, id uint64, fn func(c *idCache, k uint64)) {
	if id == 0 {
		return
	}
	key = storedKey(key)
	pt := &s.parts[p]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if sp := pt.space(r.id, false); sp != nil {
		fn(&sp.ids, idKey(id, key))
	}
}
