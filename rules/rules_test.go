package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

func TestDefaultRulesAreTheDesignRules(t *testing.T) {
	rs := Default()
	if got := rs.Names(); !reflect.DeepEqual(got, []string{"default"}) {
		t.Fatalf("domains %v", got)
	}
	if got := rs.Domain("default").Rules(); !reflect.DeepEqual(got, window.DefaultRules()) {
		t.Fatalf("embedded rules %+v\nwant %+v", got, window.DefaultRules())
	}
}

func TestParseRulesErrorsNameFileLineAndField(t *testing.T) {
	good := `domains:
  - name: sms
    rules:
      - name: r1
        scope: recipient
        limit: 15
        window: 1m
`
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"empty file", ``, `r.yaml:1: the file is empty`},
		{"no domains", `domains: []`, `r.yaml:1: no domains`},
		{"unknown field", strings.Replace(good, "limit:", "limt:", 1), `r.yaml:6: unknown key "limt" in a rule (did you mean "limit"?)`},
		{"limit zero", strings.Replace(good, "limit: 15", "limit: 0", 1), `r.yaml:6: domain "sms" rule "r1": limit 0 out of range [1, 1000]`},
		{"limit not a number", strings.Replace(good, "limit: 15", "limit: many", 1), `line 6: cannot unmarshal !!str ` + "`many`"},
		{"bad scope", strings.Replace(good, "scope: recipient", "scope: sender", 1), `r.yaml:5: domain "sms" rule "r1": scope "sender" is not one of recipient, recipient+content`},
		{"bad window", strings.Replace(good, "window: 1m", "window: 1 minute", 1), `r.yaml:7: domain "sms" rule "r1": window "1 minute" is not a Go duration`},
		{"window missing", strings.Replace(good, "        window: 1m\n", "", 1), `r.yaml:4: domain "sms" rule "r1": window is missing`},
		{"window too long", strings.Replace(good, "window: 1m", "window: 1000h", 1), `r.yaml:7: domain "sms" rule "r1": window 1000h0m0s out of range [1ms, 744h0m0s]`},
		{"rule name missing", strings.Replace(good, "      - name: r1\n        scope", "      - scope", 1), `r.yaml:4: domain "sms" rule "#1": name is empty`},
		{"domain name missing", strings.Replace(good, "  - name: sms\n    rules", "  - rules", 1), `r.yaml:2: domain 1: name is empty`},
		{"no rules", "domains:\n  - name: x\n", `r.yaml:2: domain "x" has 0 rules, want 1 to 16`},
		{"duplicate rule", good + "      - name: r1\n        scope: recipient\n        limit: 1\n        window: 1s\n", `r.yaml:8: domain "sms": rule name "r1" appears twice`},
		{"duplicate domain", good + strings.TrimPrefix(good, "domains:\n"), `r.yaml:8: domain "sms" appears twice`},
		{"not yaml", "domains: [", `r.yaml: `},
		{"unknown algorithm", strings.Replace(good, "limit: 15", "algorithm: sliding-window\n        limit: 15", 1), `r.yaml:6: domain "sms" rule "r1": algorithm "sliding-window" is not one of sliding-log, sliding-counter, token-bucket, leaky-bucket, gcra, fixed-window`},
		{"log limit beyond a log", strings.Replace(good, "limit: 15", "limit: 10000", 1), `r.yaml:6: domain "sms" rule "r1": limit 10000 out of range [1, 1000] (a sliding-log keeps every send of its window; a counting algorithm takes up to 10000000)`},
		{"counter limit too large", strings.Replace(good, "limit: 15", "algorithm: fixed-window\n        limit: 20000000", 1), `r.yaml:7: domain "sms" rule "r1": limit 20000000 out of range [1, 10000000]`},
		{"capacity on a log", strings.Replace(good, "limit: 15", "limit: 15\n        capacity: 30", 1), `r.yaml:7: domain "sms" rule "r1": capacity 30 is set, but only token-bucket, leaky-bucket and gcra rules have a capacity`},
		{"buckets on a bucket", strings.Replace(good, "limit: 15", "algorithm: gcra\n        limit: 15\n        buckets: 6", 1), `r.yaml:8: domain "sms" rule "r1": buckets 6 is set, but only sliding-counter rules have buckets`},
		{"buckets do not divide", strings.Replace(strings.Replace(good, "limit: 15", "algorithm: sliding-counter\n        limit: 15\n        buckets: 7", 1), "window: 1m", "window: 59s", 1), `r.yaml:8: domain "sms" rule "r1": buckets 7 does not divide the window 59s into whole milliseconds`},
		{"default buckets do not divide", strings.Replace(strings.Replace(good, "limit: 15", "algorithm: sliding-counter\n        limit: 15", 1), "window: 1m", "window: 59s", 1), `domain "sms" rule "r1": buckets 60 does not divide the window 59s`},
		{"capacity negative", strings.Replace(good, "limit: 15", "algorithm: token-bucket\n        limit: 15\n        capacity: -1", 1), `r.yaml:8: domain "sms" rule "r1": capacity -1 out of range [1, 10000000] (0 means the limit)`},
		{"borrow on a bucket", strings.Replace(good, "limit: 15", "algorithm: gcra\n        limit: 15\n        borrow: 300", 1), `r.yaml:8: domain "sms" rule "r1": borrow 300 is set, but only fixed-window rules borrow (algorithm gcra; a bucket borrows up to its capacity)`},
		{"borrow on a log", strings.Replace(good, "limit: 15", "limit: 15\n        borrow: 3", 1), `r.yaml:7: domain "sms" rule "r1": borrow 3 is set, but only fixed-window rules borrow (algorithm sliding-log`},
		{"borrow negative", strings.Replace(good, "limit: 15", "algorithm: fixed-window\n        limit: 15\n        borrow: -1", 1), `r.yaml:8: domain "sms" rule "r1": borrow -1 out of range [0, 10000000]`},
		{"borrow too large", strings.Replace(good, "limit: 15", "algorithm: fixed-window\n        limit: 15\n        borrow: 10000001", 1), `r.yaml:8: domain "sms" rule "r1": borrow 10000001 out of range [0, 10000000]`},
		{"counter per content", strings.Replace(strings.Replace(good, "limit: 15", "algorithm: leaky-bucket\n        limit: 15", 1), "scope: recipient", "scope: recipient+content", 1), `r.yaml:5: domain "sms" rule "r1": scope recipient+content: algorithm leaky-bucket counts per recipient (key) only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
	rs, err := Parse("r.yaml", []byte(good))
	if err != nil || rs.Domain("sms") == nil {
		t.Fatalf("good file: %v", err)
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, DefaultYAML(), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := Load(p)
	if err != nil || rs.Source() != p {
		t.Fatalf("LoadRules: %v", err)
	}
	if _, err := Load(p + ".missing"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
}

// FuzzParseRules: any bytes either parse into domains that validate, or fail
// with an error that names the source; never a panic.
func FuzzParse(f *testing.F) {
	f.Add(DefaultYAML())
	f.Add([]byte("domains:\n  - name: a\n    rules:\n      - {name: x, scope: recipient, limit: 3, window: 2s}\n"))
	f.Add([]byte("domains: [{name: a, rules: [{name: x, scope: recipient+content, limit: 1000, window: 744h}]}]"))
	f.Add([]byte(overridesYAML))
	f.Add([]byte("domains: [{name: a, shadow: true, rules: [{name: x, scope: recipient, limit: 3, window: 2s, shadow: true}]}]\noverrides: [{name: o, domain: a, prefixes: [b], exempt: true}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := Parse("f.yaml", b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, name := range rs.Names() {
			for _, r := range rs.Domain(name).Rules() {
				if err := r.Validate(); err != nil {
					t.Fatalf("accepted an invalid rule: %v", err)
				}
			}
			// Every accepted override binds, and finds its own keys.
			if _, err := Bind(rs.Domain(name), rs.Overrides()); err != nil {
				t.Fatalf("accepted overrides that do not bind: %v", err)
			}
		}
		for _, o := range rs.Overrides() {
			if err := o.Validate(rs); err != nil {
				t.Fatalf("accepted an invalid override: %v", err)
			}
			b, _ := Bind(rs.Domain(o.Domain), rs.Overrides())
			for _, k := range o.Recipients {
				if i := b.Lookup(k); i < 0 || b.Overrides[i].Name != o.Name {
					t.Fatalf("override %q does not decide its own recipient %q", o.Name, k)
				}
			}
		}
	})
}

func TestHashGolden(t *testing.T) {
	// The default rules' hash is part of the cluster protocol: nodes compare
	// it. A change here means nodes of two versions would refuse each other.
	if got, want := Default().Hash(), uint64(0xaaa88df9ddf89dd7); got != want {
		t.Fatalf("Default().Hash() = %#x, want %#x", got, want)
	}
}

func TestHashIgnoresLayoutNotMeaning(t *testing.T) {
	base := Default()
	same, err := Parse("other.yaml", []byte("# a comment\ndomains:\n- name: default\n  rules:\n  - {name: recipient-1m, scope: recipient, limit: 15, window: 60s}\n  - {name: recipient-24h, scope: recipient, limit: 50, window: 1440m}\n  - {name: content-59s, scope: recipient+content, limit: 2, window: 59000ms}\n  - {name: content-59m, scope: recipient+content, limit: 5, window: 59m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if same.Hash() != base.Hash() {
		t.Fatalf("equal rules in another layout hash to %#x, want %#x", same.Hash(), base.Hash())
	}
	f := func(name, yaml string) {
		t.Helper()
		rs, err := Parse(name, []byte(yaml))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rs.Hash() == base.Hash() {
			t.Fatalf("%s: hash %#x equals the defaults'", name, rs.Hash())
		}
	}
	f("limit", "domains:\n- name: default\n  rules:\n  - {name: recipient-1m, scope: recipient, limit: 16, window: 1m}\n")
	f("window", "domains:\n- name: default\n  rules:\n  - {name: recipient-1m, scope: recipient, limit: 15, window: 61s}\n")
	f("scope", "domains:\n- name: default\n  rules:\n  - {name: recipient-1m, scope: recipient+content, limit: 15, window: 1m}\n")
	f("rule name", "domains:\n- name: default\n  rules:\n  - {name: r, scope: recipient, limit: 15, window: 1m}\n")
	f("domain name", "domains:\n- name: sms\n  rules:\n  - {name: recipient-1m, scope: recipient, limit: 15, window: 1m}\n")
	a, _ := Parse("a", []byte("domains:\n- name: a\n  rules:\n  - {name: x, scope: recipient, limit: 1, window: 1m}\n  - {name: y, scope: recipient, limit: 2, window: 1h}\n"))
	b, _ := Parse("b", []byte("domains:\n- name: a\n  rules:\n  - {name: y, scope: recipient, limit: 2, window: 1h}\n  - {name: x, scope: recipient, limit: 1, window: 1m}\n"))
	if a.Hash() == b.Hash() {
		t.Fatal("rule order changes what a check reports, but not the hash")
	}
}

// TestShadowRulesAndDomains: "shadow: true" on a rule makes that rule a
// shadow, on a domain every rule of it; each changes the hash (a node must
// not take a shadowed limit for the enforced one); an unknown field beside
// it is still an error.
func TestShadowRulesAndDomains(t *testing.T) {
	def := string(DefaultYAML())
	base := Default()
	ruleShadow := strings.Replace(def, "        limit: 15\n", "        limit: 15\n        shadow: true\n", 1)
	domainShadow := strings.Replace(def, "  - name: default\n", "  - name: default\n    shadow: true\n", 1)
	if ruleShadow == def || domainShadow == def {
		t.Fatal("the default rules file changed shape: fix the test's edits")
	}
	hashes := map[uint64]string{base.Hash(): "no shadow"}
	for _, tc := range []struct {
		name, yaml string
		shadows    []bool
	}{
		{"rule", ruleShadow, []bool{true, false, false, false}},
		{"domain", domainShadow, []bool{true, true, true, true}},
		{"both", strings.Replace(domainShadow, "        limit: 15\n", "        limit: 15\n        shadow: true\n", 1), []bool{true, true, true, true}},
	} {
		rs, err := Parse(tc.name, []byte(tc.yaml))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []bool
		for _, r := range rs.Domain("default").Rules() {
			got = append(got, r.Shadow)
		}
		if !reflect.DeepEqual(got, tc.shadows) {
			t.Fatalf("%s: shadow flags %v, want %v", tc.name, got, tc.shadows)
		}
		if prev, ok := hashes[rs.Hash()]; ok && tc.name != "both" {
			t.Fatalf("%s: hash %#x equals that of %s", tc.name, rs.Hash(), prev)
		}
		hashes[rs.Hash()] = tc.name
	}
	if _, err := Parse("r.yaml", []byte(strings.Replace(ruleShadow, "shadow: true", "shadow: true\n        shaddow: true", 1))); err == nil || !strings.Contains(err.Error(), `r.yaml:10: unknown key "shaddow" in a rule (did you mean "shadow"?)`) {
		t.Fatalf("unknown field beside shadow: %v", err)
	}
	if _, err := Parse("r.yaml", []byte(strings.Replace(ruleShadow, "shadow: true", "shadow: maybe", 1))); err == nil || !strings.Contains(err.Error(), "line 9: cannot unmarshal !!str `maybe` into bool") {
		t.Fatalf("shadow: maybe: %v", err)
	}
}

// TestAlgorithmsParse reads every algorithm and its parameters, leaves the
// scope of a counting rule to default to recipient, and hashes each choice
// apart while a sliding-log file hashes as before algorithms existed.
func TestAlgorithmsParse(t *testing.T) {
	file := func(extra string) string {
		return "domains:\n  - name: api\n    rules:\n      - name: hourly\n        limit: 10000\n        window: 1h\n" + extra
	}
	seen := map[uint64]string{}
	for _, tc := range []struct {
		extra string
		want  window.Rule
	}{
		{"        algorithm: sliding-counter\n", window.Rule{Algorithm: window.SlidingCounter}},
		{"        algorithm: sliding-counter\n        buckets: 12\n", window.Rule{Algorithm: window.SlidingCounter, Buckets: 12}},
		{"        algorithm: token-bucket\n", window.Rule{Algorithm: window.TokenBucket}},
		{"        algorithm: token-bucket\n        capacity: 500\n", window.Rule{Algorithm: window.TokenBucket, Capacity: 500}},
		{"        algorithm: leaky-bucket\n        capacity: 500\n", window.Rule{Algorithm: window.LeakyBucket, Capacity: 500}},
		{"        algorithm: gcra\n        capacity: 500\n", window.Rule{Algorithm: window.GCRA, Capacity: 500}},
		{"        algorithm: fixed-window\n", window.Rule{Algorithm: window.FixedWindow}},
		{"        algorithm: fixed-window\n        scope: recipient\n", window.Rule{Algorithm: window.FixedWindow}},
		{"        algorithm: fixed-window\n        borrow: 300\n", window.Rule{Algorithm: window.FixedWindow, Borrow: 300}},
		{"        algorithm: fixed-window\n        borrow: 301\n", window.Rule{Algorithm: window.FixedWindow, Borrow: 301}},
	} {
		rs, err := Parse("a.yaml", []byte(file(tc.extra)))
		if err != nil {
			t.Fatalf("%q: %v", tc.extra, err)
		}
		got := rs.Domain("api").Rule(0)
		want := tc.want
		want.Name, want.Scope, want.Limit, want.Window = "hourly", window.ScopeRecipient, 10000, time.Hour
		if got != want {
			t.Fatalf("%q: rule %+v, want %+v", tc.extra, got, want)
		}
		if prev, ok := seen[rs.Hash()]; ok && prev != fmt.Sprint(want) {
			t.Fatalf("%q hashes as %s", tc.extra, prev)
		}
		seen[rs.Hash()] = fmt.Sprint(want)
	}
	log, err := Parse("a.yaml", []byte(strings.Replace(file("        scope: recipient\n"), "10000", "1000", 1)))
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := Parse("a.yaml", []byte(strings.Replace(file("        scope: recipient\n        algorithm: sliding-log\n"), "10000", "1000", 1)))
	if err != nil || explicit.Hash() != log.Hash() {
		t.Fatalf("algorithm: sliding-log spelled out changes the hash (%v)", err)
	}
	fixed, err := Parse("a.yaml", []byte(file("        algorithm: fixed-window\n")))
	if err != nil {
		t.Fatal(err)
	}
	zero, err := Parse("a.yaml", []byte(file("        algorithm: fixed-window\n        borrow: 0\n")))
	if err != nil || zero.Hash() != fixed.Hash() {
		t.Fatalf("borrow: 0 spelled out changes the hash (%v)", err)
	}
}

// TestCalendarRules: calendar: and zone: make a fixed-window rule count per
// calendar period in a zone; mistakes name the file, line and field; each
// calendar and zone hashes differently, and other rules hash as before.
func TestCalendarRules(t *testing.T) {
	file := func(extra string) string {
		return "domains:\n  - name: mkt\n    rules:\n      - name: daily\n        algorithm: fixed-window\n        limit: 3\n" + extra
	}
	rs, err := Parse("c.yaml", []byte(file("        calendar: day\n        zone: America/New_York\n")))
	if err != nil {
		t.Fatal(err)
	}
	want := window.Rule{Name: "daily", Scope: window.ScopeRecipient, Algorithm: window.FixedWindow, Limit: 3, Calendar: window.CalendarDay, Zone: "America/New_York"}
	if got := rs.Domain("mkt").Rule(0); got != want {
		t.Fatalf("rule %+v, want %+v", got, want)
	}
	for _, tc := range []struct{ extra, want string }{
		{"        calendar: fortnight\n", `c.yaml:7: domain "mkt" rule "daily": calendar "fortnight" is not one of hour, day, week, month`},
		{"        calendar: day\n        zone: Mars/Olympus_Mons\n", `c.yaml:8: domain "mkt" rule "daily": zone "Mars/Olympus_Mons" is not a time zone of the tz database`},
		{"        calendar: day\n        zone: Local\n", `c.yaml:8: domain "mkt" rule "daily": zone "Local" is each node's own zone`},
		{"        window: 24h\n        zone: Asia/Shanghai\n", `c.yaml:8: domain "mkt" rule "daily": zone "Asia/Shanghai" is set, but only calendar rules have a zone`},
		{"        calendar: day\n        window: 24h\n", `c.yaml:8: domain "mkt" rule "daily": window 24h0m0s is set, but a calendar rule's window is its calendar period (calendar day)`},
		{"        window: 24h\n", ""},
	} {
		_, err := Parse("c.yaml", []byte(file(tc.extra)))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.extra, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v\nwant it to contain %q", tc.extra, err, tc.want)
		}
	}
	_, err = Parse("c.yaml", []byte(strings.Replace(file("        calendar: day\n"), "algorithm: fixed-window", "algorithm: gcra", 1)))
	if err == nil || !strings.Contains(err.Error(), `c.yaml:7: domain "mkt" rule "daily": calendar day is set, but only fixed-window rules have calendar windows (algorithm gcra)`) {
		t.Errorf("calendar on gcra: %v", err)
	}
	seen := map[uint64]string{}
	for _, extra := range []string{
		"        window: 1h\n",
		"        window: 24h\n",
		"        calendar: hour\n",
		"        calendar: day\n",
		"        calendar: week\n",
		"        calendar: month\n",
		"        calendar: day\n        zone: America/New_York\n",
		"        calendar: day\n        zone: Europe/London\n",
	} {
		rs, err := Parse("c.yaml", []byte(file(extra)))
		if err != nil {
			t.Fatalf("%q: %v", extra, err)
		}
		if prev, ok := seen[rs.Hash()]; ok {
			t.Fatalf("%q hashes as %q", extra, prev)
		}
		seen[rs.Hash()] = extra
	}
}

