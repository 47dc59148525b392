package window

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Scope says which admitted sends a rule counts.
type Scope uint8

const (
	// ScopeRecipient counts every admitted send to the recipient.
	ScopeRecipient Scope = 1
	// ScopeContent counts admitted sends to the recipient with identical content.
	ScopeContent Scope = 2
)

// String returns the scope's name as written in a rules file.
func (s Scope) String() string {
	switch s {
	case ScopeRecipient:
		return "recipient"
	case ScopeContent:
		return "recipient+content"
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// ParseScope parses "recipient" or "recipient+content".
func ParseScope(s string) (Scope, error) {
	switch s {
	case "recipient":
		return ScopeRecipient, nil
	case "recipient+content":
		return ScopeContent, nil
	}
	return 0, fmt.Errorf("window: scope %q is not one of recipient, recipient+content", s)
}

// Limits of the rule engine.
const (
	// MaxLimit is the largest Limit of a sliding-log rule. A timestamp log
	// keeps every admitted send of its window, so larger limits need one of
	// the counting algorithms (MaxCounterLimit).
	MaxLimit = 1000
	// MaxCounterLimit is the largest Limit, and Capacity, of a rule of any
	// other algorithm: their state does not grow with the limit.
	MaxCounterLimit = 10_000_000
	// DefaultBuckets is the number of sub-windows of a sliding-counter rule
	// that does not set Buckets; MaxBuckets the most it may set.
	DefaultBuckets = 60
	MaxBuckets     = 1000
	// MaxWindow is the longest Rule.Window.
	MaxWindow = 31 * 24 * time.Hour
	// MaxRules is the largest number of rules in one domain.
	MaxRules = 16
	// MaxCost is the largest cost of one item.
	MaxCost = MaxLimit
	// MaxContents is the largest number of distinct contents one recipient
	// can have inside the longest content window. It is only reachable with
	// a domain that has content rules and no recipient rule, or a recipient
	// limit above it.
	MaxContents = 1000
)

// Rule admits at most Limit sends of its Scope in any sliding window of
// length Window: a send at t is admitted only if fewer than Limit admitted
// sends lie in (t-Window, t]. That is the SlidingLog algorithm, the
// default; Algorithm picks another reading of Limit and Window (see
// Algorithm and counter.go).
//
// A Shadow rule is evaluated and reported like any other but never denies:
// an item that only shadow rules would deny is admitted (and recorded per
// its mode), and Decision.ShadowDeniedBy names the rule (envoyproxy/
// ratelimit's shadow_mode). Its limit still sizes the records, as any rule's.
type Rule struct {
	Name   string
	Scope  Scope
	Limit  int           // sends, in [1, MaxLimit] (sliding-log) or [1, MaxCounterLimit]
	Window time.Duration // whole milliseconds, in [1ms, MaxWindow]
	Shadow bool          // evaluated and reported, never denies

	Algorithm Algorithm // SlidingLog (the zero value) or a counting algorithm
	// Capacity is the most sends a bucket (TokenBucket, LeakyBucket, GCRA)
	// holds: the burst it admits at once when empty. 0 means Limit. Only
	// bucket rules may set it.
	Capacity int
	// Buckets is the number of sub-windows of a SlidingCounter rule; 0 means
	// DefaultBuckets. Window must be a whole multiple of Buckets ms. Only
	// sliding-counter rules may set it.
	Buckets int
	// Borrow is the most sends a FixedWindow rule may admit ahead of its
	// later windows' limits (seed 004's debt): 0 means none, at most
	// MaxCounterLimit. Only fixed-window rules may set it; see Algorithm.
	Borrow int
	// Calendar makes a FixedWindow rule's windows the calendar periods of
	// Zone (see Calendar) instead of windows of Window aligned to the unix
	// epoch; Window must then be 0. Only fixed-window rules may set it.
	Calendar Calendar
	// Zone is the tz database name of the zone whose calendar a Calendar
	// rule follows, such as "Asia/Shanghai"; "" is UTC. Only calendar rules
	// may set it.
	Zone string
}

// WindowMillis returns the rule's window in milliseconds: Window, or for a
// calendar rule the longest its period can last (its nominal length plus 4
// hours for clocks set back), which is how long records keep its sends.
func (r Rule) WindowMillis() int64 {
	if r.Calendar != CalendarNone {
		return r.Calendar.span()
	}
	return int64(r.Window / time.Millisecond)
}

// Nominal returns the rule's window as clients are told it: Window, or a
// calendar rule's nominal period (Calendar.Nominal).
func (r Rule) Nominal() time.Duration {
	if r.Calendar != CalendarNone {
		return r.Calendar.Nominal()
	}
	return r.Window
}

// Per returns what the rule's limit is per, for people: the window ("1m0s")
// or the calendar period and zone ("calendar day in Asia/Shanghai").
func (r Rule) Per() string {
	if r.Calendar == CalendarNone {
		return r.Window.String()
	}
	zone := r.Zone
	if zone == "" {
		zone = "UTC"
	}
	return fmt.Sprintf("calendar %v in %s", r.Calendar, zone)
}

// FieldError reports a rule field out of range. Its message names the
// rule, the field and the value; Field lets a caller point at the field's
// place in a rules file.
type FieldError struct {
	Rule  string // the rule's name
	Field string // "name", "scope", "limit", "window", "algorithm", "capacity", "buckets", "borrow", "calendar" or "zone"
	Msg   string // what is wrong, with the value and the allowed range
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("window: rule %q: %s %s", e.Rule, e.Field, e.Msg)
}

// Validate reports the first field of r that is out of range, as a
// *FieldError naming it and its value.
func (r Rule) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Rule: r.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case r.Name == "":
		return bad("name", "is empty")
	case len(r.Name) > 64:
		return bad("name", "is %d bytes, more than 64", len(r.Name))
	case r.Algorithm > FixedWindow:
		return bad("algorithm", "%v is not one of %s", r.Algorithm, algorithmList)
	case r.Scope != ScopeRecipient && r.Scope != ScopeContent:
		return bad("scope", "%v is not one of recipient, recipient+content", r.Scope)
	case r.Scope != ScopeRecipient && r.Algorithm != SlidingLog:
		return bad("scope", "%v: algorithm %v counts per recipient (key) only; use sliding-log for recipient+content", r.Scope, r.Algorithm)
	case r.Algorithm == SlidingLog && (r.Limit < 1 || r.Limit > MaxLimit):
		return bad("limit", "%d out of range [1, %d] (a sliding-log keeps every send of its window; a counting algorithm takes up to %d)", r.Limit, MaxLimit, MaxCounterLimit)
	case r.Limit < 1 || r.Limit > MaxCounterLimit:
		return bad("limit", "%d out of range [1, %d]", r.Limit, MaxCounterLimit)
	case r.Calendar > CalendarMonth:
		return bad("calendar", "%v is not one of hour, day, week, month", r.Calendar)
	case r.Calendar != CalendarNone && r.Algorithm != FixedWindow:
		return bad("calendar", "%v is set, but only fixed-window rules have calendar windows (algorithm %v)", r.Calendar, r.Algorithm)
	case r.Calendar != CalendarNone && r.Window != 0:
		return bad("window", "%v is set, but a calendar rule's window is its calendar period (calendar %v); leave it out", r.Window, r.Calendar)
	case r.Calendar == CalendarNone && r.Zone != "":
		return bad("zone", "%q is set, but only calendar rules have a zone", r.Zone)
	case r.Calendar == CalendarNone && (r.Window < time.Millisecond || r.Window > MaxWindow):
		return bad("window", "%v out of range [1ms, %v]", r.Window, MaxWindow)
	case r.Window%time.Millisecond != 0:
		return bad("window", "%v is not a whole number of milliseconds", r.Window)
	case r.Capacity != 0 && !r.Algorithm.isBucket():
		return bad("capacity", "%d is set, but only token-bucket, leaky-bucket and gcra rules have a capacity", r.Capacity)
	case r.Capacity < 0 || r.Capacity > MaxCounterLimit:
		return bad("capacity", "%d out of range [1, %d] (0 means the limit)", r.Capacity, MaxCounterLimit)
	case r.Buckets != 0 && r.Algorithm != SlidingCounter:
		return bad("buckets", "%d is set, but only sliding-counter rules have buckets", r.Buckets)
	case r.Buckets < 0 || r.Buckets > MaxBuckets:
		return bad("buckets", "%d out of range [1, %d] (0 means %d)", r.Buckets, MaxBuckets, DefaultBuckets)
	case r.Borrow != 0 && r.Algorithm != FixedWindow:
		return bad("borrow", "%d is set, but only fixed-window rules borrow (algorithm %v; a bucket borrows up to its capacity)", r.Borrow, r.Algorithm)
	case r.Borrow < 0 || r.Borrow > MaxCounterLimit:
		return bad("borrow", "%d out of range [0, %d]", r.Borrow, MaxCounterLimit)
	case r.Algorithm == SlidingCounter && r.WindowMillis()%int64(r.buckets()) != 0:
		return bad("buckets", "%d does not divide the window %v into whole milliseconds", r.buckets(), r.Window)
	}
	if r.Calendar != CalendarNone {
		if _, err := LoadZone(r.Zone); err != nil {
			return bad("zone", "%v", err)
		}
	}
	return nil
}

