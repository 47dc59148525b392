package rules

import (
	"strings"
	"testing"
)

// TestDurability: a domain names its durability or takes the node's
// default; a value that is none of the three is refused with its line,
// domain and value; naming one changes the hash, and naming none keeps
// the hash of before durability existed.
func TestDurability(t *testing.T) {
	def := string(DefaultYAML())
	base := Default()
	if base.Durability("default") != DurabilityDefault {
		t.Fatalf("the default rules name durability %v", base.Durability("default"))
	}
	hashes := map[uint64]string{base.Hash(): "none"}
	for _, d := range []Durability{DurabilityFsync, DurabilityReplicated, DurabilityAsync} {
		yaml := strings.Replace(def, "  - name: default\n", "  - name: default\n    durability: "+d.String()+"\n", 1)
		if yaml == def {
			t.Fatal("the default rules file changed shape: fix the test's edit")
		}
		rs, err := Parse(d.String(), []byte(yaml))
		if err != nil {
			t.Fatalf("%v: %v", d, err)
		}
		if got := rs.Durability("default"); got != d {
			t.Fatalf("durability %v, want %v", got, d)
		}
		if prev, ok := hashes[rs.Hash()]; ok {
			t.Fatalf("durability %v hashes as %s", d, prev)
		}
		hashes[rs.Hash()] = d.String()
		if back, err := ParseDurability(d.String()); err != nil || back != d {
			t.Fatalf("ParseDurability(%q) = %v, %v", d.String(), back, err)
		}
	}
	_, err := Parse("bad.yaml", []byte("domains:\n- name: sms\n  durability: paranoid\n  rules:\n  - {name: r, scope: recipient, limit: 1, window: 1m}\n"))
	if err == nil || !strings.Contains(err.Error(), `bad.yaml:3: domain "sms": durability "paranoid" is not one of fsync, replicated, async`) {
		t.Fatalf("a bad durability: %v", err)
	}
}
