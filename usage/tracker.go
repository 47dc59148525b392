package usage

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultDays is the number of calendar days a Tracker keeps by default.
const DefaultDays = 35

// MaxDays bounds Config.Days.
const MaxDays = 3660

// Date is a calendar date, as the number of days from 1970-01-01 to it.
type Date int32

// DateOf returns the calendar date of t in t's location.
func DateOf(t time.Time) Date {
	y, m, d := t.Date()
	return Date(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400)
}

// ParseDate parses a date written YYYY-MM-DD.
func ParseDate(s string) (Date, error) {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return 0, fmt.Errorf("usage: date %q: want YYYY-MM-DD", s)
	}
	return DateOf(t), nil
}

// String writes the date YYYY-MM-DD.
func (d Date) String() string { return time.Unix(int64(d)*86400, 0).UTC().Format(time.DateOnly) }

// Event is one decided item, as Tracker.Count counts it.
type Event struct {
	Domain   string
	Key      uint64 // the recipient's 64-bit key hash (xxhash64): fed to the sketch as it is
	Admitted bool
	// DeniedBy names the rule that denied the item (the node's denied_by:
	// of the rules that deny, the one with the longest retry-after); ""
	// when admitted.
	DeniedBy string
	// WouldDenyBy names the shadow rule that would have denied the item,
	// "" for none. Counted per rule in RuleCount.WouldDeny, whether the
	// item was admitted or not.
	WouldDenyBy string
}

// RuleCount is one rule's counters in a domain on a day.
type RuleCount struct {
	Rule      string
	Denied    int64 // items this rule denied (Event.DeniedBy)
	WouldDeny int64 // items this shadow rule would have denied (Event.WouldDenyBy)
}

// DomainDay is one domain's statistics on one calendar day in one zone:
// plain values, a copy of a Tracker's counters or decoded from bytes.
type DomainDay struct {
	Zone       string // IANA name of the zone Date is a day of; "UTC" for UTC
	Date       Date
	Domain     string
	Admitted   int64       // items admitted (check-and-record and record-only)
	Denied     int64       // items denied
	Rules      []RuleCount // sorted by rule name; rules that counted nothing are absent
	Recipients *Sketch     // distinct recipients of the items counted; never nil
}

// Config configures a Tracker. A zero field takes the default named in its
// comment.
type Config struct {
	// Zone is the time zone whose calendar days are kept besides UTC's
	// (time.LoadLocation); nil or UTC means UTC only.
	Zone *time.Location
	// Days is how many calendar days each zone keeps, today included;
	// 0 means DefaultDays (35). When a new day begins, the day Days before
	// it is dropped whole.
	Days int
}

// Tracker counts decided items per zone, calendar day and domain. Count is
// safe for concurrent use and allocates nothing once a day's domain exists;
// every other method is safe for concurrent use with it.
type Tracker struct {
	zones []*zone // UTC first, then the configured zone if any
	days  int
}

// zone holds one zone's days.
type zone struct {
	name string
	loc  *time.Location
	cur  atomic.Pointer[day] // the newest day: Count's fast path
	mu   sync.Mutex          // guards days
	days []*day              // ascending dates, at most Tracker.days of them
	// dropped counts events of days before those kept (the clock went back
	// past the oldest day kept).
	dropped atomic.Int64
}

// day is one calendar day of a zone: [start, end) in unix ms.
type day struct {
	date       Date
	start, end int64
	mu         sync.Mutex                            // serializes additions to domains
	domains    atomic.Pointer[map[string]*domainDay] // copied on write
}

// domainDay is a domain's live counters on one day.
type domainDay struct {
	admitted, denied atomic.Int64
	mu               sync.Mutex                 // serializes additions to rules
	rules            atomic.Pointer[[]*ruleDay] // copied on write
	recipients       liveSketch
}

type ruleDay struct {
	name              string
	denied, wouldDeny atomic.Int64
}

// New returns an empty Tracker, or an error naming a bad Config field.
func New(cfg Config) (*Tracker, error) {
	if cfg.Days == 0 {
		cfg.Days = DefaultDays
	}
	if cfg.Days < 1 || cfg.Days > MaxDays {
		return nil, fmt.Errorf("usage: Days %d out of range [1, %d]", cfg.Days, MaxDays)
	}
	t := &Tracker{days: cfg.Days, zones: []*zone{{name: "UTC", loc: time.UTC}}}
	if cfg.Zone != nil && cfg.Zone.String() != "UTC" {
		t.zones = append(t.zones, &zone{name: cfg.Zone.String(), loc: cfg.Zone})
	}
	return t, nil
}