// buckets returns the sub-windows of a sliding-counter rule.
func (r Rule) buckets() int {
	if r.Buckets == 0 {
		return DefaultBuckets
	}
	return r.Buckets
}

// capacity returns the capacity of a bucket rule, in sends.
func (r Rule) capacity() int {
	if r.Capacity == 0 {
		return r.Limit
	}
	return r.Capacity
}

// Domain is a named, validated set of rules: the rules one check is decided
// against. A Domain is immutable and safe for concurrent use.
type Domain struct {
	name  string
	rules []Rule
	win   []int64 // rules[i].Window in ms

	recipCap    int   // largest recipient sliding-log limit; 0 when there is no such rule
	recipSpan   int64 // longest recipient sliding-log window, ms
	contentCap  int   // largest content limit; 0 when there is no content rule
	contentSpan int64 // longest content window, ms

	counters    []counterRule // the rules of counting algorithms, in domain order
	cidx        []int         // per rule, its index in counters (-1: a sliding-log)
	counterSpan int64         // longest time a counter state counts a send, ms (counterRule.span)
}

// NewDomain validates rules and returns the domain they form. Rule names must
// be unique within the domain; there must be between 1 and MaxRules rules.
func NewDomain(name string, rules []Rule) (*Domain, error) {
	if name == "" {
		return nil, errors.New("window: domain name is empty")
	}
	if len(rules) == 0 || len(rules) > MaxRules {
		return nil, fmt.Errorf("window: domain %q has %d rules, want 1 to %d", name, len(rules), MaxRules)
	}
	d := &Domain{name: name, rules: append([]Rule(nil), rules...)}
	seen := make(map[string]bool, len(rules))
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("domain %q: %w", name, err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("window: domain %q: rule name %q appears twice", name, r.Name)
		}
		seen[r.Name] = true
		w := r.WindowMillis()
		d.win = append(d.win, w)
		d.cidx = append(d.cidx, -1)
		if r.Algorithm != SlidingLog {
			d.cidx[len(d.cidx)-1] = len(d.counters)
			c := newCounterRule(len(d.win)-1, r)
			for _, o := range d.counters {
				if o.id == c.id {
					return nil, fmt.Errorf("window: domain %q: rules %q and %q have the same counter id %08x; rename one", name, d.rules[o.rule].Name, r.Name, c.id)
				}
			}
			d.counters = append(d.counters, c)
			d.counterSpan = max(d.counterSpan, c.span())
			continue
		}
		switch r.Scope {
		case ScopeRecipient:
			d.recipCap = max(d.recipCap, r.Limit)
			d.recipSpan = max(d.recipSpan, w)
		case ScopeContent:
			d.contentCap = max(d.contentCap, r.Limit)
			d.contentSpan = max(d.contentSpan, w)
		}
	}
	return d, nil
}

