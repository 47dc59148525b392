package node

import (
	"strings"
	"testing"
	"time"

	"github.com/freqring/freqring/window"
)

// TestGrowthNamesCountingRulesThatStartAfresh: a counting rule keeps its
// state across a reload only under the same name, algorithm, window and
// buckets; any other is logged as counting from the reload on.
func TestGrowthNamesCountingRulesThatStartAfresh(t *testing.T) {
	dom := func(rs ...window.Rule) *window.Domain {
		d, err := window.NewDomain("api", rs)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	hour := window.Rule{Name: "hour", Scope: window.ScopeRecipient, Algorithm: window.SlidingCounter, Limit: 10_000, Window: time.Hour}
	from := dom(hour)
	more := hour
	more.Limit = 20_000 // the state's units do not depend on the limit
	if g := growth(from, dom(more)); len(g) != 0 {
		t.Fatalf("a limit change of a counting rule: %v, want nothing", g)
	}
	fixed := hour
	fixed.Algorithm = window.FixedWindow
	fresh := window.Rule{Name: "burst", Scope: window.ScopeRecipient, Algorithm: window.GCRA, Limit: 10, Window: time.Second}
	g := growth(from, dom(fixed, fresh))
	if len(g) != 2 || g[0].rule != "burst" || !strings.Contains(g[0].why, "a new gcra rule") ||
		g[1].rule != "hour" || !strings.Contains(g[1].why, "sliding-counter 1h0m0s/0 to fixed-window 1h0m0s/0") {
		t.Fatalf("growth = %+v", g)
	}
	tb := window.Rule{Name: "tb", Scope: window.ScopeRecipient, Algorithm: window.TokenBucket, Limit: 10, Window: time.Hour, Capacity: 100}
	lower := tb
	lower.Capacity = 10
	if g := growth(dom(tb), dom(lower)); len(g) != 1 || !strings.Contains(g[0].why, "capacity lowered from 100 to 10") {
		t.Fatalf("capacity lowered: %+v", g)
	}
	fw := window.Rule{Name: "fw", Scope: window.ScopeRecipient, Algorithm: window.FixedWindow, Limit: 1000, Window: time.Hour, Borrow: 300}
	less := fw
	less.Borrow = 100
	if g := growth(dom(fw), dom(less)); len(g) != 1 || !strings.Contains(g[0].why, "borrow lowered from 300 to 100: a stored debt above 100 is forgiven") {
		t.Fatalf("borrow lowered: %+v", g)
	}
	if g := growth(dom(less), dom(fw)); len(g) != 0 {
		t.Fatalf("borrow raised: %+v, want nothing", g)
	}
}