// Zones returns the names of the zones kept: "UTC", then the configured
// zone if there is one.
func (t *Tracker) Zones() []string {
	names := make([]string, len(t.zones))
	for i, z := range t.zones {
		names[i] = z.name
	}
	return names
}

// Days returns how many calendar days each zone keeps.
func (t *Tracker) Days() int { return t.days }

// Dropped returns the events not counted since New because their day, in
// some zone, was older than the days kept (the clock went back that far).
func (t *Tracker) Dropped() int64 {
	var n int64
	for _, z := range t.zones {
		n += z.dropped.Load()
	}
	return n
}

// Count counts one decided item at nowMs (unix ms) in the day of nowMs of
// every zone kept.
func (t *Tracker) Count(nowMs int64, e Event) {
	for _, z := range t.zones {
		d := z.cur.Load()
		if d == nil || nowMs < d.start || nowMs >= d.end {
			if d = z.dayAt(nowMs, t.days); d == nil {
				z.dropped.Add(1)
				continue
			}
		}
		d.domain(e.Domain).count(&e)
	}
}

// dayAt returns the day holding nowMs, made if missing, or nil if it is
// older than the days kept. A new newest day drops the days more than keep
// days before it and becomes cur.
func (z *zone) dayAt(nowMs int64, keep int) *day {
	date := DateOf(time.UnixMilli(nowMs).In(z.loc))
	z.mu.Lock()
	defer z.mu.Unlock()
	i, found := slices.BinarySearchFunc(z.days, date, func(d *day, date Date) int { return cmp.Compare(d.date, date) })
	if found {
		return z.days[i]
	}
	if n := len(z.days); n > 0 && date <= z.days[n-1].date-Date(keep) {
		return nil
	}
	d := z.newDay(date, nowMs)
	z.days = slices.Insert(z.days, i, d)
	if i == len(z.days)-1 {
		z.cur.Store(d)
		z.expire(date, keep)
	}
	return d
}

// newDay returns an empty day for date, whose bounds hold nowMs.
func (z *zone) newDay(date Date, nowMs int64) *day {
	t := time.Unix(int64(date)*86400, 0).UTC()
	y, m, dd := t.Date()
	d := &day{date: date,
		start: time.Date(y, m, dd, 0, 0, 0, 0, z.loc).UnixMilli(),
		end:   time.Date(y, m, dd+1, 0, 0, 0, 0, z.loc).UnixMilli()}
	// A zone whose midnight falls in a DST gap may normalize oddly: the
	// bounds only serve Count's fast path, so they must hold nowMs.
	d.start, d.end = min(d.start, nowMs), max(d.end, nowMs+1)
	empty := map[string]*domainDay{}
	d.domains.Store(&empty)
	return d
}

// expire drops the days keep or more days before newest. z.mu is held.
func (z *zone) expire(newest Date, keep int) {
	cut := 0
	for cut < len(z.days) && z.days[cut].date <= newest-Date(keep) {
		cut++
	}
	if cut > 0 {
		z.days = slices.Delete(z.days, 0, cut)
	}
}

