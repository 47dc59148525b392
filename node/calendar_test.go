package node

import (
	"context"
	"slices"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// calendarRules caps a recipient per local day and per local hour in New
// York, for a test clock to cross the night its clocks go back.
const calendarRules = `domains:
  - name: local
    rules:
      - {name: per-local-day, algorithm: fixed-window, limit: 3, calendar: day, zone: America/New_York}
      - {name: per-local-hour, algorithm: fixed-window, limit: 2, calendar: hour, zone: America/New_York}
`

// TestCalendarRulesThroughNode follows calendar rules from a rules file
// through a node, its WAL and a crash, on 2026-11-01, when New York's
// clocks go back at 06:00 UTC: the local hour 01:00 happens twice, so it is
// one hour period of 2 hours (05:00–07:00 UTC), and the local day lasts 25
// hours (04:00 UTC to 05:00 UTC the next day). Retry-after reaches the end
// of those periods, not of an hour or a day counted in UTC or at a fixed
// offset.
func TestCalendarRulesThroughNode(t *testing.T) {
	rs, err := rules.Parse("calendar", []byte(calendarRules))
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	clk := &testClock{}
	cfg := Config{Rules: rs, Clock: clk, DataDir: t.TempDir(), SnapshotInterval: -1, SnapshotWALBytes: -1, SweepInterval: -1}
	recipient := testRecipients[0]
	// check sends (or, with peek, asks about) one message at now and
	// compares the answer: admitted, the rule that denied it (-1 for
	// none), the retry-after in ms and each rule's used count.
	check := func(n *Node, now string, mode pb.Mode, admitted bool, deniedBy int32, retryMs int64, used ...uint32) {
		t.Helper()
		clk.set(at(now))
		resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{recipient}, Domains: []string{"local"}, Modes: []pb.Mode{mode}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Errors) > 0 {
			t.Fatalf("%s: %v", now, resp.Errors)
		}
		if resp.Admitted[0] != admitted || resp.DeniedBy[0] != deniedBy || resp.RetryAfterMs[0] != retryMs || !slices.Equal(resp.Used, used) {
			t.Fatalf("%s %v: admitted %v denied by %d retry %v used %v; want %v, %d, %v, %v", now, mode,
				resp.Admitted[0], resp.DeniedBy[0], time.Duration(resp.RetryAfterMs[0])*time.Millisecond, resp.Used,
				admitted, deniedBy, time.Duration(retryMs)*time.Millisecond, used)
		}
	}
	const (
		send   = pb.Mode_MODE_CHECK_AND_RECORD
		peek   = pb.Mode_MODE_PEEK
		minute = int64(time.Minute / time.Millisecond)
	)
	a := openNode(t, cfg)
	check(a, "2026-11-01T05:10:00Z", send, true, -1, 0, 1, 1) // 01:10 EDT
	check(a, "2026-11-01T05:20:00Z", send, true, -1, 0, 2, 2)
	// 01:50 EDT: the hour is full until 02:00 EST, 70 minutes on.
	check(a, "2026-11-01T05:50:00Z", send, false, 1, 70*minute, 2, 2)
	// 01:30 EST, the repeated hour: the same period, still full.
	check(a, "2026-11-01T06:30:00Z", send, false, 1, 30*minute, 2, 2)
	check(a, "2026-11-01T07:00:00Z", send, true, -1, 0, 3, 1) // 02:00 EST: a new hour
	// The day is full until 00:00 EST on 2 November, 05:00 UTC.
	check(a, "2026-11-01T07:30:00Z", send, false, 0, 21*60*minute+30*minute, 3, 1)

	// A crash: the sends come back from the WAL, in the same periods.
	crash(t, a)
	b := openNode(t, cfg)
	defer b.Close()
	if rec := b.Recovery(); rec.Replayed == 0 {
		t.Fatalf("recovery %+v: want the sends replayed from the WAL", rec)
	}
	check(b, "2026-11-01T07:30:00Z", peek, false, 0, 21*60*minute+30*minute, 3, 1)
	check(b, "2026-11-02T04:59:59.999Z", send, false, 0, 1, 3, 0) // 23:59:59.999 EST, still 1 November
	check(b, "2026-11-02T05:00:00Z", send, true, -1, 0, 1, 1)     // 2 November
}
