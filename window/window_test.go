package window

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const t0 = int64(1_790_000_000_000) // 2026-09-21, unix ms

// harness drives one recipient's record through Apply.
type harness struct {
	t   *testing.T
	d   *Domain
	s   Scratch
	rec []byte
}

func newHarness(t *testing.T, rules ...Rule) *harness {
	t.Helper()
	if len(rules) == 0 {
		rules = DefaultRules()
	}
	d, err := NewDomain("test", rules)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, d: d}
}

func (h *harness) apply(now int64, it Item) Decision {
	h.t.Helper()
	var dec Decision
	out, err := h.d.Apply(&h.s, h.rec, 7, now, it, &dec)
	if err != nil {
		h.t.Fatalf("Apply(t0%+dms, %+v): %v", now-t0, it, err)
	}
	if out != nil {
		h.rec = append(h.rec[:0], out...)
	}
	return dec
}

func (h *harness) send(now int64) Decision { return h.apply(now, Item{}) }

func rule(name string, scope Scope, limit int, w time.Duration) Rule {
	return Rule{Name: name, Scope: scope, Limit: limit, Window: w}
}

func TestWindowBoundary(t *testing.T) {
	h := newHarness(t, rule("one-per-minute", ScopeRecipient, 1, time.Minute))
	if d := h.send(t0); !d.Admitted || !d.Recorded {
		t.Fatalf("first send: %+v", d)
	}
	d := h.send(t0 + 60_000 - 1)
	if d.Admitted || d.DeniedBy != 0 || d.RetryAfter != 1 {
		t.Fatalf("send 1 ms before the old one leaves the window: admitted=%v deniedBy=%d retry=%d, want denied, rule 0, retry 1 ms", d.Admitted, d.DeniedBy, d.RetryAfter)
	}
	if d := h.send(t0 + 60_000); !d.Admitted {
		t.Fatalf("send exactly W after the old one: denied, retry %d ms; (t-W, t] excludes it", d.RetryAfter)
	}
}

func TestRetryAfterExactToTheMillisecond(t *testing.T) {
	h := newHarness(t, rule("three-per-10s", ScopeRecipient, 3, 10*time.Second))
	for _, at := range []int64{0, 1234, 5678} {
		h.send(t0 + at)
	}
	// Oldest at t0 leaves at t0+10000.
	for _, tc := range []struct {
		at        int64
		admitted  bool
		retry     int64
		used, rem int
	}{
		{at: 6000, retry: 4000, used: 3, rem: 0},
		{at: 9999, retry: 1, used: 3, rem: 0},
		{at: 10000, admitted: true, used: 3, rem: 0}, // admitted: 2 in window, then recorded
		{at: 10001, retry: 1233, used: 3, rem: 0},    // 1234, 5678, 10000 in window
	} {
		d := h.send(t0 + tc.at)
		r := d.Rules[0]
		if d.Admitted != tc.admitted || d.RetryAfter != tc.retry || r.RetryAfter != tc.retry || r.Used != tc.used || r.Remaining != tc.rem {
			t.Errorf("t0+%d: admitted=%v retry=%d rule=%+v, want admitted=%v retry=%d used=%d remaining=%d",
				tc.at, d.Admitted, d.RetryAfter, r, tc.admitted, tc.retry, tc.used, tc.rem)
		}
	}
}

func TestCostNearTheLimit(t *testing.T) {
	h := newHarness(t, rule("fifteen-per-minute", ScopeRecipient, 15, time.Minute))
	for i := range 13 {
		h.send(t0 + int64(i)*1000)
	}
	d := h.apply(t0+20_000, Item{Cost: 3})
	// 13 + 3 > 15: need the 13th newest (t0) to leave: retry at t0+60000.
	if d.Admitted || d.RetryAfter != 40_000 || d.Rules[0].Used != 13 || d.Rules[0].Remaining != 2 {
		t.Fatalf("cost 3 with 13 used of 15: %+v, want denied, retry 40000, used 13, remaining 2", d)
	}
	d = h.apply(t0+20_000, Item{Cost: 2})
	if !d.Admitted || d.Rules[0].Used != 15 || d.Rules[0].Remaining != 0 {
		t.Fatalf("cost 2 with 13 used of 15: %+v, want admitted, used 15, remaining 0", d)
	}
	// Now 15 entries: t0..t0+12000 and two at t0+20000. A cost-2 item
	// needs the 14th newest (t0+1000) to leave: at t0+61000.
	d = h.apply(t0+30_000, Item{Cost: 2})
	if d.Admitted || d.RetryAfter != 31_000 {
		t.Fatalf("cost 2 at the limit: %+v, want retry 31000", d)
	}
	if d := h.apply(t0+61_000, Item{Cost: 2}); !d.Admitted {
		t.Fatalf("cost 2 once two sends left: %+v", d)
	}
	var dec Decision
	_, err := h.d.Apply(&h.s, h.rec, 0, t0+200_000, Item{Cost: 16}, &dec)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `cost 16 exceeds limit 15 of rule "fifteen-per-minute"`) {
		t.Fatalf("cost above the limit: err %v", err)
	}
}