// domain returns the day's counters of a domain, made if missing.
func (d *day) domain(name string) *domainDay {
	if dd := (*d.domains.Load())[name]; dd != nil {
		return dd
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.domains.Load()
	if dd := old[name]; dd != nil {
		return dd
	}
	m := make(map[string]*domainDay, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	dd := &domainDay{}
	empty := []*ruleDay{}
	dd.rules.Store(&empty)
	m[name] = dd
	d.domains.Store(&m)
	return dd
}

func (dd *domainDay) count(e *Event) {
	if e.Admitted {
		dd.admitted.Add(1)
	} else {
		dd.denied.Add(1)
		if e.DeniedBy != "" {
			dd.rule(e.DeniedBy).denied.Add(1)
		}
	}
	if e.WouldDenyBy != "" {
		dd.rule(e.WouldDenyBy).wouldDeny.Add(1)
	}
	dd.recipients.add(e.Key)
}

// rule returns the counters of a rule, made if missing.
func (dd *domainDay) rule(name string) *ruleDay {
	for _, r := range *dd.rules.Load() {
		if r.name == name {
			return r
		}
	}
	dd.mu.Lock()
	defer dd.mu.Unlock()
	old := *dd.rules.Load()
	for _, r := range old {
		if r.name == name {
			return r
		}
	}
	r := &ruleDay{name: name}
	rs := append(slices.Clip(old), r)
	dd.rules.Store(&rs)
	return r
}

// Query selects days of one zone for Report.
type Query struct {
	Zone   string // a name from Zones; "" means "UTC"
	Days   int    // calendar days ending with the zone's date of nowMs; 0 means 1
	Domain string // "" means every domain
}

// Report returns copies of the days asked for, at nowMs (unix ms), ordered
// by date then domain. An unknown zone is an error naming it.
func (t *Tracker) Report(nowMs int64, q Query) ([]DomainDay, error) {
	z, err := t.zone(q.Zone)
	if err != nil {
		return nil, err
	}
	if q.Days == 0 {
		q.Days = 1
	}
	if q.Days < 0 || q.Days > MaxDays {
		return nil, fmt.Errorf("usage: Days %d out of range [0, %d]", q.Days, MaxDays)
	}
	last := DateOf(time.UnixMilli(nowMs).In(z.loc))
	return z.copyDays(last-Date(q.Days)+1, last, q.Domain), nil
}

// All returns copies of every day of every zone, ordered by zone (UTC
// first), date and domain: what a node saves.
func (t *Tracker) All() []DomainDay {
	var out []DomainDay
	for _, z := range t.zones {
		out = append(out, z.copyDays(-1<<31, 1<<31-1, "")...)
	}
	return out
}

func (t *Tracker) zone(name string) (*zone, error) {
	if name == "" {
		name = "UTC"
	}
	for _, z := range t.zones {
		if z.name == name {
			return z, nil
		}
	}
	return nil, fmt.Errorf("usage: zone %q is not kept (kept: %v)", name, t.Zones())
}

// copyDays copies the days of z from first to last, of domain (or all).
func (z *zone) copyDays(first, last Date, domain string) []DomainDay {
	z.mu.Lock()
	days := slices.Clone(z.days)
	z.mu.Unlock()
	var out []DomainDay
	for _, d := range days {
		if d.date < first || d.date > last {
			continue
		}
		m := *d.domains.Load()
		names := make([]string, 0, len(m))
		for name := range m {
			if domain == "" || name == domain {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			out = append(out, m[name].copy(z.name, d.date, name))
		}
	}
	return out
}

func (dd *domainDay) copy(zone string, date Date, domain string) DomainDay {
	c := DomainDay{Zone: zone, Date: date, Domain: domain, Admitted: dd.admitted.Load(), Denied: dd.denied.Load(), Recipients: new(Sketch)}
	for _, r := range *dd.rules.Load() {
		c.Rules = append(c.Rules, RuleCount{Rule: r.name, Denied: r.denied.Load(), WouldDeny: r.wouldDeny.Load()})
	}
	slices.SortFunc(c.Rules, func(a, b RuleCount) int { return cmp.Compare(a.Rule, b.Rule) })
	dd.recipients.copyTo(c.Recipients)
	return c
}

// Restore adds saved days to the tracker's (counters summed, sketches
// merged), as at nowMs (unix ms): days of a zone not kept, and days more
// than Days before the zone's date of nowMs, are skipped and counted in the
// result.
func (t *Tracker) Restore(nowMs int64, days []DomainDay) (skipped int) {
	for i := range days {
		s := &days[i]
		z, err := t.zone(s.Zone)
		if err != nil {
			skipped++
			continue
		}
		today := DateOf(time.UnixMilli(nowMs).In(z.loc))
		if s.Date <= today-Date(t.days) {
			skipped++
			continue
		}
		d := z.restoreDay(s.Date, t.days)
		if d == nil {
			skipped++
			continue
		}
		dd := d.domain(s.Domain)
		dd.admitted.Add(s.Admitted)
		dd.denied.Add(s.Denied)
		for _, r := range s.Rules {
			rd := dd.rule(r.Rule)
			rd.denied.Add(r.Denied)
			rd.wouldDeny.Add(r.WouldDeny)
		}
		if s.Recipients != nil {
			dd.recipients.raise(s.Recipients)
		}
	}
	return skipped
}

// restoreDay returns the day of date, made if missing, or nil if it is
// older than the days kept.
func (z *zone) restoreDay(date Date, keep int) *day {
	t := time.Unix(int64(date)*86400, 0).UTC()
	y, m, d := t.Date()
	return z.dayAt(time.Date(y, m, d, 12, 0, 0, 0, z.loc).UnixMilli(), keep)
}
