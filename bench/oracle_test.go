package bench

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

var twoPerSecond = map[string][]window.Rule{"d": {
	{Name: "r2", Scope: window.ScopeRecipient, Limit: 2, Window: time.Second},
	{Name: "c1", Scope: window.ScopeContent, Limit: 1, Window: time.Second},
}}

func TestAuditFindsOverAdmission(t *testing.T) {
	s := func(rcp string, content uint64, at int64) Send {
		return Send{Domain: "d", Recipient: rcp, Content: content, At: at, Checked: true}
	}
	for _, tc := range []struct {
		name  string
		sends []Send
		want  []string // rule of each violation
	}{
		{"within limits", []Send{s("a", 0, 0), s("a", 0, 500), s("a", 0, 1000), s("b", 0, 0)}, nil},
		{"window boundary excluded", []Send{s("a", 0, 0), s("a", 0, 1), s("a", 0, 1000)}, nil},
		{"one ms short", []Send{s("a", 0, 0), s("a", 0, 1), s("a", 0, 999)}, []string{"r2"}},
		{"same millisecond", []Send{s("a", 0, 7), s("a", 0, 7), s("a", 0, 7)}, []string{"r2"}},
		{"content", []Send{s("a", 9, 0), s("a", 9, 999)}, []string{"c1"}},
		{"other content", []Send{s("a", 9, 0), s("a", 8, 1)}, nil},
		{"cost", []Send{{Domain: "d", Recipient: "a", Cost: 3, At: 0, Checked: true}}, []string{"r2"}},
		{"record-only counts, is not flagged", []Send{{Domain: "d", Recipient: "a", At: 0}, {Domain: "d", Recipient: "a", At: 0}, s("a", 0, 1)}, []string{"r2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Audit(twoPerSecond, tc.sends)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("violations %v, want rules %v", got, tc.want)
			}
			for i, v := range got {
				if v.Rule != tc.want[i] {
					t.Fatalf("violation %d: %v, want rule %s", i, v, tc.want[i])
				}
			}
		})
	}
	if _, err := Audit(twoPerSecond, []Send{{Domain: "nope"}}); err == nil {
		t.Fatal("unknown domain accepted")
	}
}

// TestAuditAgreesWithEngine: what the engine admits passes the audit, and
// adding any one denied attempt as if admitted fails it.
func TestAuditAgreesWithEngine(t *testing.T) {
	rules := window.DefaultRules()
	d, _ := window.NewDomain("default", rules)
	rng := rand.New(rand.NewPCG(7, 7))
	var s window.Scratch
	recs := map[string][]byte{}
	var admitted, denied []Send
	now := int64(1_790_000_000_000)
	for range 20_000 {
		now += int64(rng.IntN(2000))
		rcp := string(rune('a' + rng.IntN(4)))
		content := uint64(rng.IntN(3))
		var dec window.Decision
		out, err := d.Apply(&s, recs[rcp], 0, now, window.Item{Content: content}, &dec)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			recs[rcp] = append([]byte(nil), out...)
		}
		snd := Send{Domain: "default", Recipient: rcp, Content: content, At: dec.At, Checked: true}
		if dec.Admitted {
			admitted = append(admitted, snd)
		} else {
			denied = append(denied, snd)
		}
	}
	all := map[string][]window.Rule{"default": rules}
	if v, _ := Audit(all, admitted); len(v) != 0 {
		t.Fatalf("engine-admitted sends fail the audit: %v", v[0])
	}
	if len(denied) < 100 {
		t.Fatalf("only %d denials: the sequence does not test the limits", len(denied))
	}
	for _, extra := range denied[:100] {
		v, _ := Audit(all, append(append([]Send(nil), admitted...), extra))
		if len(v) == 0 {
			t.Fatalf("a denied send %+v passes the audit when added", extra)
		}
	}
}