func TestPeekNeverChangesState(t *testing.T) {
	h := newHarness(t)
	for i := range 20 {
		before := string(h.rec)
		d := h.apply(t0+int64(i)*100, Item{Mode: Peek, Content: 42})
		if d.Recorded || string(h.rec) != before {
			t.Fatalf("peek %d changed the record", i)
		}
		if d.Admitted != (i < 15) {
			t.Fatalf("peek %d after %d recorded sends: %+v", i, i, d)
		}
		h.apply(t0+int64(i)*100, Item{Content: uint64(i + 1)}) // distinct contents
	}
	// 15 recorded (the 1-minute limit), then 5 denied.
	d := h.apply(t0+2000, Item{Mode: Peek, Content: 99})
	if d.Admitted || d.DeniedBy != 0 || d.Rules[0].Used != 15 {
		t.Fatalf("peek at the limit: %+v", d)
	}
	before := string(h.rec)
	h.apply(t0+2000, Item{Mode: Peek, Content: 99, Cost: 2})
	if string(h.rec) != before {
		t.Fatal("denied peek changed the record")
	}
}

func TestRecordOnly(t *testing.T) {
	h := newHarness(t, rule("two-per-minute", ScopeRecipient, 2, time.Minute), rule("three-per-hour", ScopeRecipient, 3, time.Hour))
	for i := range 5 {
		d := h.apply(t0+int64(i), Item{Mode: RecordOnly})
		if !d.Admitted || !d.Recorded {
			t.Fatalf("record-only %d: %+v", i, d)
		}
	}
	d := h.send(t0 + 10)
	// The log keeps the newest 3 (the largest limit); used saturates there.
	if d.Admitted || d.DeniedBy != 1 || d.Rules[0].Used != 3 || d.Rules[0].Remaining != 0 || d.Rules[1].Used != 3 {
		t.Fatalf("after 5 record-only sends: %+v", d)
	}
	// The 3rd newest (t0+2) leaves the hour window at t0+2+3600000.
	if d.RetryAfter != 3_600_000+2-10 {
		t.Fatalf("retry %d, want %d", d.RetryAfter, 3_600_000+2-10)
	}
	if d.Rules[0].RetryAfter != 60_000+3-10 {
		t.Fatalf("rule 0 retry %d, want %d (2nd newest is t0+3)", d.Rules[0].RetryAfter, 60_000+3-10)
	}
}

func TestContentRules(t *testing.T) {
	h := newHarness(t)
	a, b := Item{Content: 0xa}, Item{Content: 0xb}
	h.apply(t0, a)
	h.apply(t0+1000, a)
	d := h.apply(t0+2000, a)
	if d.Admitted || d.DeniedBy != 2 || d.RetryAfter != 59_000-2000 {
		t.Fatalf("third identical content within 59s: %+v, want denied by content-59s, retry 57000", d)
	}
	if d := h.apply(t0+2000, b); !d.Admitted {
		t.Fatalf("other content: %+v", d)
	}
	if d := h.apply(t0+2000, Item{}); !d.Admitted || d.Rules[2] != (RuleResult{Remaining: 2}) || d.Rules[0].Used != 4 {
		t.Fatalf("no content: content rules must not apply: %+v", d)
	}
	// content-59m: 5 per 59 minutes. Two more pairs of a, 59 s apart.
	for _, at := range []int64{59_000, 60_000, 118_000} {
		if d := h.apply(t0+at, a); !d.Admitted {
			t.Fatalf("a at %d: %+v", at, d)
		}
	}
	d = h.apply(t0+119_000, a)
	if d.Admitted || d.DeniedBy != 3 || d.RetryAfter != 59*60_000-119_000 {
		t.Fatalf("sixth a within 59m: %+v, want denied by content-59m at t0+59m", d)
	}
}

func TestClockStepsBack(t *testing.T) {
	h := newHarness(t, rule("two-per-second", ScopeRecipient, 2, time.Second))
	h.send(t0 + 5000)
	d := h.send(t0 + 1000) // clock stepped back 4 s
	if !d.Admitted || d.At != t0+5000 {
		t.Fatalf("send with an earlier clock: %+v, want admitted at the newest send (t0+5000)", d)
	}
	d = h.send(t0)
	if d.Admitted || d.At != t0+5000 || d.RetryAfter != 1000 {
		t.Fatalf("third send: %+v, want denied at t0+5000 with retry 1000", d)
	}
}

