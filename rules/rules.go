package rules

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/freqring/freqring/window"
)

//go:embed default_rules.yaml
var defaultYAML []byte

// DefaultYAML returns the embedded default rules file.
func DefaultYAML() []byte { return slices.Clone(defaultYAML) }

// MaxDomains is the largest number of domains in one rules file.
const MaxDomains = 256

// Set is a validated set of domains, by name. It is immutable and safe
// for concurrent use.
type Set struct {
	source  string // file name, or "embedded defaults"
	domains map[string]*window.Domain
	names   []string // sorted
	// durability holds the domains that name theirs.
	durability map[string]Durability
	hash       uint64 // see Hash
	fileSum    uint64 // checksum of the file's bytes, for Watch
	// overrides are the file's overrides, in file order, each valid.
	overrides []Override
	// envoy is the file's envoy section, sorted by name; nil without one
	// (ConventionalEnvoy applies).
	envoy []EnvoyDomain
	// envoyServed are the Envoy domains served, sorted by name: envoy, or
	// ConventionalEnvoy of each domain.
	envoyServed []EnvoyDomain
}

// Source names where the rules came from.
func (rs *Set) Source() string { return rs.source }

// Domain returns the named domain, or nil.
func (rs *Set) Domain(name string) *window.Domain { return rs.domains[name] }

// Hash returns a stable 64-bit digest of what the set decides: every
// domain's name and, in order, each rule's name, scope, shadow flag, limit
// and window; the overrides and the envoy section when there are any.
// The source, comments and layout of the file do not count, so two nodes
// that load equal rules from different files agree. It is the same on every
// platform and in every version that keeps this encoding (TestHashGolden).
func (rs *Set) Hash() uint64 { return rs.hash }

// Names returns the domain names, sorted.
func (rs *Set) Names() []string { return slices.Clone(rs.names) }

// Default returns the embedded default rules.
func Default() *Set {
	rs, err := Parse("embedded defaults", defaultYAML)
	if err != nil {
		panic("BUG: embedded default rules: " + err.Error())
	}
	return rs
}

// Load reads and validates a rules file.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	return Parse(path, b)
}

// The YAML shape of a rules file. Unknown fields are errors.
type rulesFile struct {
	Domains   []domainSpec      `yaml:"domains"`
	Overrides []overrideSpec    `yaml:"overrides"`
	Envoy     []envoyDomainSpec `yaml:"envoy"`
}

type overrideSpec struct {
	Name       string         `yaml:"name"`
	Domain     string         `yaml:"domain"`
	Recipients []string       `yaml:"recipients"`
	Prefixes   []string       `yaml:"prefixes"`
	Limits     map[string]int `yaml:"limits"`
	Exempt     bool           `yaml:"exempt"`
}

type domainSpec struct {
	Name       string     `yaml:"name"`
	Shadow     bool       `yaml:"shadow"`     // every rule of the domain is a shadow
	Durability string     `yaml:"durability"` // ParseDurability; "" is the node's default
	Rules      []ruleSpec `yaml:"rules"`
}

type ruleSpec struct {
	Name      string `yaml:"name"`
	Scope     string `yaml:"scope"`
	Limit     int    `yaml:"limit"`
	Window    string `yaml:"window"`
	Shadow    bool   `yaml:"shadow"`    // evaluated and reported, never denies (window.Rule.Shadow)
	Algorithm string `yaml:"algorithm"` // window.ParseAlgorithm; "" is sliding-log
	Capacity  int    `yaml:"capacity"`  // bucket algorithms (window.Rule.Capacity)
	Buckets   int    `yaml:"buckets"`   // sliding-counter (window.Rule.Buckets)
	Borrow    int    `yaml:"borrow"`    // fixed-window (window.Rule.Borrow)
	Calendar  string `yaml:"calendar"`  // fixed-window: hour | day | week | month (window.Rule.Calendar)
	Zone      string `yaml:"zone"`      // calendar rules: a tz database name; "" is UTC (window.Rule.Zone)
}

