package window

import (
	"errors"
	"fmt"
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
	// MaxLimit is the largest Rule.Limit. A timestamp log keeps every admitted
	// send of its window, so larger limits need a bucketed counter instead.
	MaxLimit = 1000
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
// sends lie in (t-Window, t].
//
// A Shadow rule is evaluated and reported like any other but never denies:
// an item that only shadow rules would deny is admitted (and recorded per
// its mode), and Decision.ShadowDeniedBy names the rule (envoyproxy/
// ratelimit's shadow_mode). Its limit still sizes the records, as any rule's.
type Rule struct {
	Name   string
	Scope  Scope
	Limit  int           // sends, in [1, MaxLimit]
	Window time.Duration // whole milliseconds, in [1ms, MaxWindow]
	Shadow bool          // evaluated and reported, never denies
}

// WindowMillis returns the rule's window in milliseconds.
func (r Rule) WindowMillis() int64 { return int64(r.Window / time.Millisecond) }

// FieldError reports a rule field out of range. Its message names the
// rule, the field and the value; Field lets a caller point at the field's
// place in a rules file.
type FieldError struct {
	Rule  string // the rule's name
	Field string // "name", "scope", "limit" or "window"
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
	case r.Scope != ScopeRecipient && r.Scope != ScopeContent:
		return bad("scope", "%v is not one of recipient, recipient+content", r.Scope)
	case r.Limit < 1 || r.Limit > MaxLimit:
		return bad("limit", "%d out of range [1, %d] (a timestamp log keeps every send of its window)", r.Limit, MaxLimit)
	case r.Window < time.Millisecond || r.Window > MaxWindow:
		return bad("window", "%v out of range [1ms, %v]", r.Window, MaxWindow)
	case r.Window%time.Millisecond != 0:
		return bad("window", "%v is not a whole number of milliseconds", r.Window)
	}
	return nil
}

// Domain is a named, validated set of rules: the rules one check is decided
// against. A Domain is immutable and safe for concurrent use.
type Domain struct {
	name  string
	rules []Rule
	win   []int64 // rules[i].Window in ms

	recipCap    int   // largest recipient limit; 0 when there is no recipient rule
	recipSpan   int64 // longest recipient window, ms
	contentCap  int   // largest content limit; 0 when there is no content rule
	contentSpan int64 // longest content window, ms
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
func (d *Domain) Longest() int64 { return max(d.recipSpan, d.contentSpan) }

// HasContentRules reports whether any rule of the domain is content-scoped.
func (d *Domain) HasContentRules() bool { return d.contentCap > 0 }

// DefaultRules are the rules of DESIGN §1, the embedded default domain:
// Huawei Cloud's published SMS limits per number.
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

// Widen returns d with record capacities raised to the largest of d's and
// others' (domains of the same rules and windows, as WithLimits makes): every
// domain of such a family, widened by all the others, keeps the same sends
// in a record, so it does not matter which one writes it, and replay and
// merges (which use the base domain) keep what an override counts. It
// returns d itself when nothing changes.
func (d *Domain) Widen(others ...*Domain) *Domain {
	rc, cc := d.recipCap, d.contentCap
	for _, o := range others {
		rc, cc = max(rc, o.recipCap), max(cc, o.contentCap)
	}
	if rc == d.recipCap && cc == d.contentCap {
		return d
	}
	w := *d
	w.recipCap, w.contentCap = rc, cc
	return &w
}

// Caps returns the most entries a record keeps per recipient log and per
// content log: the largest limit of each scope (0 when the scope has no
// rule), or more for a widened domain.
func (d *Domain) Caps() (recipient, content int) { return d.recipCap, d.contentCap }
