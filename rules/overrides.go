package rules

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/freqring/freqring/window"
)

// Limits of overrides.
const (
	// MaxOverrides is the largest number of overrides in a rules file, and
	// of admin overrides on a node.
	MaxOverrides = 1024
	// MaxOverrideKeys is the largest number of recipients plus prefixes of
	// one override.
	MaxOverrideKeys = 100_000
	// MaxKeyBytes is the longest recipient or prefix, as node.MaxRecipientBytes.
	MaxKeyBytes = 256
)

// Override gives listed keys of one domain other limits, or none (Exempt),
// over the same records: the keys' history is kept when an override is
// added or lifted. An Override is a plain value; Validate checks it against
// the domain it names.
type Override struct {
	Name       string         // unique among the overrides of a set, or of a node's admin overrides; up to 64 bytes
	Domain     string         // the domain whose keys it overrides
	Recipients []string       // exact keys
	Prefixes   []string       // key prefixes: a key that starts with one (the longest wins; an exact key beats any prefix)
	Limits     map[string]int // rule name -> limit, in [1, window.MaxLimit] (MaxCounterLimit for a counting rule); the domain's other rules keep theirs
	Exempt     bool           // admitted without a check (every rule a shadow), still recorded; not with Limits
	// Version orders overrides that claim the same key: the newer wins.
	// Admin overrides carry their set time (unix ms); rules-file ones 0.
	Version int64
	// SetBy names who set an admin override (the console's user, or the
	// address of the SetOverride call's client); "" for rules-file ones.
	SetBy string `json:",omitempty"`
}

// OverrideError is a malformed override. Field names the field at fault
// ("name", "domain", "recipients", "prefixes", "limits", "exempt") and Msg
// says what is wrong, with the value.
type OverrideError struct {
	Override string
	Field    string
	Msg      string
}

func (e *OverrideError) Error() string {
	return fmt.Sprintf("override %q: %s: %s", e.Override, e.Field, e.Msg)
}