// Name returns the domain's name.
func (d *Domain) Name() string { return d.name }

// Rules returns a copy of the domain's rules, in the order results report them.
func (d *Domain) Rules() []Rule { return append([]Rule(nil), d.rules...) }

// NumRules returns the number of rules in the domain.
func (d *Domain) NumRules() int { return len(d.rules) }

// Rule returns the i-th rule.
func (d *Domain) Rule(i int) Rule { return d.rules[i] }

// Longest returns the longest window of the domain in milliseconds: a record
// whose newest send is at least this old holds nothing that any rule counts.
func (d *Domain) Longest() int64 { return max(d.recipSpan, d.contentSpan, d.counterSpan) }

// HasContentRules reports whether any rule of the domain is content-scoped.
func (d *Domain) HasContentRules() bool { return d.contentCap > 0 }

// DefaultRules are the rules of the embedded default domain: Huawei
// Cloud's published SMS limits per number.
func DefaultRules() []Rule {
	return []Rule{
		{Name: "recipient-1m", Scope: ScopeRecipient, Limit: 15, Window: time.Minute},
		{Name: "recipient-24h", Scope: ScopeRecipient, Limit: 50, Window: 24 * time.Hour},
		{Name: "content-59s", Scope: ScopeContent, Limit: 2, Window: 59 * time.Second},
		{Name: "content-59m", Scope: ScopeContent, Limit: 5, Window: 59 * time.Minute},
	}
}

