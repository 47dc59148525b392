package window

import (
	"errors"
	"fmt"
)

// Errors returned by Apply. Callers decide with errors.Is.
var (
	// ErrInvalid reports a bad item: a cost, mode or time out of range. It
	// names the field and the value, and nothing was recorded.
	ErrInvalid = errors.New("window: invalid item")
	// ErrFull reports a record that would exceed MaxContents content logs or
	// MaxRecordBytes. Nothing was recorded.
	ErrFull = errors.New("window: record full")
)

// Mode says what Apply does with an item.
type Mode uint8

const (
	// CheckAndRecord admits the item if every rule allows it and records it
	// if admitted. Denied attempts are not recorded.
	CheckAndRecord Mode = iota
	// Peek decides as CheckAndRecord would and changes nothing.
	Peek
	// RecordOnly records the item without checking it, for flows that check
	// with Peek, send, then record the send.
	RecordOnly
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case CheckAndRecord:
		return "check-and-record"
	case Peek:
		return "peek"
	case RecordOnly:
		return "record-only"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// MaxRecordBytes bounds one encoded record (see ErrFull). The default rules
// keep a record under 512 bytes.
const MaxRecordBytes = 64 << 10

// Item is one send to decide.
type Item struct {
	Content uint64 // hash of the content; 0 means none, and content rules do not apply
	Cost    int    // sends the item counts as, in [1, MaxCost]; 0 means 1
	Mode    Mode
}

// RuleResult is one rule's view of a decision.
type RuleResult struct {
	// Used counts the sends of the rule's scope in (At-Window, At] after the
	// decision. It saturates at the largest limit of the scope (the log keeps
	// no more), which is never below this rule's limit. A counting rule
	// reports its own count, or a bucket's level rounded up (Algorithm);
	// a borrowing fixed-window the debt carried into the window plus its
	// count.
	Used int
	// Remaining is Limit-Used, never below 0 (Limit+Borrow-Used for a
	// borrowing fixed-window).
	Remaining int
	// RetryAfter is the time in ms until this rule would admit the item, if
	// no other send is recorded meanwhile; 0 when it admits now. A shadow
	// rule reports it as it would be; -1 means never (a shadow rule whose
	// limit is below the item's cost: a rule that is not a shadow fails such
	// an item with ErrInvalid instead).
	RetryAfter int64
}

// Decision is the outcome of Apply.
type Decision struct {
	Admitted   bool  // every rule admits (always true for RecordOnly)
	Recorded   bool  // the item's sends were added to the record
	DeniedBy   int   // index of the denying rule with the longest RetryAfter; -1 when admitted
	RetryAfter int64 // ms until the item would be admitted; 0 when admitted
	// ShadowDeniedBy is the index of the shadow rule that would have denied
	// the item, the one with the longest RetryAfter (never, -1, is the
	// longest; the first such rule on ties); -1 when none would. It is set
	// whether or not another rule denied. RecordOnly items are not checked:
	// always -1.
	ShadowDeniedBy int
	At             int64 // decision time, unix ms: now, or the record's newest send if now is earlier

	// Rules holds one result per domain rule, in domain order; content
	// rules of an item without content report Used 0 and RetryAfter 0.
	Rules    [MaxRules]RuleResult
	NumRules int
}

// Scratch is the working memory of Apply, reused across calls so that
// Apply does not allocate once warm. A Scratch is not safe for concurrent
// use; the store keeps one per shard, guarded by the shard's lock.
type Scratch struct {
	st     state
	other  state // the second record of Merge
	merged state // Merge's result
	out    []byte
	cbuf   []int64 // a counter state being rewritten
}

// Apply decides it against rec, the current record of one recipient in
// domain d (empty for a recipient with no record), at time now (unix ms).
//
// It fills dec and returns the record to store in place of rec, or nil when
// the record did not change. The returned bytes live in s and are valid until
// the next call with s. tag is the opaque header tag of a new record; an
// existing record keeps its own (see RecordTag).
//
// A send at t is admitted iff, for every rule (L, W) that applies, the
// sends already recorded in (t-W, t] plus the item's cost are at most L.
// This takes O(rules * log(entries)) after decoding the record.
//
// Apply works in three stages: load decodes rec, judge decides against
// every rule, and record adds the admitted sends and encodes the record.
func (d *Domain) Apply(s *Scratch, rec []byte, tag uint16, now int64, it Item, dec *Decision) ([]byte, error) {
	cost, err := s.load(rec, tag, now, it)
	if err == nil {
		err = d.checkCounters(&s.st)
	}
	if err != nil {
		return nil, err
	}
	st := &s.st
	t := max(now, st.newest)
	var c itemContent
	if it.Content != 0 && d.contentCap > 0 {
		c = st.itemContent(it.Content)
	}
	if err := d.judge(st, t, cost, it.Mode, &c, dec); err != nil {
		return nil, err
	}
	if !dec.Admitted || it.Mode == Peek || d.recipCap == 0 && !c.ok && len(d.counters) == 0 {
		d.fillRemaining(dec)
		return nil, nil
	}
	out, err := d.record(s, t, cost, &c, dec)
	if err != nil {
		return nil, err
	}
	d.fillRemaining(dec)
	return out, nil
}

// itemContent is the content side of one Apply: where the item's content
// log sits in the decoded record.
type itemContent struct {
	ok  bool    // the item has content and the domain has content rules
	fp  uint32  // the content's fingerprint (see contentFP)
	i   int     // index of its log in state.clogs; -1 when it has none yet
	log []int64 // that log's entries, ascending; nil when it has none yet
}

// itemContent finds the log of content (a hash, not 0) in s.
func (s *state) itemContent(content uint64) itemContent {
	c := itemContent{ok: true, fp: contentFP(content)}
	if c.i = s.findLog(c.fp); c.i >= 0 {
		l := s.clogs[c.i]
		c.log = s.ctimes[l.off : l.off+l.n]
	}
	return c
}

// judge decides an item of cost at t (unix ms) against every rule of d,
// before anything is recorded, and fills dec: Admitted, DeniedBy,
// RetryAfter, ShadowDeniedBy, At, NumRules, and each rule's Used and
// RetryAfter (Remaining is filled later, by fillRemaining). A RecordOnly
// item is admitted by every rule. It fails with ErrInvalid when the cost
// exceeds what a rule that is not a shadow can ever admit.
//
// The sliding-log rules are judged inline: this loop runs for every rule of
// every decision.
func (d *Domain) judge(st *state, t int64, cost int, mode Mode, c *itemContent, dec *Decision) error {
	// Set every field Apply reports rather than zero the whole Decision:
	// Rules beyond NumRules are not read.
	dec.Admitted, dec.Recorded, dec.DeniedBy, dec.RetryAfter, dec.At, dec.NumRules = false, false, -1, 0, t, len(d.rules)
	dec.ShadowDeniedBy = -1
	var shadowRetry int64 // RetryAfter of rule ShadowDeniedBy
	for i := range d.rules {
		r := &d.rules[i]
		res := &dec.Rules[i]
		*res = RuleResult{}
		if r.Algorithm != SlidingLog {
			denies, err := d.judgeCounter(st, i, t, cost, mode, res)
			if err != nil {
				return err
			}
			if denies {
				dec.deny(i, r.Shadow, res.RetryAfter, &shadowRetry)
			}
			continue
		}
		log, scopeCap := st.recip, d.recipCap
		if r.Scope == ScopeContent {
			if !c.ok {
				res.Remaining = r.Limit
				continue
			}
			log, scopeCap = c.log, d.contentCap
		}
		used := countAfter(log, t-d.win[i])
		if mode != RecordOnly && used+cost > r.Limit {
			retry, err := d.logRetry(i, log, t, cost)
			if err != nil {
				return err
			}
			dec.deny(i, r.Shadow, retry, &shadowRetry)
			res.RetryAfter = retry
		}
		res.Used = min(used, scopeCap)
	}
	dec.Admitted = dec.DeniedBy < 0
	return nil
}

// deny notes that rule i (a shadow rule when shadow) denies the item for
// retry ms (-1: never). Of the rules that are not shadows, dec keeps the one
// with the longest RetryAfter; of the shadow rules, the one with the longest
// retry, never being the longest and the first winning ties, whose retry
// deny keeps in *shadowRetry.
func (dec *Decision) deny(i int, shadow bool, retry int64, shadowRetry *int64) {
	switch {
	case shadow:
		if dec.ShadowDeniedBy < 0 || *shadowRetry >= 0 && (retry < 0 || retry > *shadowRetry) {
			*shadowRetry, dec.ShadowDeniedBy = retry, i
		}
	case retry > dec.RetryAfter:
		dec.RetryAfter, dec.DeniedBy = retry, i
	}
}

// judgeCounter fills res with the view of rule i, a counting rule, of an
// item of cost at t, and reports whether the rule denies it (never for
// RecordOnly); res.RetryAfter is -1 for a shadow rule that never admits it.
func (d *Domain) judgeCounter(st *state, i int, t int64, cost int, mode Mode, res *RuleResult) (bool, error) {
	c := &d.counters[d.cidx[i]]
	if c.decide(st.counterVals(c), t, int64(cost), res) || mode == RecordOnly {
		res.RetryAfter = 0
		return false, nil
	}
	if r := &d.rules[i]; res.RetryAfter < 0 && !r.Shadow {
		return false, fmt.Errorf("%w: cost %d exceeds %s %d of rule %q", ErrInvalid, cost, c.most(), c.mostValue(), r.Name)
	}
	return true, nil
}

// logRetry returns when rule i, a sliding-log rule over log, would admit an
// item of cost at t that it denies: in ms from t, or -1 (never) for a
// shadow rule whose limit is below the cost. Such a rule that is not a
// shadow fails with ErrInvalid.
func (d *Domain) logRetry(i int, log []int64, t int64, cost int) (int64, error) {
	r := &d.rules[i]
	if cost > r.Limit {
		if !r.Shadow {
			return 0, fmt.Errorf("%w: cost %d exceeds limit %d of rule %q", ErrInvalid, cost, r.Limit, r.Name)
		}
		return -1, nil
	}
	// The (Limit-cost+1)-th newest send leaves the window at e+w.
	e := log[len(log)-(r.Limit-cost+1)]
	return e + d.win[i] - t, nil
}

// record adds the admitted item's cost sends at t (unix ms) to every log
// it belongs to and to every counter, encodes the record into s and
// updates dec: Recorded, the counting rules' results, and the Used of each
// sliding-log rule the item counts in. It fails with ErrFull when the
// record would hold more than MaxContents content logs or MaxRecordBytes.
func (d *Domain) record(s *Scratch, t int64, cost int, c *itemContent, dec *Decision) ([]byte, error) {
	st := &s.st
	if c.ok && c.i < 0 && len(st.clogs) >= MaxContents {
		if d.dropDeadContents(st, t); len(st.clogs) >= MaxContents {
			return nil, fmt.Errorf("%w: recipient already has %d distinct contents inside the content window", ErrFull, MaxContents)
		}
	}
	if d.recipCap > 0 {
		for range cost {
			st.recip = append(st.recip, t)
		}
	}
	if c.ok {
		st.addContent(c.i, c.fp, t, cost)
	}
	s.addCounters(d, t, int64(cost))
	for i := range d.counters {
		cr := &d.counters[i]
		cr.report(st.counterVals(cr), t, &dec.Rules[cr.rule])
	}
	st.newest = t
	out, err := d.finish(s, st)
	if err != nil {
		return nil, err
	}
	dec.Recorded = true
	for i := range d.rules {
		r := &d.rules[i]
		if r.Scope == ScopeContent && !c.ok || r.Algorithm != SlidingLog {
			continue
		}
		scopeCap := d.recipCap
		if r.Scope == ScopeContent {
			scopeCap = d.contentCap
		}
		dec.Rules[i].Used = min(dec.Rules[i].Used+cost, scopeCap)
	}
	return out, nil
}

// checkCounters checks every counter state of st that belongs to a rule of
// d (see counterRule.check).
func (d *Domain) checkCounters(st *state) error {
	for i := range d.counters {
		c := &d.counters[i]
		if v := st.counterVals(c); v != nil {
			if err := c.check(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// load validates it and the time t (unix ms), and decodes rec (a new record
// with tag if empty) into s. It returns the item's cost.
func (s *Scratch) load(rec []byte, tag uint16, t int64, it Item) (int, error) {
	cost := it.Cost
	if cost == 0 {
		cost = 1
	}
	switch {
	case cost < 1 || cost > MaxCost:
		return 0, fmt.Errorf("%w: cost %d out of range [1, %d]", ErrInvalid, it.Cost, MaxCost)
	case it.Mode > RecordOnly:
		return 0, fmt.Errorf("%w: mode %d is not one of check-and-record, peek, record-only", ErrInvalid, it.Mode)
	case t < 0 || t > maxTime:
		return 0, fmt.Errorf("%w: time %d ms out of range [0, %d]", ErrInvalid, t, int64(maxTime))
	}
	if len(rec) == 0 {
		s.st.reset(tag)
		return cost, nil
	}
	return cost, s.st.decode(rec)
}

// fillRemaining sets the Remaining of each sliding-log rule from its Used
// (a counting rule reports its own).
func (d *Domain) fillRemaining(dec *Decision) {
	for i := range d.rules {
		r := &d.rules[i]
		if r.Algorithm == SlidingLog {
			dec.Rules[i].Remaining = max(0, r.Limit-dec.Rules[i].Used)
		}
	}
}

// addCounters adds cost sends at at to the state of every counting rule of d.
func (s *Scratch) addCounters(d *Domain, at, cost int64) {
	for i := range d.counters {
		c := &d.counters[i]
		s.cbuf = c.add(s.cbuf[:0], s.st.counterVals(c), at, cost)
		s.st.setCounter(c, s.cbuf)
	}
}

// Insert records it as sent at time at (unix ms) without deciding, placing
// its sends in time order among those the record holds, whatever their
// times. Mode is ignored. A record is a function of the set of sends it was
// given: inserting the same sends in any order, or applying them in time
// order, gives identical bytes; except for bucket rules (token, leaky,
// gcra), to which a send older than the record's newest is added without
// draining, which can only deny early (see Algorithm). That is how a node
// rebuilds records from its write-ahead log, where concurrent batches may
// appear out of time order.
// The returned bytes live in s, valid until the next call with s.
func (d *Domain) Insert(s *Scratch, rec []byte, tag uint16, at int64, it Item) ([]byte, error) {
	it.Mode = CheckAndRecord // ignored; any mode is valid here
	cost, err := s.load(rec, tag, at, it)
	if err == nil {
		err = d.checkCounters(&s.st)
	}
	if err != nil {
		return nil, err
	}
	st := &s.st
	// A content entry no rule can count at the record's newest send would
	// be pruned at once: it is not added, so that it cannot meet MaxContents.
	hasContent := it.Content != 0 && d.contentCap > 0 && at > max(st.newest, at)-d.contentSpan
	if d.recipCap == 0 && !hasContent && len(d.counters) == 0 {
		return nil, nil
	}
	if d.recipCap > 0 {
		st.recip = insertSorted(st.recip, at, cost)
	}
	s.addCounters(d, at, int64(cost))
	if hasContent {
		fp := contentFP(it.Content)
		ci := -1
		for j, c := range st.clogs {
			if c.fp == fp {
				ci = j
				break
			}
		}
		if ci < 0 && len(st.clogs) >= MaxContents {
			if d.dropDeadContents(st, max(st.newest, at)); len(st.clogs) >= MaxContents {
				return nil, fmt.Errorf("%w: recipient already has %d distinct contents inside the content window", ErrFull, MaxContents)
			}
		}
		st.addContent(ci, fp, at, cost)
		if ci < 0 {
			ci = len(st.clogs) - 1
		}
		// addContent appended the entries; move them before any later ones.
		c := st.clogs[ci]
		e := st.ctimes[c.off : c.off+c.n]
		old := e[:len(e)-cost]
		i := len(old) - countAfter(old, at)
		copy(e[i+cost:], old[i:])
		for k := range cost {
			e[i+k] = at
		}
	}
	st.newest = max(st.newest, at)
	return d.finish(s, st)
}

// finish prunes st at its newest send and returns its record, encoded in
// s.out (valid until the next call with s), or nil when nothing is left. A
// record over MaxRecordBytes fails with ErrFull.
func (d *Domain) finish(s *Scratch, st *state) ([]byte, error) {
	d.prune(st, st.newest)
	if len(st.recip) == 0 && len(st.clogs) == 0 && len(st.counters) == 0 {
		return nil, nil
	}
	out := st.encode(s.out[:0])
	s.out = out
	if len(out) > MaxRecordBytes {
		return nil, fmt.Errorf("%w: record would take %d bytes, more than %d", ErrFull, len(out), MaxRecordBytes)
	}
	return out, nil
}

// insertSorted inserts cost copies of t into the ascending log, after any
// equal entries, and returns it.
func insertSorted(log []int64, t int64, cost int) []int64 {
	i := len(log) - countAfter(log, t) // first entry > t
	for range cost {
		log = append(log, 0)
	}
	copy(log[i+cost:], log[i:])
	for k := range cost {
		log[i+k] = t
	}
	return log
}

// addContent appends cost entries at t to content log ci (a new log for fp
// when ci < 0), first moving the log to the end of ctimes if it is not there.
func (s *state) addContent(ci int, fp uint32, t int64, cost int) {
	if ci < 0 {
		s.clogs = append(s.clogs, contentLog{fp: fp, off: int32(len(s.ctimes))})
		ci = len(s.clogs) - 1
	}
	c := &s.clogs[ci]
	if int(c.off+c.n) != len(s.ctimes) {
		off := len(s.ctimes)
		s.ctimes = append(s.ctimes, s.ctimes[c.off:c.off+c.n]...)
		c.off = int32(off)
	}
	for range cost {
		s.ctimes = append(s.ctimes, t)
	}
	c.n += int32(cost)
}

// dropDeadContents drops from s the content logs with no entry that a
// content rule of d can count at t or later, as prune does, keeping the
// others in their order: before a new content log is refused for
// MaxContents, the logs that prune would drop do not count.
func (d *Domain) dropDeadContents(s *state, t int64) {
	kept := s.clogs[:0]
	for _, c := range s.clogs {
		if s.ctimes[c.off+c.n-1] > t-d.contentSpan {
			kept = append(kept, c)
		}
	}
	s.clogs = kept
}

// prune drops what no rule of d can count at or after t: entries at or
// before t minus the scope's longest window, and all but the newest
// scope-capacity entries of each log.
func (d *Domain) prune(s *state, t int64) {
	if d.recipCap == 0 {
		s.recip = s.recip[:0]
	} else {
		n := len(s.recip)
		lo := max(n-countAfter(s.recip, t-d.recipSpan), n-d.recipCap)
		if lo > 0 {
			copy(s.recip, s.recip[lo:])
			s.recip = s.recip[:n-lo]
		}
	}
	kept := s.clogs[:0]
	if d.contentCap > 0 {
		for _, c := range s.clogs {
			e := s.ctimes[c.off : c.off+c.n]
			n := int32(len(e))
			lo := max(n-int32(countAfter(e, t-d.contentSpan)), n-int32(d.contentCap))
			if lo < n {
				kept = append(kept, contentLog{fp: c.fp, off: c.off + lo, n: n - lo})
			}
		}
	}
	// Canonical order, so that equal states encode to equal bytes: an
	// insertion sort, as the logs are sorted but for the one Apply added.
	for i := 1; i < len(kept); i++ {
		c, j := kept[i], i
		for ; j > 0 && c.fp < kept[j-1].fp; j-- {
			kept[j] = kept[j-1]
		}
		kept[j] = c
	}
	s.clogs = kept
	d.pruneCounters(s, t)
}

// pruneCounters normalizes every counter state of s to t (see
// counterRule.normalize), drops those that count nothing and those of no
// rule of d (a rule a reload removed, or changed the window or algorithm
// of), and sorts the rest by id.
func (d *Domain) pruneCounters(s *state, t int64) {
	if len(s.counters) == 0 {
		return
	}
	vals := s.cnew[:0]
	kept := s.counters[:0]
	for _, cs := range s.counters {
		for i := range d.counters {
			c := &d.counters[i]
			if c.id != cs.id || c.alg != cs.alg {
				continue
			}
			off := len(vals)
			if nv := c.normalize(vals, s.cvals[cs.off:cs.off+cs.n], t); nv != nil { // nil: counts nothing
				vals = nv
				kept = append(kept, counterState{id: cs.id, alg: cs.alg, off: int32(off), n: int32(len(vals) - off)})
			}
			break
		}
	}
	for i := 1; i < len(kept); i++ {
		for j := i; j > 0 && kept[j].id < kept[j-1].id; j-- {
			kept[j], kept[j-1] = kept[j-1], kept[j]
		}
	}
	s.counters = kept
	s.cnew, s.cvals = s.cvals, vals
}

// countAfter returns the number of entries of the ascending log that are
// greater than bound.
func countAfter(log []int64, bound int64) int {
	// A window mostly ends past one end of the log: a short one after the
	// newest entry, the longest before the oldest. Those take one or two
	// comparisons; the rest a binary search between the ends.
	n := len(log)
	if n == 0 || log[n-1] <= bound {
		return 0
	}
	if log[0] > bound {
		return n
	}
	lo, hi := 1, n-1 // log[0] <= bound < log[n-1]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if log[m] > bound {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return len(log) - lo
}

// Merge returns the record of one recipient that holds the union of the
// sends of records a and b (either may be empty), pruned as Apply prunes at
// the newer record's newest send; nil when nothing is left. Both must carry
// the same tag. The union keeps, for each log and each millisecond, the
// larger of the two records' counts of sends at that millisecond: it is
// exact when, at every millisecond, one record's sends include the other's,
// as two copies of one recipient's history do (a recipient has one deciding
// owner at a time), and it never counts a send twice. The returned bytes
// live in s, valid until the next call with s.
func (d *Domain) Merge(s *Scratch, a, b []byte) ([]byte, error) {
	if len(a) == 0 && len(b) == 0 {
		return nil, nil
	}
	if len(a) == 0 {
		a, b = b, a
	}
	if err := s.st.decode(a); err != nil {
		return nil, err
	}
	tag := s.st.tag
	s.other.reset(tag)
	if len(b) > 0 {
		if err := s.other.decode(b); err != nil {
			return nil, err
		}
		if s.other.tag != tag {
			return nil, fmt.Errorf("%w: records of two recipients (tags %04x and %04x)", ErrInvalid, tag, s.other.tag)
		}
	}
	x, y, m := &s.st, &s.other, &s.merged
	if err := d.checkCounters(x); err != nil {
		return nil, err
	}
	if err := d.checkCounters(y); err != nil {
		return nil, err
	}
	m.reset(tag)
	m.newest = max(x.newest, y.newest)
	for i := range d.counters {
		c := &d.counters[i]
		if a, b := x.counterVals(c), y.counterVals(c); a != nil || b != nil {
			s.cbuf = c.merge(s.cbuf[:0], a, b)
			m.setCounter(c, s.cbuf)
		}
	}
	if d.recipCap > 0 {
		m.recip = unionLogs(m.recip[:0], x.recip, y.recip)
	}
	if d.contentCap > 0 {
		for _, c := range x.clogs {
			var yl []int64
			for _, o := range y.clogs {
				if o.fp == c.fp {
					yl = y.ctimes[o.off : o.off+o.n]
					break
				}
			}
			off := len(m.ctimes)
			m.ctimes = unionLogs(m.ctimes, x.ctimes[c.off:c.off+c.n], yl)
			m.clogs = append(m.clogs, contentLog{fp: c.fp, off: int32(off), n: int32(len(m.ctimes) - off)})
		}
		for _, o := range y.clogs {
			found := false
			for _, c := range x.clogs {
				if c.fp == o.fp {
					found = true
					break
				}
			}
			if !found && y.ctimes[o.off+o.n-1] > m.newest-d.contentSpan { // a dead log would be pruned
				if len(m.clogs) >= MaxContents {
					d.dropDeadContents(m, m.newest)
				}
				if len(m.clogs) >= MaxContents {
					return nil, fmt.Errorf("%w: recipient would have more than %d distinct contents inside the content window", ErrFull, MaxContents)
				}
				off := len(m.ctimes)
				m.ctimes = append(m.ctimes, y.ctimes[o.off:o.off+o.n]...)
				m.clogs = append(m.clogs, contentLog{fp: o.fp, off: int32(off), n: o.n})
			}
		}
	}
	return d.finish(s, m)
}

// unionLogs appends to dst the union of two ascending logs: each time as
// many times as the log that has it more often.
func unionLogs(dst, a, b []int64) []int64 {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			dst = append(dst, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			dst = append(dst, b[j])
			j++
		default: // equal: the longer run of this time
			t := a[i]
			na, nb := 0, 0
			for ; i < len(a) && a[i] == t; i++ {
				na++
			}
			for ; j < len(b) && b[j] == t; j++ {
				nb++
			}
			for range max(na, nb) {
				dst = append(dst, t)
			}
		}
	}
	return dst
}