// Validate checks o against the domains of rs: every field in range, the
// domain known, every limit naming one of its rules. Errors are
// *OverrideError.
func (o *Override) Validate(rs *Set) error {
	bad := func(field, format string, args ...any) error {
		return &OverrideError{Override: o.Name, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case o.Name == "":
		return bad("name", "is empty")
	case len(o.Name) > 64:
		return bad("name", "is %d bytes, more than 64", len(o.Name))
	case !utf8.ValidString(o.Name):
		return bad("name", "%q is not valid UTF-8", o.Name)
	case o.Domain == "":
		return bad("domain", "is empty")
	}
	d := rs.Domain(o.Domain)
	if d == nil {
		return bad("domain", "unknown domain %q (the rules have %v)", o.Domain, rs.Names())
	}
	if len(o.Recipients)+len(o.Prefixes) == 0 {
		return bad("recipients", "no recipients and no prefixes: an override lists the keys it applies to")
	}
	if k := len(o.Recipients) + len(o.Prefixes); k > MaxOverrideKeys {
		return bad("recipients", "%d recipients and prefixes, more than %d", k, MaxOverrideKeys)
	}
	for field, keys := range map[string][]string{"recipients": o.Recipients, "prefixes": o.Prefixes} {
		seen := make(map[string]bool, len(keys))
		for i, k := range keys {
			switch {
			case k == "":
				return bad(field, "entry %d is empty", i)
			case len(k) > MaxKeyBytes:
				return bad(field, "entry %d is %d bytes, more than %d", i, len(k), MaxKeyBytes)
			case !utf8.ValidString(k):
				return bad(field, "entry %d %q is not valid UTF-8", i, k)
			case seen[k]:
				return bad(field, "%q appears twice", k)
			}
			seen[k] = true
		}
	}
	if o.Exempt && len(o.Limits) > 0 {
		return bad("exempt", "exempt and limits both set: an exempt key has no limits")
	}
	if !o.Exempt && len(o.Limits) == 0 {
		return bad("limits", "no limits and not exempt: set limits (rule name -> limit) or exempt: true")
	}
	for _, name := range slices.Sorted(mapKeys(o.Limits)) {
		l := o.Limits[name]
		if ruleIndex(d, name) < 0 {
			names := make([]string, d.NumRules())
			for i := range names {
				names[i] = d.Rule(i).Name
			}
			return bad("limits", "unknown rule %q of domain %q (its rules are %v)", name, o.Domain, names)
		}
		most := window.MaxLimit
		if d.Rule(ruleIndex(d, name)).Algorithm != window.SlidingLog {
			most = window.MaxCounterLimit
		}
		if l < 1 || l > most {
			return bad("limits", "rule %q: limit %d out of range [1, %d]", name, l, most)
		}
	}
	return nil
}

func mapKeys(m map[string]int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func ruleIndex(d *window.Domain, name string) int {
	for i := range d.NumRules() {
		if d.Rule(i).Name == name {
			return i
		}
	}
	return -1
}

// Overrides returns the overrides of the rules file, in file order.
func (rs *Set) Overrides() []Override { return slices.Clone(rs.overrides) }

// Binding is one domain with its overrides, ready to decide: Base is the
// domain widened to keep what every override counts (window.Domain.Widen),
// and Lookup finds a key's override. Immutable; safe for concurrent use.
type Binding struct {
	Base      *window.Domain
	Overrides []BoundOverride // by name

	exact    map[string]int32 // key -> index in Overrides
	prefixes map[string]int32 // prefix -> index in Overrides
	lengths  []int            // distinct prefix lengths, longest first
}

// BoundOverride is an override with its domain: the base domain's rules
// with the override's limits (or all shadows, if exempt), widened as Base.
type BoundOverride struct {
	Override
	Domain *window.Domain
}

// Bind builds the Binding of domain d (of set rs) with the overrides of
// list that name it; the others are ignored. Each override must be valid
// for rs (Validate). When two overrides claim the same key or prefix, the
// one of larger Version wins, then the later name: Bind never fails on it,
// so that a node's admin overrides and a reloaded rules file cannot refuse
// each other (Parse refuses such a clash inside one file).
func Bind(d *window.Domain, list []Override) (*Binding, error) {
	b := &Binding{Base: d}
	for _, o := range list {
		if o.Domain != d.Name() {
			continue
		}
		limits := make([]int, d.NumRules())
		for name, l := range o.Limits {
			i := ruleIndex(d, name)
			if i < 0 {
				return nil, &OverrideError{Override: o.Name, Field: "limits", Msg: fmt.Sprintf("unknown rule %q of domain %q", name, d.Name())}
			}
			limits[i] = l
		}
		od, err := d.WithLimits(limits, o.Exempt)
		if err != nil {
			return nil, &OverrideError{Override: o.Name, Field: "limits", Msg: strings.TrimPrefix(err.Error(), "window: ")}
		}
		b.Overrides = append(b.Overrides, BoundOverride{Override: o, Domain: od})
	}
	if len(b.Overrides) == 0 {
		return b, nil
	}
	sort.Slice(b.Overrides, func(i, j int) bool { return b.Overrides[i].Name < b.Overrides[j].Name })
	// One family: every member keeps what any member counts.
	all := make([]*window.Domain, 0, len(b.Overrides)+1)
	all = append(all, d)
	for _, o := range b.Overrides {
		all = append(all, o.Domain)
	}
	b.Base = d.Widen(all...)
	for i := range b.Overrides {
		b.Overrides[i].Domain = b.Overrides[i].Domain.Widen(all...)
	}
	b.exact, b.prefixes = map[string]int32{}, map[string]int32{}
	wins := func(i int, prev int32, ok bool) bool {
		if !ok {
			return true
		}
		p := b.Overrides[prev]
		return b.Overrides[i].Version > p.Version || b.Overrides[i].Version == p.Version && b.Overrides[i].Name > p.Name
	}
	lengths := map[int]bool{}
	for i, o := range b.Overrides {
		for _, k := range o.Recipients {
			if prev, ok := b.exact[k]; wins(i, prev, ok) {
				b.exact[k] = int32(i)
			}
		}
		for _, p := range o.Prefixes {
			if prev, ok := b.prefixes[p]; wins(i, prev, ok) {
				b.prefixes[p] = int32(i)
			}
			lengths[len(p)] = true
		}
	}
	for l := range lengths {
		b.lengths = append(b.lengths, l)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(b.lengths)))
	return b, nil
}

// Lookup returns the index in Overrides of the override that decides key,
// or -1: an exact key first, else the longest prefix of key listed. It
// does one map lookup per distinct prefix length at most, and allocates
// nothing.
func (b *Binding) Lookup(key string) int {
	if len(b.Overrides) == 0 {
		return -1
	}
	if i, ok := b.exact[key]; ok {
		return int(i)
	}
	for _, l := range b.lengths {
		if l <= len(key) {
			if i, ok := b.prefixes[key[:l]]; ok {
				return int(i)
			}
		}
	}
	return -1
}

// appendOverride appends a canonical encoding of what o decides: name,
// domain, sorted recipients and prefixes, sorted limits, exempt.
func appendOverride(b []byte, o Override) []byte {
	list := func(l []string) {
		l = slices.Sorted(slices.Values(l))
		b = binary.AppendUvarint(b, uint64(len(l)))
		for _, s := range l {
			b = appendString(b, s)
		}
	}
	b = appendString(b, o.Name)
	b = appendString(b, o.Domain)
	list(o.Recipients)
	list(o.Prefixes)
	names := slices.Sorted(mapKeys(o.Limits))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		b = appendString(b, n)
		b = binary.AppendUvarint(b, uint64(o.Limits[n]))
	}
	if o.Exempt {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	return b
}