// WithLimits returns a domain of d's name, rules and windows, with
// limits[i] in place of rule i's limit where limits[i] > 0, and every rule a
// shadow when exempt (an exempt key is admitted and still recorded). Its
// records keep at least what d's keep (see Widen), so that a key decided
// under it and then under d again loses no history. It is how an override
// gives listed keys other limits over the same records.
func (d *Domain) WithLimits(limits []int, exempt bool) (*Domain, error) {
	if len(limits) > len(d.rules) {
		return nil, fmt.Errorf("window: domain %q: %d limits for %d rules", d.name, len(limits), len(d.rules))
	}
	rules := d.Rules()
	for i, l := range limits {
		if l > 0 {
			rules[i].Limit = l
		}
	}
	if exempt {
		for i := range rules {
			rules[i].Shadow = true
		}
	}
	o, err := NewDomain(d.name, rules)
	if err != nil {
		return nil, err
	}
	return o.Widen(d), nil
}

// Widen returns d with record capacities (and the time counter states are
// kept) raised to the largest of d's and
// others' (domains of the same rules and windows, as WithLimits makes): every
// domain of such a family, widened by all the others, keeps the same sends
// in a record, so it does not matter which one writes it, and replay and
// merges (which use the base domain) keep what an override counts. It
// returns d itself when nothing changes.
func (d *Domain) Widen(others ...*Domain) *Domain {
	w := *d
	w.counters = slices.Clone(d.counters)
	for _, o := range others {
		w.recipCap, w.contentCap = max(w.recipCap, o.recipCap), max(w.contentCap, o.contentCap)
		w.counterSpan = max(w.counterSpan, o.counterSpan)
	}
	for i := range w.counters {
		c := &w.counters[i]
		lim := c.limit // the slowest drain of the family
		for _, o := range others {
			if i < len(o.counters) {
				c.keep, lim = max(c.keep, o.counters[i].keep), min(lim, o.counters[i].limit)
			}
		}
		switch {
		case c.alg.isBucket():
			c.span0 = max(c.span0, ceilDiv(c.keep*c.win, lim))
		case c.alg == FixedWindow:
			c.repay = min(c.repay, lim)
		}
		w.counterSpan = max(w.counterSpan, c.span())
	}
	if w.recipCap == d.recipCap && w.contentCap == d.contentCap && w.counterSpan == d.counterSpan && slices.Equal(w.counters, d.counters) {
		return d
	}
	return &w
}

// Caps returns the most entries a record keeps per recipient log and per
// content log: the largest limit of each scope (0 when the scope has no
// rule), or more for a widened domain.
func (d *Domain) Caps() (recipient, content int) { return d.recipCap, d.contentCap }
