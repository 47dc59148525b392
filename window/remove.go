package window

// Remove takes back a recorded send: it removes it.Cost entries at time at
// (unix ms) from the recipient log and, for an item with content, from the
// content log of its content, as far as the record holds them. It is how a
// refund returns a send that was recorded but never delivered. Mode is
// ignored.
//
// It returns the record to store in place of rec, and how many entries it
// removed from the log that counts the item (the recipient log, or the
// content log in a domain without recipient rules; in a domain without
// either, the cost when a counter state gave some of the send back);
// nothing changed when removed is 0 and out is nil. A record left with no entries comes back empty (nil out with
// emptied true): the caller drops it.
//
// A log that is full (it holds its scope's largest limit of entries, all
// inside the scope's longest window) may have dropped older sends of that
// window to make room (a record-only send, or a cost, beyond the limits):
// the record cannot tell. Remove must not let a rule count fewer sends than
// were made, so in a full log each removed entry is replaced by a copy of
// the oldest entry kept, which stands for a dropped send at least as old.
// The refund then frees its send for the rules whose windows do not reach
// back to that oldest entry, and not for the others. A log below its
// capacity has dropped nothing inside the window, and Remove is exact. The record keeps its newest time, the
// floor of its decision times, even when the newest send is removed. The
// returned bytes live in s, valid until the next call with s.
func (d *Domain) Remove(s *Scratch, rec []byte, tag uint16, at int64, it Item) (out []byte, removed int, emptied bool, err error) {
	it.Mode = CheckAndRecord // ignored; any mode is valid here
	cost, err := s.load(rec, tag, at, it)
	if err == nil {
		err = d.checkCounters(&s.st)
	}
	if err != nil || len(rec) == 0 {
		return nil, 0, false, err
	}
	st := &s.st
	hasContent := it.Content != 0 && d.contentCap > 0
	if d.recipCap > 0 {
		st.recip, removed = removeFull(st.recip, at, cost, d.recipCap, st.newest-d.recipSpan)
	}
	if hasContent {
		fp := contentFP(it.Content)
		for j := range st.clogs {
			c := &st.clogs[j]
			if c.fp != fp {
				continue
			}
			e, k := removeFull(st.ctimes[c.off:c.off+c.n], at, cost, d.contentCap, st.newest-d.contentSpan)
			c.n = int32(len(e))
			if d.recipCap == 0 {
				removed = k
			}
			break
		}
	}
	counted := false // a counter state gave some of the send back
	for i := range d.counters {
		c := &d.counters[i]
		if v := st.counterVals(c); v != nil {
			var changed bool
			s.cbuf, changed = c.remove(s.cbuf[:0], v, at, int64(cost))
			if changed {
				st.setCounter(c, s.cbuf)
				counted = true
			}
		}
	}
	if counted && d.recipCap == 0 && !hasContent {
		removed = cost
	}
	if removed == 0 && !counted {
		return nil, 0, false, nil
	}
	out, err = d.finish(s, st) // st.newest is unchanged: the record keeps it
	if err != nil {
		return nil, 0, false, err
	}
	if out == nil {
		return nil, removed, true, nil
	}
	return out, removed, false, nil
}

// removeFull is removeAt on a log of capacity cap whose entries after
// horizon count; a full log gets a copy of its oldest entry for each entry
// removed (see Remove). The log keeps its length or shrinks, in place.
func removeFull(log []int64, t int64, cost, cap int, horizon int64) ([]int64, int) {
	full := len(log) >= cap && len(log) > 0 && log[0] > horizon
	oldest := int64(0)
	if full {
		oldest = log[0]
	}
	log, k := removeAt(log, t, cost)
	if full && k > 0 {
		log = log[:len(log)+k] // the room removeAt freed
		copy(log[k:], log[:len(log)-k])
		for i := range k {
			log[i] = oldest
		}
	}
	return log, k
}

// removeAt removes up to cost entries equal to t from the ascending log, in
// place, and returns it and how many it removed.
func removeAt(log []int64, t int64, cost int) ([]int64, int) {
	hi := len(log) - countAfter(log, t) // past the last entry <= t
	lo := hi
	for lo > 0 && log[lo-1] == t && hi-lo < cost {
		lo--
	}
	if lo == hi {
		return log, 0
	}
	n := copy(log[lo:], log[hi:])
	return log[:lo+n], hi - lo
}