// Parse validates the rules file data read from source. Errors read
// "source:line: what is wrong", naming the domain, the rule and the field.
func Parse(source string, data []byte) (*Set, error) {
	fail := func(line int, format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", source, line, fmt.Sprintf(format, args...))
	}
	// The node tree gives the line of each value, and of an unknown key.
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%s: %s", source, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if line, msg := unknownKey(&root, reflect.TypeFor[rulesFile]()); msg != "" {
		return nil, fail(line, "%s", msg)
	}
	var f rulesFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // unknownKey found none; this is a backstop
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fail(1, "the file is empty; want a list of domains under \"domains:\"")
		}
		return nil, fmt.Errorf("%s: %s", source, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	domainNodes := seqItems(mapValue(docMapping(&root), "domains"))

	if len(f.Domains) == 0 {
		return nil, fail(1, "no domains; want a list of domains under \"domains:\"")
	}
	if len(f.Domains) > MaxDomains {
		return nil, fail(1, "%d domains, more than %d", len(f.Domains), MaxDomains)
	}
	rs := &Set{source: source, domains: make(map[string]*window.Domain, len(f.Domains)), fileSum: checksum(data)}
	for i, ds := range f.Domains {
		dn := nodeAt(domainNodes, i)
		if ds.Name == "" {
			return nil, fail(line(dn), "domain %d: name is empty", i+1)
		}
		if len(ds.Name) > 64 {
			return nil, fail(fieldLine(dn, "name"), "domain %q: name is %d bytes, more than 64", ds.Name, len(ds.Name))
		}
		if rs.domains[ds.Name] != nil {
			return nil, fail(fieldLine(dn, "name"), "domain %q appears twice", ds.Name)
		}
		ruleNodes := seqItems(mapValue(dn, "rules"))
		rules := make([]window.Rule, 0, len(ds.Rules))
		seen := make(map[string]bool, len(ds.Rules))
		for j, spec := range ds.Rules {
			rn := nodeAt(ruleNodes, j)
			if seen[spec.Name] {
				return nil, fail(fieldLine(rn, "name"), "domain %q: rule name %q appears twice", ds.Name, spec.Name)
			}
			seen[spec.Name] = true
			r, field, err := spec.rule()
			if err == nil {
				err = r.Validate()
				var fe *window.FieldError
				if errors.As(err, &fe) {
					field, err = fe.Field, fmt.Errorf("%s %s", fe.Field, fe.Msg)
				}
			}
			if err != nil {
				name := spec.Name
				if name == "" {
					name = fmt.Sprintf("#%d", j+1)
				}
				return nil, fail(fieldLine(rn, field), "domain %q rule %q: %v", ds.Name, name, err)
			}
			r.Shadow = spec.Shadow || ds.Shadow
			rules = append(rules, r)
		}
		d, err := window.NewDomain(ds.Name, rules)
		if err != nil {
			return nil, fail(line(dn), "%s", strings.TrimPrefix(err.Error(), "window: "))
		}
		dur, err := ParseDurability(ds.Durability)
		if err != nil {
			return nil, fail(fieldLine(dn, "durability"), "domain %q: %v", ds.Name, err)
		}
		if dur != DurabilityDefault {
			if rs.durability == nil {
				rs.durability = map[string]Durability{}
			}
			rs.durability[ds.Name] = dur
		}
		rs.domains[ds.Name] = d
		rs.names = append(rs.names, ds.Name)
	}
	slices.Sort(rs.names)
	if err := rs.parseOverrides(f.Overrides, seqItems(mapValue(docMapping(&root), "overrides")), fail); err != nil {
		return nil, err
	}
	if err := rs.parseEnvoy(f.Envoy, mapValue(docMapping(&root), "envoy"), fail); err != nil {
		return nil, err
	}
	rs.hash = rs.digest()
	return rs, nil
}

// parseOverrides validates the file's overrides into rs.overrides. Two
// overrides of one domain may not list the same recipient or prefix.
func (rs *Set) parseOverrides(specs []overrideSpec, nodes []*yaml.Node, fail func(int, string, ...any) error) error {
	if len(specs) > MaxOverrides {
		return fail(line(nodeAt(nodes, MaxOverrides)), "%d overrides, more than %d", len(specs), MaxOverrides)
	}
	names := map[string]bool{}
	type claim struct{ domain, field, key string }
	claims := map[claim]string{}
	for i, spec := range specs {
		on := nodeAt(nodes, i)
		o := Override{Name: spec.Name, Domain: spec.Domain, Recipients: spec.Recipients, Prefixes: spec.Prefixes, Limits: spec.Limits, Exempt: spec.Exempt}
		if err := o.Validate(rs); err != nil {
			var oe *OverrideError
			if errors.As(err, &oe) {
				if o.Name == "" {
					oe.Override = fmt.Sprintf("#%d", i+1)
				}
				return fail(fieldLine(on, oe.Field), "%v", oe)
			}
			return fail(line(on), "%v", err)
		}
		if names[o.Name] {
			return fail(fieldLine(on, "name"), "override %q appears twice", o.Name)
		}
		names[o.Name] = true
		for field, keys := range map[string][]string{"recipients": o.Recipients, "prefixes": o.Prefixes} {
			for _, k := range keys {
				c := claim{o.Domain, field, k}
				if prev, ok := claims[c]; ok {
					return fail(fieldLine(on, field), "override %q: %s: %q is also in override %q of domain %q", o.Name, field, k, prev, o.Domain)
				}
				claims[c] = o.Name
			}
		}
		rs.overrides = append(rs.overrides, o)
	}
	return nil
}