// TestUnknownKeys: a key that names no field, at any depth, is refused with
// the file, the key's line, the section and the closest key, or every key of
// the section when none is close; the keys come from the yaml tags, so they
// are always those of the types.
func TestUnknownKeys(t *testing.T) {
	good := `domains:
  - name: sms
    rules:
      - name: r1
        scope: recipient
        limit: 15
        window: 1m
overrides:
  - name: vip
    domain: sms
    recipients: [a]
    limits: {r1: 30}
envoy:
  - domain: mesh
    descriptors:
      - {domain: sms, key: user}
`
	if _, err := Parse("r.yaml", []byte(good)); err != nil {
		t.Fatalf("good file: %v", err)
	}
	for _, tc := range []struct{ old, new, want string }{
		{"limit:", "limt:", `r.yaml:6: unknown key "limt" in a rule (did you mean "limit"?)`},
		{"window:", "Window:", `r.yaml:7: unknown key "Window" in a rule (did you mean "window"?)`},
		{"limit: 15", "limit: 15\n        per: day", `r.yaml:7: unknown key "per" in a rule; the keys are name, scope, limit, window, shadow, algorithm, capacity, buckets, borrow, calendar, zone`},
		{"    rules:", "    shadw: true\n    rules:", `r.yaml:3: unknown key "shadw" in a domain (did you mean "shadow"?)`},
		{"domains:", "domain:", `r.yaml:1: unknown key "domain" in the rules file (did you mean "domains"?)`},
		{"overrides:", "overides:", `r.yaml:8: unknown key "overides" in the rules file (did you mean "overrides"?)`},
		{"    recipients:", "    recipient:", `r.yaml:11: unknown key "recipient" in an override (did you mean "recipients"?)`},
		{"    limits:", "    exempt: true\n    limitz:", `r.yaml:13: unknown key "limitz" in an override (did you mean "limits"?)`},
		{"    descriptors:", "    descriptor:", `r.yaml:15: unknown key "descriptor" in an envoy domain (did you mean "descriptors"?)`},
		{"key: user}", "keys: user}", `r.yaml:16: unknown key "keys" in an envoy descriptor (did you mean "key"?)`},
		{"key: user}", "key: user, cost: 3}", `r.yaml:16: unknown key "cost" in an envoy descriptor; the keys are match, domain, key, content, request_id`},
	} {
		y := strings.Replace(good, tc.old, tc.new, 1)
		if y == good {
			t.Fatalf("%q: the edit changed nothing", tc.new)
		}
		_, err := Parse("r.yaml", []byte(y))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: error %v\nwant %s", tc.new, err, tc.want)
		}
	}
	// A merge key brings its mapping's keys into a rule, which are checked
	// there (the anchor is in a map, whose keys are free).
	merged := `envoy:
  - domain: mesh
    descriptors:
      - {domain: sms, key: user, match: &b {limt: "3"}}
domains:
  - name: sms
    rules:
      - name: r1
        <<: *b
        scope: recipient
        window: 1m
`
	if _, err := Parse("r.yaml", []byte(merged)); err == nil || err.Error() != `r.yaml:4: unknown key "limt" in a rule (did you mean "limit"?)` {
		t.Errorf("merge: %v", err)
	}
	// Load names the file.
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(good, "limit:", "limt:", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || err.Error() != path+`:6: unknown key "limt" in a rule (did you mean "limit"?)` {
		t.Errorf("Load: %v", err)
	}
}
