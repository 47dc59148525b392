package rules

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits of the envoy section.
const (
	MaxEnvoyDomains     = 256 // Envoy domains in one rules file
	MaxEnvoyDescriptors = 64  // descriptor mappings of one Envoy domain
	MaxEnvoyKeyEntries  = 4   // entries composing one recipient key
)

// Conventional descriptor entry keys: without an envoy section, an Envoy
// domain names the freqring domain and a descriptor is read by these keys
// (see ConventionalEnvoy).
const (
	EnvoyRecipientKey = "recipient"
	EnvoyContentKey   = "content"
	EnvoyRequestIDKey = "request_id"
)

// EnvoyDomain maps the descriptors Envoy sends under one rate limit domain
// (RateLimitRequest.domain) to freqring items.
type EnvoyDomain struct {
	Name string
	// Descriptors are tried in file order; the first that matches a
	// descriptor translates it.
	Descriptors []EnvoyDescriptor
}

// EnvoyEntry is one descriptor entry: a key and its value.
type EnvoyEntry struct{ Key, Value string }

// EnvoyDescriptor translates an Envoy descriptor into one freqring item. A
// descriptor matches when it holds every Match entry with its value and
// every Key entry, and no entry other than those, Content and RequestID.
type EnvoyDescriptor struct {
	Match     []EnvoyEntry // sorted by key; may be empty
	Domain    string       // the freqring domain; it exists in the set
	Key       []string     // entries whose values, in this order, make the recipient; 1 to MaxEnvoyKeyEntries
	Content   string       // entry whose value is the content; "" for none
	RequestID string       // entry whose value is hashed into the request id; "" for none
}

// Envoy returns the Envoy domain of that name: one of the file's envoy
// section, or without one ConventionalEnvoy(name) for a freqring domain of
// that name; ok is false when name is not served.
func (rs *Set) Envoy(name string) (EnvoyDomain, bool) {
	i, ok := slices.BinarySearchFunc(rs.envoyServed, name, func(d EnvoyDomain, n string) int { return strings.Compare(d.Name, n) })
	if !ok {
		return EnvoyDomain{}, false
	}
	return rs.envoyServed[i], true
}

// EnvoyNames returns the Envoy domains served, sorted: those of the envoy
// section, or without one every freqring domain.
func (rs *Set) EnvoyNames() []string {
	names := make([]string, len(rs.envoyServed))
	for i, d := range rs.envoyServed {
		names[i] = d.Name
	}
	return names
}

// ConventionalEnvoy is the mapping of a freqring domain when the rules file
// has no envoy section: the Envoy domain is the freqring domain, and a
// descriptor's "recipient" entry is the key, "content" the content and
// "request_id" the request id.
func ConventionalEnvoy(domain string) EnvoyDomain {
	return EnvoyDomain{Name: domain, Descriptors: []EnvoyDescriptor{{
		Domain: domain, Key: []string{EnvoyRecipientKey}, Content: EnvoyContentKey, RequestID: EnvoyRequestIDKey,
	}}}
}

// The YAML shape of the envoy section.
type envoyDomainSpec struct {
	Domain      string                `yaml:"domain"`
	Descriptors []envoyDescriptorSpec `yaml:"descriptors"`
}

type envoyDescriptorSpec struct {
	Match     map[string]string `yaml:"match"`
	Domain    string            `yaml:"domain"`
	Key       stringList        `yaml:"key"`
	Content   string            `yaml:"content"`
	RequestID string            `yaml:"request_id"`
}

// stringList is a YAML list of strings, or one string.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = stringList{n.Value}
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

