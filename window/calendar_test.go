package window

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCalendarPeriods checks period bounds against times worked out by hand
// from each zone's published rules (not from the time package): the DST
// days of New York and London, a 30-minute shift (Lord Howe), a zone whose
// midnight is skipped (São Paulo, 2018), zones without DST, the repeated
// and the skipped hour, an ISO week across a year boundary and a leap
// February. at is any instant of the period; start and end are UTC.
func TestCalendarPeriods(t *testing.T) {
	cases := []struct {
		name       string
		cal        Calendar
		zone       string
		at         string // RFC 3339
		start, end string // RFC 3339, UTC
	}{
		// New York: EST (-5) to EDT (-4) at 02:00 on 2026-03-08, back at 02:00 EDT on 2026-11-01.
		{"NY spring day is 23h", CalendarDay, "America/New_York", "2026-03-08T12:00:00-04:00", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"NY spring day, before the change", CalendarDay, "America/New_York", "2026-03-08T01:59:59.999-05:00", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"NY day before spring", CalendarDay, "America/New_York", "2026-03-07T23:59:59.999-05:00", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		{"NY fall day is 25h", CalendarDay, "America/New_York", "2026-11-01T01:30:00-05:00", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"NY fall day, first 01:30", CalendarDay, "America/New_York", "2026-11-01T01:30:00-04:00", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"NY repeated hour is one 2h period (EDT half)", CalendarHour, "America/New_York", "2026-11-01T01:10:00-04:00", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z"},
		{"NY repeated hour is one 2h period (EST half)", CalendarHour, "America/New_York", "2026-11-01T01:50:00-05:00", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z"},
		{"NY hour after the repeated one", CalendarHour, "America/New_York", "2026-11-01T02:00:00-05:00", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"},
		{"NY hour before the skipped one", CalendarHour, "America/New_York", "2026-03-08T01:59:59.999-05:00", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z"},
		{"NY hour after the skipped one", CalendarHour, "America/New_York", "2026-03-08T03:00:00-04:00", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"},
		{"NY week of the spring change is 167h", CalendarWeek, "America/New_York", "2026-03-08T12:00:00-04:00", "2026-03-02T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"NY March", CalendarMonth, "America/New_York", "2026-03-15T00:00:00-04:00", "2026-03-01T05:00:00Z", "2026-04-01T04:00:00Z"},
		{"NY ISO week across the year", CalendarWeek, "America/New_York", "2027-01-01T00:00:00-05:00", "2026-12-28T05:00:00Z", "2027-01-04T05:00:00Z"},
		// London: GMT to BST at 01:00 GMT on 2026-03-29, back at 01:00 GMT on 2026-10-25.
		{"London spring day", CalendarDay, "Europe/London", "2026-03-29T10:00:00+01:00", "2026-03-29T00:00:00Z", "2026-03-29T23:00:00Z"},
		{"London fall day", CalendarDay, "Europe/London", "2026-10-25T10:00:00Z", "2026-10-24T23:00:00Z", "2026-10-26T00:00:00Z"},
		{"London repeated hour", CalendarHour, "Europe/London", "2026-10-25T01:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"},
		// Lord Howe: +10:30, +11 in summer; the clock moves 30 minutes at
		// 02:00, back on 2026-04-05 and forward on 2026-10-04.
		{"Lord Howe autumn day is 24.5h", CalendarDay, "Australia/Lord_Howe", "2026-04-05T12:00:00+10:30", "2026-04-04T13:00:00Z", "2026-04-05T13:30:00Z"},
		{"Lord Howe repeated half hour: hour 1 lasts 1.5h", CalendarHour, "Australia/Lord_Howe", "2026-04-05T01:45:00+10:30", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z"},
		{"Lord Howe spring day is 23.5h", CalendarDay, "Australia/Lord_Howe", "2026-10-04T12:00:00+11:00", "2026-10-03T13:30:00Z", "2026-10-04T13:00:00Z"},
		{"Lord Howe half-skipped hour 2 lasts 30m", CalendarHour, "Australia/Lord_Howe", "2026-10-04T02:45:00+11:00", "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z"},
		// São Paulo, 2018-11-04: -3 to -2 at 00:00, so the day starts at 01:00.
		{"São Paulo day whose midnight is skipped", CalendarDay, "America/Sao_Paulo", "2018-11-04T12:00:00-02:00", "2018-11-04T03:00:00Z", "2018-11-05T02:00:00Z"},
		{"São Paulo day before it", CalendarDay, "America/Sao_Paulo", "2018-11-03T23:59:59.999-03:00", "2018-11-03T03:00:00Z", "2018-11-04T03:00:00Z"},
		// No DST: +5:30, +5:45, +8, UTC.
		{"Kolkata day", CalendarDay, "Asia/Kolkata", "2026-06-15T00:00:00+05:30", "2026-06-14T18:30:00Z", "2026-06-15T18:30:00Z"},
		{"Kolkata hour starts at :30 UTC", CalendarHour, "Asia/Kolkata", "2026-06-15T15:30:00+05:30", "2026-06-15T09:30:00Z", "2026-06-15T10:30:00Z"},
		{"Kathmandu hour starts at :15 UTC", CalendarHour, "Asia/Kathmandu", "2026-06-15T15:00:00+05:45", "2026-06-15T09:15:00Z", "2026-06-15T10:15:00Z"},
		{"Shanghai day", CalendarDay, "Asia/Shanghai", "2026-11-24T23:59:59.999+08:00", "2026-11-23T16:00:00Z", "2026-11-24T16:00:00Z"},
		{"Shanghai month", CalendarMonth, "Asia/Shanghai", "2026-11-01T00:00:00+08:00", "2026-10-31T16:00:00Z", "2026-11-30T16:00:00Z"},
		{"Shanghai February", CalendarMonth, "Asia/Shanghai", "2027-02-28T23:00:00+08:00", "2027-01-31T16:00:00Z", "2027-02-28T16:00:00Z"},
		{"UTC leap February", CalendarMonth, "", "2028-02-29T12:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"UTC December", CalendarMonth, "UTC", "2026-12-31T23:59:59.999Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"UTC ISO week of 2027-01-03 (a Sunday)", CalendarWeek, "", "2027-01-03T23:59:59.999Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		{"UTC ISO week from Monday", CalendarWeek, "", "2027-01-04T00:00:00Z", "2027-01-04T00:00:00Z", "2027-01-11T00:00:00Z"},
		// Past the tz data's last listed transition, on the last day of a
		// leap year, Go's ZoneBounds returns an end before the instant.
		{"NY last day of 2040", CalendarDay, "America/New_York", "2040-12-31T12:00:00-05:00", "2040-12-31T05:00:00Z", "2041-01-01T05:00:00Z"},
		{"NY last hour of 2040", CalendarHour, "America/New_York", "2040-12-31T19:30:00-05:00", "2041-01-01T00:00:00Z", "2041-01-01T01:00:00Z"},
		{"NY 2044 spring day is 23h", CalendarDay, "America/New_York", "2044-03-13T12:00:00-04:00", "2044-03-13T05:00:00Z", "2044-03-14T04:00:00Z"},
		{"UTC hour", CalendarHour, "", "2026-11-24T10:59:59.999Z", "2026-11-24T10:00:00Z", "2026-11-24T11:00:00Z"},
	}
	ms := func(s string) int64 {
		t.Helper()
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDomain("cal", []Rule{{Name: "c", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 1, Calendar: tc.cal, Zone: tc.zone}})
			if err != nil {
				t.Fatal(err)
			}
			c := &d.counters[0]
			at, start, end := ms(tc.at), ms(tc.start), ms(tc.end)
			fmtT := func(v int64) string { return time.UnixMilli(v).UTC().Format(time.RFC3339Nano) }
			if got := c.windowStart(at); got != start {
				t.Errorf("windowStart(%s) = %s, want %s", tc.at, fmtT(got), tc.start)
			}
			if got := c.windowEnd(start); got != end {
				t.Errorf("windowEnd(%s) = %s, want %s", tc.start, fmtT(got), tc.end)
			}
			// Every instant of the period maps to its start; the instants
			// around it to the neighbours.
			for _, v := range []int64{start, start + 1, at, end - 1} {
				if got := c.windowStart(v); got != start {
					t.Errorf("windowStart(%s) = %s, want %s", fmtT(v), fmtT(got), tc.start)
				}
			}
			if got := c.windowStart(end); got != end {
				t.Errorf("windowStart(end %s) = %s, want itself", tc.end, fmtT(got))
			}
			if got := c.windowEnd(start - 1); got != start {
				t.Errorf("windowEnd(start-1ms) = %s, want %s", fmtT(got), tc.start)
			}
			if got := c.windowsBetween(start, end); got != 1 {
				t.Errorf("windowsBetween(start, end) = %d, want 1", got)
			}
			if got := c.windowAfter(start, 1); got != end {
				t.Errorf("windowAfter(start, 1) = %s, want %s", fmtT(got), tc.end)
			}
			if end-start > c.win {
				t.Errorf("period lasts %v, more than the span %v", time.Duration(end-start)*time.Millisecond, time.Duration(c.win)*time.Millisecond)
			}
		})
	}
}

// TestCalendarDSTDayBorrow shows a day rule on New York's 23- and 25-hour
// days: 3 per local day, the retry-after of a denied send reaching the next
// local midnight exactly, and a debt repaid by the next day.
func TestCalendarDSTDayBorrow(t *testing.T) {
	ms := func(s string) int64 {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	d, err := NewDomain("daily", []Rule{{Name: "day", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Borrow: 2, Calendar: CalendarDay, Zone: "America/New_York"}})
	if err != nil {
		t.Fatal(err)
	}
	var s Scratch
	var rec []byte
	step := func(at string, cost int, admit bool, retry time.Duration) {
		t.Helper()
		var dec Decision
		out, err := d.Apply(&s, rec, 1, ms(at), Item{Cost: cost}, &dec)
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		if dec.Admitted != admit || time.Duration(dec.RetryAfter)*time.Millisecond != retry {
			t.Fatalf("%s cost %d: admitted %v retry %v, want %v %v (%+v)", at, cost, dec.Admitted, time.Duration(dec.RetryAfter)*time.Millisecond, admit, retry, dec.Rules[0])
		}
		if out != nil {
			rec = append(rec[:0], out...)
		}
	}
	// 2026-03-08, 23 hours: the day's limit and borrow (5), then a denial
	// until the next local midnight, 04:00Z.
	step("2026-03-08T00:30:00-05:00", 5, true, 0)
	step("2026-03-08T23:00:00-04:00", 1, false, time.Hour)
	// 2026-03-09 starts owing the 2 borrowed: room for 3, not 4, and a
	// cost of 4 waits a whole (24-hour) day.
	step("2026-03-09T00:00:00-04:00", 4, false, 24*time.Hour)
	step("2026-03-09T00:00:00-04:00", 3, true, 0)
	// 2026-11-01, 25 hours, from 04:00Z to 05:00Z the next day.
	step("2026-11-01T00:00:00-04:00", 5, true, 0)
	step("2026-11-01T23:30:00-05:00", 1, false, 30*time.Minute)
	step("2026-11-02T00:00:00-05:00", 1, true, 0)
}

func TestCalendarRuleValidation(t *testing.T) {
	base := Rule{Name: "c", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Calendar: CalendarDay, Zone: "Asia/Shanghai"}
	for _, tc := range []struct {
		change      func(*Rule)
		field, want string
	}{
		{func(r *Rule) { r.Window = 24 * time.Hour }, "window", "a calendar rule's window is its calendar period"},
		{func(r *Rule) { r.Algorithm = SlidingCounter }, "calendar", "only fixed-window rules have calendar windows (algorithm sliding-counter)"},
		{func(r *Rule) { r.Algorithm = SlidingLog }, "calendar", "only fixed-window rules"},
		{func(r *Rule) { r.Zone = "Mars/Olympus_Mons" }, "zone", `"Mars/Olympus_Mons" is not a time zone`},
		{func(r *Rule) { r.Zone = "Local" }, "zone", "each node's own zone"},
		{func(r *Rule) { r.Calendar = 9 }, "calendar", "Calendar(9) is not one of hour, day, week, month"},
		{func(r *Rule) { r.Calendar, r.Window = CalendarNone, time.Hour }, "zone", `"Asia/Shanghai" is set, but only calendar rules have a zone`},
		{func(r *Rule) { r.Limit = 0 }, "limit", "0 out of range"},
		{func(r *Rule) { r.Borrow = -1 }, "borrow", "-1 out of range"},
	} {
		r := base
		tc.change(&r)
		err := r.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate = %v, want field %s and %q", r, err, tc.field, tc.want)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, z := range []string{"", "UTC", "Antarctica/Casey", "Pacific/Apia", "Australia/Lord_Howe"} {
		if _, err := LoadZone(z); err != nil {
			t.Errorf("LoadZone(%q): %v", z, err)
		}
	}
}

// TestCalendarCounterID: the calendar and zone are part of a state's
// identity, so a reload that moves a rule to another zone or period starts
// it afresh; a rule without a calendar keeps the id it had before.
func TestCalendarCounterID(t *testing.T) {
	r := Rule{Name: "c", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Calendar: CalendarDay, Zone: "Asia/Shanghai"}
	other := r
	other.Zone = "Asia/Tokyo"
	week := r
	week.Calendar = CalendarWeek
	plain := Rule{Name: "c", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Window: r.Calendar.Nominal()}
	ids := map[uint32]string{}
	for name, x := range map[string]Rule{"day": r, "tokyo": other, "week": week, "plain": plain} {
		if prev, ok := ids[counterID(x)]; ok {
			t.Errorf("%s and %s share counter id %08x", name, prev, counterID(x))
		}
		ids[counterID(x)] = name
	}
}
