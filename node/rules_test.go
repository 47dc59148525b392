package node

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/freqring/freqring/window"
)

func TestDefaultRulesAreTheDesignRules(t *testing.T) {
	rs := DefaultRules()
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
		{"unknown field", strings.Replace(good, "limit:", "limt:", 1), `r.yaml: unmarshal errors:
  line 6: field limt not found`},
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRules("r.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
	rs, err := ParseRules("r.yaml", []byte(good))
	if err != nil || rs.Domain("sms") == nil {
		t.Fatalf("good file: %v", err)
	}
}

func TestLoadRules(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, DefaultRulesYAML(), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := LoadRules(p)
	if err != nil || rs.Source() != p {
		t.Fatalf("LoadRules: %v", err)
	}
	if _, err := LoadRules(p + ".missing"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
}

// FuzzParseRules: any bytes either parse into domains that validate, or fail
// with an error that names the source; never a panic.
func FuzzParseRules(f *testing.F) {
	f.Add(DefaultRulesYAML())
	f.Add([]byte("domains:\n  - name: a\n    rules:\n      - {name: x, scope: recipient, limit: 3, window: 2s}\n"))
	f.Add([]byte("domains: [{name: a, rules: [{name: x, scope: recipient+content, limit: 1000, window: 744h}]}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rs, err := ParseRules("f.yaml", b)
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
		}
	})
}
