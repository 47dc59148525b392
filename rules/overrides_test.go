package rules

import (
	"strings"
	"testing"
)

const overridesYAML = `domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 15, window: 1m}
      - {name: recipient-24h, scope: recipient, limit: 50, window: 24h}
overrides:
  - name: vip
    domain: default
    recipients: ["+8613800000000", "+15550001"]
    limits: {recipient-1m: 100}
  - name: us-test
    domain: default
    prefixes: ["+1555"]
    exempt: true
  - name: us
    domain: default
    prefixes: ["+1"]
    limits: {recipient-24h: 5}
`

func TestParseOverrides(t *testing.T) {
	rs, err := Parse("o.yaml", []byte(overridesYAML))
	if err != nil {
		t.Fatal(err)
	}
	os := rs.Overrides()
	if len(os) != 3 || os[0].Name != "vip" || os[0].Limits["recipient-1m"] != 100 || !os[1].Exempt || os[2].Prefixes[0] != "+1" {
		t.Fatalf("overrides %+v", os)
	}
	base, err := Parse("o.yaml", []byte(overridesYAML[:strings.Index(overridesYAML, "overrides:")]))
	if err != nil {
		t.Fatal(err)
	}
	if base.Hash() == rs.Hash() {
		t.Fatal("overrides do not change the hash")
	}
	edited, _ := Parse("o.yaml", []byte(strings.Replace(overridesYAML, "recipient-1m: 100", "recipient-1m: 101", 1)))
	if edited.Hash() == rs.Hash() {
		t.Fatal("an override's limit does not change the hash")
	}
	reordered, _ := Parse("o.yaml", []byte(strings.Replace(overridesYAML, `["+8613800000000", "+15550001"]`, `["+15550001", "+8613800000000"]`, 1)))
	if reordered.Hash() != rs.Hash() {
		t.Fatal("the order of an override's recipients changes the hash")
	}
}

// TestOverrideErrorsNameFileLineAndField: each malformed override is
// refused with the file, the line and the field.
func TestOverrideErrorsNameFileLineAndField(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown rule", "recipient-1m: 100", "recipient-2m: 100", `o.yaml:10: override "vip": limits: unknown rule "recipient-2m" of domain "default"`},
		{"limit zero", "recipient-1m: 100", "recipient-1m: 0", `o.yaml:10: override "vip": limits: rule "recipient-1m": limit 0 out of range [1, 1000]`},
		{"limit high", "recipient-1m: 100", "recipient-1m: 1001", `limit 1001 out of range [1, 1000]`},
		{"unknown domain", "    domain: default\n    prefixes: [\"+1555\"]", "    domain: sms\n    prefixes: [\"+1555\"]", `o.yaml:12: override "us-test": domain: unknown domain "sms"`},
		{"no keys", `    recipients: ["+8613800000000", "+15550001"]` + "\n", "", `o.yaml:7: override "vip": recipients: no recipients and no prefixes`},
		{"empty key", `"+15550001"]`, `""]`, `o.yaml:9: override "vip": recipients: entry 1 is empty`},
		{"exempt and limits", "    exempt: true", "    exempt: true\n    limits: {recipient-1m: 3}", `override "us-test": exempt: exempt and limits both set`},
		{"neither", "    exempt: true\n", "", `o.yaml:11: override "us-test": limits: no limits and not exempt`},
		{"duplicate name", "name: us\n", "name: vip\n", `o.yaml:15: override "vip" appears twice`},
		{"key twice", `prefixes: ["+1"]`, `prefixes: ["+1555"]`, `o.yaml:17: override "us": prefixes: "+1555" is also in override "us-test"`},
		{"unknown field", "exempt: true", "exmpt: true", `o.yaml:14: unknown key "exmpt" in an override (did you mean "exempt"?)`},
		{"no name", "  - name: us\n", "  - \n", `override "#3": name: is empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := strings.Replace(overridesYAML, tc.old, tc.new, 1)
			if y == overridesYAML {
				t.Fatal("the edit changed nothing")
			}
			_, err := Parse("o.yaml", []byte(y))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestBindPrecedence: an exact key beats any prefix, the longest prefix
// wins, a key no override lists has none; when two overrides claim one key
// (an admin override and a file one), the newer version wins.
func TestBindPrecedence(t *testing.T) {
	rs, err := Parse("o.yaml", []byte(overridesYAML))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Bind(rs.Domain("default"), rs.Overrides())
	if err != nil {
		t.Fatal(err)
	}
	name := func(key string) string {
		if i := b.Lookup(key); i >= 0 {
			return b.Overrides[i].Name
		}
		return ""
	}
	for key, want := range map[string]string{
		"+15550001":      "vip",     // exact beats the prefixes +1555 and +1
		"+15550002":      "us-test", // +1555 is longer than +1
		"+1555":          "us-test",
		"+1212":          "us",
		"+1":             "us",
		"+8613800000000": "vip",
		"+8613800000001": "",
		"+":              "",
		"":               "",
	} {
		if got := name(key); got != want {
			t.Errorf("Lookup(%q) = %q, want %q", key, got, want)
		}
	}
	// The family keeps what any member counts: recipient-1m raised to 100.
	if rc, _ := b.Base.Caps(); rc != 100 {
		t.Fatalf("base recipient cap %d, want 100", rc)
	}
	for _, o := range b.Overrides {
		if rc, _ := o.Domain.Caps(); rc != 100 {
			t.Fatalf("override %s recipient cap %d, want 100", o.Name, rc)
		}
	}
	if !b.Overrides[b.Lookup("+1555")].Domain.Rule(0).Shadow {
		t.Fatal("an exempt override's rules are not shadows")
	}
	newer := Override{Name: "a-admin", Domain: "default", Recipients: []string{"+15550001"}, Limits: map[string]int{"recipient-1m": 1}, Version: 5}
	b, err = Bind(rs.Domain("default"), append(rs.Overrides(), newer))
	if err != nil {
		t.Fatal(err)
	}
	if got := name("+15550001"); got != "a-admin" {
		t.Fatalf("Lookup after a newer override of the same key = %q, want a-admin", got)
	}
	if empty, _ := Bind(rs.Domain("default"), nil); empty.Lookup("+1") != -1 || empty.Base != rs.Domain("default") {
		t.Fatal("a binding without overrides finds one, or changes the domain")
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	rs, _ := Parse("o.yaml", []byte(overridesYAML))
	b, _ := Bind(rs.Domain("default"), rs.Overrides())
	keys := []string{"+15550001", "+15559999", "+4412345", "+1212"}
	if a := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			b.Lookup(k)
		}
	}); a != 0 {
		t.Fatalf("Lookup allocates %v times", a)
	}
}
