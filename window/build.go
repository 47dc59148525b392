package window

import "fmt"

// Build returns the record of d, with tag, that holds sends (each of cost
// 1): the bytes that inserting them one by one with Insert, in any order,
// gives (or Apply with RecordOnly in time order), built in one pass
// without decoding and encoding a record per send. It is how synthetic
// state is written fast (freqring synth). sends must be in ascending time
// order (unix ms, in [0, 2^44-1]); nil means nothing is left (no send that
// any rule of d counts). The returned bytes live in s, valid until the next
// call with s.
//
// Insert fails with ErrFull as soon as a recipient has MaxContents
// distinct contents inside the content window at some send; Build checks
// only at the newest send, so it may build a record where Insert fails,
// never the other way round.
func (d *Domain) Build(s *Scratch, tag uint16, sends []Send) ([]byte, error) {
	st := &s.st
	st.reset(tag)
	// newest is the newest send that changes a record: every send when d
	// has recipient rules (of any algorithm), else those with content.
	last := -1
	for i, snd := range sends {
		switch {
		case snd.At < 0 || snd.At > maxTime:
			return nil, fmt.Errorf("%w: sends[%d]: time %d ms out of range [0, %d]", ErrInvalid, i, snd.At, int64(maxTime))
		case i > 0 && snd.At < sends[i-1].At:
			return nil, fmt.Errorf("%w: sends[%d]: time %d ms before the previous send's %d", ErrInvalid, i, snd.At, sends[i-1].At)
		}
		if d.recipCap > 0 || len(d.counters) > 0 || (snd.Content != 0 && d.contentCap > 0) {
			last = i
		}
	}
	if last < 0 {
		return nil, nil
	}
	sends = sends[:last+1]
	st.newest = sends[last].At

	if d.recipCap > 0 {
		for _, snd := range sends {
			if snd.At > st.newest-d.recipSpan {
				st.recip = append(st.recip, snd.At)
			}
		}
	}
	if d.contentCap > 0 {
		// Sends at or before newest minus the content span would be pruned:
		// skip them. First count each live content's entries, then lay the
		// logs out contiguously in ctimes and fill them (n as the cursor).
		bound := st.newest - d.contentSpan
		for _, snd := range sends {
			if snd.Content == 0 || snd.At <= bound {
				continue
			}
			fp := contentFP(snd.Content)
			j := st.findLog(fp)
			if j < 0 {
				if len(st.clogs) >= MaxContents {
					return nil, fmt.Errorf("%w: recipient already has %d distinct contents inside the content window", ErrFull, MaxContents)
				}
				st.clogs = append(st.clogs, contentLog{fp: fp})
				j = len(st.clogs) - 1
			}
			st.clogs[j].n++
		}
		var off int32
		for j := range st.clogs {
			st.clogs[j].off, off = off, off+st.clogs[j].n
			st.clogs[j].n = 0
		}
		st.ctimes = grow(st.ctimes, int(off))
		for _, snd := range sends {
			if snd.Content == 0 || snd.At <= bound {
				continue
			}
			c := &st.clogs[st.findLog(contentFP(snd.Content))]
			st.ctimes[c.off+c.n] = snd.At
			c.n++
		}
	}
	for _, snd := range sends {
		s.addCounters(d, snd.At, 1) // in time order: exact for every algorithm
	}
	return d.finish(s, st)
}

// findLog returns the index of the content log of fingerprint fp, or -1.
func (s *state) findLog(fp uint32) int {
	for j, c := range s.clogs {
		if c.fp == fp {
			return j
		}
	}
	return -1
}