// rule converts the spec, returning the field at fault on error.
func (s ruleSpec) rule() (window.Rule, string, error) {
	r := window.Rule{Name: s.Name, Limit: s.Limit, Capacity: s.Capacity, Buckets: s.Buckets, Borrow: s.Borrow, Zone: s.Zone}
	if s.Name == "" {
		return r, "name", errors.New("name is empty")
	}
	alg, err := window.ParseAlgorithm(s.Algorithm)
	if err != nil {
		return r, "algorithm", errors.New(strings.TrimPrefix(err.Error(), "window: "))
	}
	r.Algorithm = alg
	sc, err := window.ParseScope(s.Scope)
	if s.Scope == "" && alg != window.SlidingLog {
		sc, err = window.ScopeRecipient, nil // a counting algorithm counts per key: the scope may be left out
	}
	if err != nil {
		return r, "scope", fmt.Errorf("scope %q is not one of recipient, recipient+content", s.Scope)
	}
	r.Scope = sc
	cal, err := window.ParseCalendar(s.Calendar)
	if err != nil {
		return r, "calendar", errors.New(strings.TrimPrefix(err.Error(), "window: "))
	}
	r.Calendar = cal
	if cal != window.CalendarNone && s.Window == "" {
		return r, "", nil // the calendar period is the window
	}
	if s.Window == "" {
		return r, "window", errors.New("window is missing; want a Go duration such as 59s, 59m, 24h")
	}
	w, err := time.ParseDuration(s.Window)
	if err != nil {
		return r, "window", fmt.Errorf("window %q is not a Go duration such as 59s, 59m, 24h", s.Window)
	}
	r.Window = w
	return r, "", nil
}

// YAML node helpers: each tolerates nil, so a missing part reads as line 0.

func docMapping(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		return n.Content[0]
	}
	return nil
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func seqItems(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func nodeAt(ns []*yaml.Node, i int) *yaml.Node {
	if i < len(ns) {
		return ns[i]
	}
	return nil
}

func line(n *yaml.Node) int {
	if n == nil {
		return 0
	}
	return n.Line
}

// fieldLine is the line of field's value in mapping m, or of m itself.
func fieldLine(m *yaml.Node, field string) int {
	if v := mapValue(m, field); v != nil {
		return v.Line
	}
	return line(m)
}

// appendString appends s to b, length-prefixed (uvarint): the string
// encoding of digest.
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// digest computes Hash: SHA-256 over a canonical encoding (domains sorted by
// name; per rule its name, scope (|0x80 for a shadow rule, so that a set
// without shadows hashes as before shadows existed; |0x40 for a counting
// algorithm, whose number, capacity and buckets follow the window; then
// |0x20 for a fixed-window rule that borrows, whose borrow follows them;
// |0x10 for a calendar rule, whose calendar and zone follow last),
// limit and window in ms, length-prefixed), cut to its first 8 bytes.
func (rs *Set) digest() uint64 {
	h := sha256.New()
	var b []byte
	b = append(b, "freqring rules v1"...)
	b = binary.AppendUvarint(b, uint64(len(rs.names)))
	for _, name := range rs.names {
		d := rs.domains[name]
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(d.NumRules()))
		for i := range d.NumRules() {
			r := d.Rule(i)
			b = appendString(b, r.Name)
			sc := byte(r.Scope)
			if r.Shadow {
				sc |= 0x80
			}
			if r.Algorithm != window.SlidingLog {
				sc |= 0x40 // then the algorithm and its parameters: sliding-log rules hash as before algorithms existed
			}
			if r.Borrow != 0 {
				sc |= 0x20 // then the borrow too: rules that do not borrow hash as before borrowing existed
			}
			if r.Calendar != window.CalendarNone {
				sc |= 0x10 // then the calendar and zone: other rules hash as before calendars existed
			}
			b = append(b, sc)
			b = binary.AppendUvarint(b, uint64(r.Limit))
			b = binary.AppendUvarint(b, uint64(r.WindowMillis()))
			if r.Algorithm != window.SlidingLog {
				b = append(b, byte(r.Algorithm))
				b = binary.AppendUvarint(b, uint64(r.Capacity))
				b = binary.AppendUvarint(b, uint64(r.Buckets))
			}
			if r.Borrow != 0 {
				b = binary.AppendUvarint(b, uint64(r.Borrow))
			}
			if r.Calendar != window.CalendarNone {
				b = append(b, byte(r.Calendar))
				b = appendString(b, r.Zone)
			}
		}
	}
	if len(rs.durability) > 0 {
		// Only when a domain names its durability: other sets hash as
		// before durability existed. Nodes that disagree on it decide
		// alike but promise different things; the hash tells them apart.
		b = append(b, "durability"...)
		b = binary.AppendUvarint(b, uint64(len(rs.durability)))
		for _, name := range rs.names {
			if d := rs.durability[name]; d != DurabilityDefault {
				b = appendString(b, name)
				b = append(b, byte(d))
			}
		}
	}
	if len(rs.overrides) > 0 {
		// After the domains, only when there are overrides: a set without
		// overrides hashes as before they existed.
		os := slices.Clone(rs.overrides)
		slices.SortFunc(os, func(a, b Override) int { return strings.Compare(a.Name, b.Name) })
		b = append(b, "overrides"...)
		b = binary.AppendUvarint(b, uint64(len(os)))
		for _, o := range os {
			b = appendOverride(b, o)
		}
	}
	if rs.envoy != nil {
		// Likewise only with an envoy section: the translation of Envoy's
		// descriptors is part of what the cluster must agree on.
		b = appendEnvoy(b, rs.envoy)
	}
	h.Write(b)
	return binary.BigEndian.Uint64(h.Sum(nil))
}