// parseEnvoy validates the file's envoy section into rs.envoy, sorted by
// Envoy domain name, and sets rs.envoyServed: the section, or when it is
// absent (rs.envoy nil) the convention for each freqring domain, built once
// here rather than on each call. A present section must list at least one
// domain.
func (rs *Set) parseEnvoy(specs []envoyDomainSpec, section *yaml.Node, fail func(int, string, ...any) error) error {
	if section == nil {
		for _, name := range rs.names { // sorted
			rs.envoyServed = append(rs.envoyServed, ConventionalEnvoy(name))
		}
		return nil
	}
	nodes := seqItems(section)
	if len(specs) == 0 {
		return fail(line(section), "envoy: no domains; remove the section to map each Envoy domain to the freqring domain of its name")
	}
	if len(specs) > MaxEnvoyDomains {
		return fail(line(nodeAt(nodes, MaxEnvoyDomains)), "envoy: %d domains, more than %d", len(specs), MaxEnvoyDomains)
	}
	seen := map[string]bool{}
	for i, ds := range specs {
		dn := nodeAt(nodes, i)
		if ds.Domain == "" {
			return fail(line(dn), "envoy domain %d: domain is empty; want the RateLimitRequest.domain Envoy sends", i+1)
		}
		if seen[ds.Domain] {
			return fail(fieldLine(dn, "domain"), "envoy domain %q appears twice", ds.Domain)
		}
		seen[ds.Domain] = true
		if len(ds.Descriptors) == 0 {
			return fail(line(dn), "envoy domain %q: no descriptors", ds.Domain)
		}
		if len(ds.Descriptors) > MaxEnvoyDescriptors {
			return fail(fieldLine(dn, "descriptors"), "envoy domain %q: %d descriptors, more than %d", ds.Domain, len(ds.Descriptors), MaxEnvoyDescriptors)
		}
		ed := EnvoyDomain{Name: ds.Domain}
		descNodes := seqItems(mapValue(dn, "descriptors"))
		for j, spec := range ds.Descriptors {
			d, field, err := rs.envoyDescriptor(spec)
			if err != nil {
				return fail(fieldLine(nodeAt(descNodes, j), field), "envoy domain %q descriptor %d: %v", ds.Domain, j+1, err)
			}
			ed.Descriptors = append(ed.Descriptors, d)
		}
		rs.envoy = append(rs.envoy, ed)
	}
	slices.SortFunc(rs.envoy, func(a, b EnvoyDomain) int { return strings.Compare(a.Name, b.Name) })
	rs.envoyServed = rs.envoy
	return nil
}

// envoyDescriptor validates one descriptor mapping, returning the field at
// fault on error.
func (rs *Set) envoyDescriptor(s envoyDescriptorSpec) (EnvoyDescriptor, string, error) {
	d := EnvoyDescriptor{Domain: s.Domain, Key: s.Key, Content: s.Content, RequestID: s.RequestID}
	if d.Domain == "" {
		d.Domain = "default"
	}
	if rs.domains[d.Domain] == nil {
		return d, "domain", fmt.Errorf("domain %q is not a domain of this file (have %s)", d.Domain, strings.Join(rs.names, ", "))
	}
	if len(d.Key) == 0 {
		return d, "key", fmt.Errorf("key is missing; want the entry (or up to %d entries) whose value is the recipient", MaxEnvoyKeyEntries)
	}
	if len(d.Key) > MaxEnvoyKeyEntries {
		return d, "key", fmt.Errorf("key has %d entries, more than %d", len(d.Key), MaxEnvoyKeyEntries)
	}
	// Each entry key has one role.
	role := map[string]string{}
	claim := func(field, k string) error {
		if k == "" {
			return fmt.Errorf("%s: an entry key is empty", field)
		}
		if prev, ok := role[k]; ok {
			return fmt.Errorf("%s: entry %q is also in %s", field, k, prev)
		}
		role[k] = field
		return nil
	}
	for _, k := range d.Key {
		if err := claim("key", k); err != nil {
			return d, "key", err
		}
	}
	for _, f := range []struct{ field, k string }{{"content", d.Content}, {"request_id", d.RequestID}} {
		if f.k == "" {
			continue
		}
		if err := claim(f.field, f.k); err != nil {
			return d, f.field, err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Match)) {
		if err := claim("match", k); err != nil {
			return d, "match", err
		}
		if s.Match[k] == "" {
			return d, "match", fmt.Errorf("match: entry %q has an empty value", k)
		}
		d.Match = append(d.Match, EnvoyEntry{Key: k, Value: s.Match[k]})
	}
	return d, "", nil
}

// appendEnvoy appends the canonical encoding of the envoy section to b.
func appendEnvoy(b []byte, ds []EnvoyDomain) []byte {
	b = append(b, "envoy"...)
	b = binary.AppendUvarint(b, uint64(len(ds)))
	for _, d := range ds {
		b = appendString(b, d.Name)
		b = binary.AppendUvarint(b, uint64(len(d.Descriptors)))
		for _, e := range d.Descriptors {
			b = binary.AppendUvarint(b, uint64(len(e.Match)))
			for _, m := range e.Match {
				b = appendString(b, m.Key)
				b = appendString(b, m.Value)
			}
			b = appendString(b, e.Domain)
			b = binary.AppendUvarint(b, uint64(len(e.Key)))
			for _, k := range e.Key {
				b = appendString(b, k)
			}
			b = appendString(b, e.Content)
			b = appendString(b, e.RequestID)
		}
	}
	return b
}