func TestApplyRejectsBadItems(t *testing.T) {
	h := newHarness(t)
	h.send(t0)
	before := string(h.rec)
	for _, tc := range []struct {
		name string
		now  int64
		it   Item
		want string
	}{
		{"negative cost", t0, Item{Cost: -1}, "cost -1 out of range [1, 1000]"},
		{"huge cost", t0, Item{Cost: MaxCost + 1}, "cost 1001 out of range"},
		{"bad mode", t0, Item{Mode: 9}, "mode 9 is not one of"},
		{"negative time", -1, Item{}, "time -1 ms out of range"},
		{"far future", 1 << 50, Item{}, "out of range [0, 17592186044415]"},
		{"cost over a limit", t0, Item{Cost: 16}, `cost 16 exceeds limit 15 of rule "recipient-1m"`},
		{"cost over a content limit", t0, Item{Cost: 3, Content: 1}, `cost 3 exceeds limit 2 of rule "content-59s"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dec Decision
			out, err := h.d.Apply(&h.s, h.rec, 0, tc.now, tc.it, &dec)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || out != nil {
				t.Fatalf("err %v, out %x; want ErrInvalid containing %q", err, out, tc.want)
			}
			if string(h.rec) != before {
				t.Fatal("record changed")
			}
		})
	}
}

func TestNewDomainValidation(t *testing.T) {
	ok := rule("r", ScopeRecipient, 1, time.Second)
	for _, tc := range []struct {
		name  string
		rules []Rule
		want  string
	}{
		{"no rules", nil, `domain "d" has 0 rules, want 1 to 16`},
		{"limit 0", []Rule{rule("r", ScopeRecipient, 0, time.Second)}, `rule "r": limit 0 out of range [1, 1000]`},
		{"limit too big", []Rule{rule("r", ScopeRecipient, 10_000, time.Hour)}, `limit 10000 out of range [1, 1000]`},
		{"window 0", []Rule{rule("r", ScopeRecipient, 1, 0)}, `window 0s out of range [1ms, 744h0m0s]`},
		{"window too long", []Rule{rule("r", ScopeRecipient, 1, 800*time.Hour)}, `window 800h0m0s out of range`},
		{"window sub-ms", []Rule{rule("r", ScopeRecipient, 1, 1500*time.Microsecond)}, `window 1.5ms is not a whole number of milliseconds`},
		{"bad scope", []Rule{rule("r", 7, 1, time.Second)}, `scope Scope(7) is not one of`},
		{"no name", []Rule{rule("", ScopeRecipient, 1, time.Second)}, `rule "": name is empty`},
		{"duplicate", []Rule{ok, ok}, `rule name "r" appears twice`},
		{"too many", make([]Rule, 17), `has 17 rules, want 1 to 16`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDomain("d", tc.rules)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := NewDomain("", []Rule{ok}); err == nil {
		t.Fatal("empty domain name accepted")
	}
}

func TestPruneKeepsRecordsSmall(t *testing.T) {
	h := newHarness(t)
	// 50 sends a day for 10 days, 3 contents: the record must not grow
	// beyond what the last 24 hours need.
	var maxLen int
	for day := range 10 {
		for i := range 50 {
			at := t0 + int64(day)*86_400_000 + int64(i)*1_700_000
			h.apply(at, Item{Content: uint64(i%3 + 1)})
			maxLen = max(maxLen, len(h.rec))
		}
	}
	if maxLen > 256 {
		t.Fatalf("record grew to %d bytes", maxLen)
	}
	var st state
	if err := st.decode(h.rec); err != nil {
		t.Fatal(err)
	}
	if len(st.recip) > 50 || len(st.clogs) > 3 {
		t.Fatalf("kept %d recipient entries, %d content logs", len(st.recip), len(st.clogs))
	}
	for _, c := range st.clogs {
		if c.n > 5 {
			t.Fatalf("content log kept %d entries, more than the largest content limit", c.n)
		}
	}
}

func TestApplyDoesNotAllocate(t *testing.T) {
	h := newHarness(t)
	now := t0
	items := []Item{{Content: 1}, {Content: 2}, {}, {Content: 3, Mode: Peek}}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		h.apply(now, items[i%len(items)])
		now += 997
		i++
	})
	if allocs != 0 {
		t.Fatalf("Apply allocates %.1f times per call", allocs)
	}
}

func TestRecordTag(t *testing.T) {
	h := newHarness(t)
	h.send(t0)
	if RecordTag(h.rec) != 7 {
		t.Fatalf("tag %d, want 7", RecordTag(h.rec))
	}
	if n, err := RecordNewest(h.rec); err != nil || n != t0 {
		t.Fatalf("RecordNewest = %d, %v", n, err)
	}
	if _, err := RecordNewest([]byte{1}); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("short record: %v", err)
	}
}

// TestCountAfter checks countAfter against a count by definition on every
// bound around every entry of logs with repeated entries, including bounds
// past either end.
func TestCountAfter(t *testing.T) {
	for _, log := range [][]int64{
		nil, {5}, {5, 5}, {1, 2}, {1, 1, 2, 3, 3, 3, 7}, {0, 10, 20, 30, 40, 50, 60, 70, 80},
	} {
		for bound := int64(-1); bound <= 81; bound++ {
			want := 0
			for _, e := range log {
				if e > bound {
					want++
				}
			}
			if got := countAfter(log, bound); got != want {
				t.Errorf("countAfter(%v, %d) = %d, want %d", log, bound, got, want)
			}
		}
	}
}
