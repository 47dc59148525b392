package rules

import (
	"reflect"
	"strings"
	"testing"
)

const envoyBase = `domains:
  - name: default
    rules:
      - {name: r1m, scope: recipient, limit: 15, window: 1m}
  - name: api
    rules:
      - {name: a1s, scope: recipient, limit: 5, window: 1s}
`

// TestEnvoyConvention: without an envoy section every freqring domain is
// served under its own name, read by the conventional entry keys.
func TestEnvoyConvention(t *testing.T) {
	rs, err := Parse("t", []byte(envoyBase))
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.EnvoyNames(); !reflect.DeepEqual(got, []string{"api", "default"}) {
		t.Fatalf("EnvoyNames = %v", got)
	}
	d, ok := rs.Envoy("api")
	want := EnvoyDomain{Name: "api", Descriptors: []EnvoyDescriptor{{Domain: "api", Key: []string{"recipient"}, Content: "content", RequestID: "request_id"}}}
	if !ok || !reflect.DeepEqual(d, want) {
		t.Fatalf("Envoy(api) = %+v, %v; want %+v", d, ok, want)
	}
	if _, ok := rs.Envoy("nope"); ok {
		t.Fatal("Envoy(nope) found")
	}
}

// TestEnvoySection: an envoy section replaces the convention, keeps file
// order of descriptors, sorts match entries and accepts a key of one string
// or a list.
func TestEnvoySection(t *testing.T) {
	rs, err := Parse("t", []byte(envoyBase+`envoy:
  - domain: mesh
    descriptors:
      - match: {generic_key: sms, tier: gold}
        key: [tenant, user]
        content: template
        request_id: x-request-id
      - domain: api
        key: remote_address
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.EnvoyNames(); !reflect.DeepEqual(got, []string{"mesh"}) {
		t.Fatalf("EnvoyNames = %v", got)
	}
	if _, ok := rs.Envoy("default"); ok {
		t.Fatal("the convention still applies beside an envoy section")
	}
	d, _ := rs.Envoy("mesh")
	want := EnvoyDomain{Name: "mesh", Descriptors: []EnvoyDescriptor{
		{Match: []EnvoyEntry{{"generic_key", "sms"}, {"tier", "gold"}}, Domain: "default", Key: []string{"tenant", "user"}, Content: "template", RequestID: "x-request-id"},
		{Domain: "api", Key: []string{"remote_address"}},
	}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("Envoy(mesh) = %+v\nwant %+v", d, want)
	}
	base, _ := Parse("t", []byte(envoyBase))
	if rs.Hash() == base.Hash() {
		t.Fatal("the envoy section does not change the hash")
	}
	again, _ := Parse("other", []byte(envoyBase+"envoy:\n- domain: mesh\n  descriptors:\n  - {match: {tier: gold, generic_key: sms}, key: [tenant, user], content: template, request_id: x-request-id}\n  - {domain: api, key: [remote_address]}\n"))
	if again.Hash() != rs.Hash() {
		t.Fatal("the same envoy section in another layout hashes differently")
	}
}

// TestEnvoyErrors: each mistake names the line, the Envoy domain, the
// descriptor and the field.
func TestEnvoyErrors(t *testing.T) {
	for _, tc := range []struct{ section, want string }{
		{"envoy: []\n", "t:8: envoy: no domains"},
		{"envoy:\n  - descriptors: [{key: a}]\n", "t:9: envoy domain 1: domain is empty"},
		{"envoy:\n  - domain: m\n", "t:9: envoy domain \"m\": no descriptors"},
		{"envoy:\n  - domain: m\n    descriptors: [{key: a}]\n  - domain: m\n    descriptors: [{key: a}]\n", "t:11: envoy domain \"m\" appears twice"},
		{"envoy:\n  - domain: m\n    descriptors:\n      - domain: nope\n        key: a\n", `t:11: envoy domain "m" descriptor 1: domain "nope" is not a domain of this file (have api, default)`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - content: c\n", `t:11: envoy domain "m" descriptor 1: key is missing`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: [a, b, c, d, e]\n", `t:11: envoy domain "m" descriptor 1: key has 5 entries, more than 4`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: [a, a]\n", `descriptor 1: key: entry "a" is also in key`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: a\n        content: a\n", `t:12: envoy domain "m" descriptor 1: content: entry "a" is also in key`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: a\n        request_id: b\n        match: {b: x}\n", `t:13: envoy domain "m" descriptor 1: match: entry "b" is also in request_id`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: a\n        match: {b: ''}\n", `match: entry "b" has an empty value`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: ['']\n", `key: an entry key is empty`},
		{"envoy:\n  - domain: m\n    descriptors:\n      - key: a\n        cost: 3\n", `t:12: unknown key "cost" in an envoy descriptor; the keys are match, domain, key, content, request_id`},
	} {
		_, err := Parse("t", []byte(envoyBase+tc.section))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.section, err, tc.want)
		}
	}
}
