package node

import (
	"testing"
	"time"

	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/ring/gossip"
)

// TestHasMajority: rule 5's verdict, table-tested as etcd raft tests its
// quorum package: more than half decides; exactly half decides only with
// the first counted name; a ring alone in an empty count decides.
func TestHasMajority(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		ringLen, seen         int
		holdsFirst            bool
		wantMajority, wantTie bool
	}{
		{"alone, nobody counted", 1, 0, false, true, false},
		{"alone, counted", 1, 1, true, true, false},
		{"3 of 3", 3, 3, true, true, false},
		{"2 of 3", 2, 3, false, true, false},
		{"1 of 3", 1, 3, true, false, false},
		{"2 of 4 with the first", 2, 4, true, true, true},
		{"2 of 4 without the first", 2, 4, false, false, true},
		{"1 of 2 with the first", 1, 2, true, true, true},
		{"1 of 2 without the first", 1, 2, false, false, true},
		{"3 of 5", 3, 5, false, true, false},
		{"2 of 5", 2, 5, true, false, false},
		{"0 of 1", 0, 1, false, false, false},
		{"empty ring, nobody counted", 0, 0, false, false, true},
	} {
		m, tie := hasMajority(tc.ringLen, tc.seen, tc.holdsFirst)
		if m != tc.wantMajority || tie != tc.wantTie {
			t.Errorf("%s: hasMajority(%d, %d, %v) = %v, %v; want %v, %v", tc.name, tc.ringLen, tc.seen, tc.holdsFirst, m, tie, tc.wantMajority, tc.wantTie)
		}
	}
}

// TestElectorate: who rule 5 counts. Serving members and ring members count
// as of now; a member that announced leaving no longer counts, present or
// departed; a joining member counts only if it was counted before
// (restarting); what gossip saw depart counts as of its departure unless
// seen later; forget drops those gone for longer than ForgetDeadAfter; and
// first is the name a tie goes to.
func TestElectorate(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0.Add(10 * time.Minute)
	e := electorate{"restarting": t0, "left": t0, "stale": t0, "departed-later": now}
	members := []gossip.MemberState{
		{Name: "serving", State: gossip.StateServing},
		{Name: "leaving", State: gossip.StateLeaving},
		{Name: "left", State: gossip.StateLeaving},
		{Name: "restarting", State: gossip.StateJoining},
		{Name: "new-joining", State: gossip.StateJoining},
	}
	departed := map[string]gossip.Departure{
		"crashed":        {At: now.Add(-time.Second)},
		"gone-leaving":   {At: now.Add(-time.Second), Leaving: true},
		"departed-later": {At: t0},
	}
	e.note(members, departed, []ring.Member{{Name: "in-ring"}}, now)
	want := map[string]time.Time{
		"serving": now, "restarting": now, "in-ring": now, "crashed": now.Add(-time.Second),
		"departed-later": now, "stale": t0,
	}
	if len(e) != len(want) {
		t.Fatalf("counted %v, want %v", e, want)
	}
	for name, at := range want {
		if got, ok := e[name]; !ok || !got.Equal(at) {
			t.Errorf("%s counted as of %v (%v), want %v", name, got, ok, at)
		}
	}
	if f := e.first(); f != "crashed" {
		t.Errorf("first %q, want crashed", f)
	}
	e.forget(now, time.Minute)
	if _, ok := e["stale"]; ok || len(e) != len(want)-1 {
		t.Errorf("after forgetting those gone for a minute: %v", e)
	}
	if f := (electorate{}).first(); f != "" {
		t.Errorf("first of nobody: %q", f)
	}
}
