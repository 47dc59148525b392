package window

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// refGrid is the step at which refCalendar reads the zone's clock. Every
// zone the tests use changes its offset, and starts its hours, only at
// instants on this grid (offsets are whole quarter hours).
const refGrid = 15 * 60 * 1000

// refCalendar numbers the periods of a calendar rule by brute force,
// independently of calendarClock: it reads the local date and time that
// time.Time.In gives at every refGrid instant and starts a period wherever
// the calendar's fields (date, and hour; ISO year and week; year and
// month) differ from those a grid step before.
type refCalendar struct {
	cal    Calendar
	loc    *time.Location
	lo, hi int64   // the grid instants [lo, hi) scanned so far
	starts []int64 // the period starts in [lo, hi), ascending
	base   int64   // the number of starts[0]
}

// refCalendars shares the periods found between the keys and runs of a
// test, by calendar and zone.
var refCalendars = map[string]*refCalendar{}

func newRefCalendar(r Rule) *refCalendar {
	loc, err := time.LoadLocation(r.Zone)
	if err != nil {
		panic(err)
	}
	// Numbers stay positive, as refKey.borrowAt needs, however far back
	// the scan goes.
	return &refCalendar{cal: r.Calendar, loc: loc, lo: -1, hi: -1, base: 1 << 40}
}

// fields returns the calendar's fields of the local time at t.
func (c *refCalendar) fields(t int64) [4]int {
	tm := time.UnixMilli(t).In(c.loc)
	switch c.cal {
	case CalendarHour:
		y, m, d := tm.Date()
		return [4]int{y, int(m), d, tm.Hour()}
	case CalendarDay:
		y, m, d := tm.Date()
		return [4]int{y, int(m), d}
	case CalendarWeek:
		y, w := tm.ISOWeek()
		return [4]int{y, w}
	}
	y, m, _ := tm.Date()
	return [4]int{y, int(m)}
}

func (c *refCalendar) isStart(g int64) bool { return c.fields(g) != c.fields(g-refGrid) }

// cover scans the grid until [lo, hi) holds a period start at or before t
// and one after it.
func (c *refCalendar) cover(t int64) {
	if c.lo < 0 {
		c.lo = t / refGrid * refGrid
		c.hi = c.lo
	}
	for len(c.starts) == 0 || c.starts[0] > t {
		c.lo -= refGrid
		if c.isStart(c.lo) {
			c.starts = slices.Insert(c.starts, 0, c.lo)
			c.base--
		}
	}
	for c.starts[len(c.starts)-1] <= t {
		if c.isStart(c.hi) {
			c.starts = append(c.starts, c.hi)
		}
		c.hi += refGrid
	}
}

// index returns the number of the period holding t.
func (c *refCalendar) index(t int64) int64 {
	c.cover(t)
	i, found := slices.BinarySearch(c.starts, t)
	if !found {
		i--
	}
	return c.base + int64(i)
}

// start returns the first instant of period K.
func (c *refCalendar) start(K int64) int64 {
	for K < c.base {
		c.cover(c.starts[0] - 1)
	}
	for K-c.base >= int64(len(c.starts)) {
		c.cover(c.starts[len(c.starts)-1])
	}
	return c.starts[K-c.base]
}

// calendarMoments are instants near which a zone's periods are odd: clocks
// set forward or back, by an hour or half of one, across midnight, a whole
// day skipped, a leap day, a year's end.
var calendarMoments = []struct {
	zone string
	at   string
}{
	{"America/New_York", "2026-03-08T07:00:00Z"},
	{"America/New_York", "2026-11-01T06:00:00Z"},
	{"Europe/London", "2026-03-29T01:00:00Z"},
	{"Europe/London", "2026-10-25T01:00:00Z"},
	{"Australia/Lord_Howe", "2026-04-04T15:00:00Z"},
	{"Australia/Lord_Howe", "2026-10-03T15:30:00Z"},
	{"America/Sao_Paulo", "2018-11-04T03:00:00Z"},
	{"America/Sao_Paulo", "2019-02-17T02:00:00Z"},
	{"Pacific/Chatham", "2026-04-04T14:00:00Z"},
	{"Pacific/Apia", "2011-12-30T10:00:00Z"},
	{"Asia/Kathmandu", "2026-09-21T00:00:00Z"},
	{"Asia/Shanghai", "2028-02-29T16:00:00Z"},
	{"UTC", "2027-12-31T00:00:00Z"},
	{"America/New_York", "2040-12-31T05:00:00Z"},
}

// randomCalendarDomain returns a calendar rule in zone, borrowing at most
// 60 times its limit (so a debt clears within the 64 periods the engine
// steps exactly), alone or beside a second calendar rule. (Other
// algorithms beside a fixed window are TestCountersMatchReference's.)
func randomCalendarDomain(rng *rand.Rand, zone string) *Domain {
	L := 1 + rng.IntN(5)
	r := Rule{Name: "cal", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: L,
		Calendar: CalendarHour + Calendar(rng.IntN(4)), Zone: zone}
	switch rng.IntN(3) {
	case 0:
		r.Borrow = rng.IntN(3*L + 1)
	case 1:
		r.Borrow = rng.IntN(60*L + 1)
	}
	rules := []Rule{r}
	if rng.IntN(2) == 0 {
		rules = append(rules, Rule{Name: "cal2", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 1 + rng.IntN(8),
			Borrow: rng.IntN(8), Calendar: CalendarHour + Calendar(rng.IntN(4)), Zone: zone})
	}
	d, err := NewDomain("calendar", rules)
	if err != nil {
		panic(err)
	}
	return d
}

// TestCalendarMatchesReference replays random sequences against calendar
// rules starting near each odd moment of calendarMoments, and compares
// every decision with refKey's, which numbers the periods by brute force.
func TestCalendarMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 5))
	runs := 10
	if raceEnabled {
		runs = 3
	}
	for _, m := range calendarMoments {
		at, err := time.Parse(time.RFC3339, m.at)
		if err != nil {
			t.Fatal(err)
		}
		for i := range runs {
			d := randomCalendarDomain(rng, m.zone)
			nominal := int(d.rules[0].Nominal() / time.Millisecond)
			start := at.UnixMilli() - int64(rng.IntN(2*nominal))
			t.Run(fmt.Sprintf("%s/%s/%d", m.zone, m.at, i), func(t *testing.T) {
				runCounterReferenceFrom(t, rng, d, start, 300, 2, 1+nominal*rng.IntN(3)/d.rules[0].Limit)
			})
		}
	}
}

// TestCalendarLongDebt runs rules that borrow up to 300 times their limit,
// so a debt can take hundreds of periods to repay, and quiet spells of up
// to 200 periods.
// They must match the reference exactly; should a gap ever take the
// engine past its 64 steps, where it counts each period at its longest,
// the checks before that say how it may differ: never admitting what the
// reference denies, nor retrying earlier. Both record what the engine
// admits.
func TestCalendarLongDebt(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 6))
	runs := 40
	if raceEnabled {
		runs = 10
	}
	for i := range runs {
		m := calendarMoments[i%len(calendarMoments)]
		at, err := time.Parse(time.RFC3339, m.at)
		if err != nil {
			t.Fatal(err)
		}
		L := 1 + rng.IntN(3)
		r := Rule{Name: "cal", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: L, Borrow: 60*L + rng.IntN(240*L),
			Calendar: CalendarHour + Calendar(i%4), Zone: m.zone}
		d, err := NewDomain("long", []Rule{r})
		if err != nil {
			t.Fatal(err)
		}
		nominal := int64(r.Nominal() / time.Millisecond)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			var ref refKey
			var rec []byte
			var s Scratch
			now := at.UnixMilli() - rng.Int64N(100*nominal)
			for op := range 400 {
				// Record-only bursts build debt; quiet spells of up to 200
				// periods repay part of it; costs up to limit+borrow wait
				// for most of it to be repaid.
				switch x := rng.IntN(40); {
				case x == 0:
					now += rng.Int64N(200 * nominal)
				default:
					now += rng.Int64N(nominal / 4)
				}
				it := Item{Cost: 1 + rng.IntN(L)}
				switch x := rng.IntN(5); {
				case x == 0:
					it = Item{Cost: 1 + rng.IntN(40*L), Mode: RecordOnly}
				case x == 1:
					it.Cost = 1 + rng.IntN(L+r.Borrow)
				}
				var got Decision
				out, err := d.Apply(&s, rec, 1, now, it, &got)
				if err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
				if out != nil {
					rec = append(rec[:0], out...)
				}
				if it.Mode == RecordOnly {
					ref.decide(d, now, it)
					continue
				}
				want, _ := ref.decide(d, now, Item{Cost: it.Cost, Mode: Peek})
				at := time.UnixMilli(now).UTC().Format(time.RFC3339)
				switch {
				case got.Admitted && !want.Admitted:
					t.Fatalf("op %d at %s: the engine admits cost %d, the reference denies: %+v", op, at, it.Cost, want.Rules[0])
				case !got.Admitted && !want.Admitted && got.RetryAfter < want.RetryAfter:
					t.Fatalf("op %d at %s: retry-after %d ms, the reference's is %d", op, at, got.RetryAfter, want.RetryAfter)
				case got.Rules[0].Used < want.Rules[0].Used:
					t.Fatalf("op %d at %s: used %d, the reference's is %d", op, at, got.Rules[0].Used, want.Rules[0].Used)
				}
				if got.Admitted != want.Admitted || got.RetryAfter != want.RetryAfter || !got.Admitted && got.Rules[0] != want.Rules[0] {
					t.Fatalf("op %d at %s: cost %d\n got %+v\nwant %+v", op, at, it.Cost, got.Rules[0], want.Rules[0])
				}
				if got.Admitted {
					ref.decide(d, now, Item{Cost: it.Cost, Mode: RecordOnly})
				}
			}
		})
	}
}

// calendarZones are the distinct zones of calendarMoments, in order.
func calendarZones() []string {
	var zones []string
	for _, m := range calendarMoments {
		if !slices.Contains(zones, m.zone) {
			zones = append(zones, m.zone)
		}
	}
	return zones
}

// FuzzCalendar drives a domain of calendar hours, days, ISO weeks and
// months (three of them borrowing) from fuzz bytes against the reference.
// The first byte picks a moment of calendarMoments, which the clock starts
// two hours before; then each 3 bytes are an op: a clock step (a signed
// byte times a second, a minute, 10 minutes or an hour, so the clock also
// jumps back across a DST change), a cost of 1 to 6 and a mode.
func FuzzCalendar(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 60, 1, 0x40, 60, 2, 0x41, 1, 5, 0xc0, 255, 1, 0xc2, 3, 0, 0xc0})
	f.Add([]byte{1, 10, 3, 0xc0, 1, 3, 0xc0, 1, 3, 0xc1, 246, 0, 0x80, 50, 5, 0xc0, 50, 5, 0xc0, 127, 1, 0xc0})
	f.Add([]byte{9, 5, 2, 0xc0, 10, 2, 0xc0, 10, 2, 0xc0, 10, 2, 0xc0, 20, 4, 0xc2})                 // Apia's skipped day
	f.Add([]byte{6, 100, 5, 0x80, 30, 5, 0x80, 30, 5, 0x80, 30, 5, 0x80, 30, 5, 0xc0, 200, 5, 0xc0}) // São Paulo's missing midnight
	f.Add([]byte("calendar days that last 23 or 25 hours, and weeks and months that follow them"))
	domains := map[string]*Domain{}
	for _, zone := range calendarZones() {
		d, err := NewDomain("fuzz-calendar", []Rule{
			{Name: "hour", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 3, Borrow: 4, Calendar: CalendarHour, Zone: zone},
			{Name: "day", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 8, Borrow: 10, Calendar: CalendarDay, Zone: zone},
			{Name: "week", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 30, Calendar: CalendarWeek, Zone: zone},
			{Name: "month", Scope: ScopeRecipient, Algorithm: FixedWindow, Limit: 60, Borrow: 20, Calendar: CalendarMonth, Zone: zone},
		})
		if err != nil {
			f.Fatal(err)
		}
		domains[zone] = d
	}
	units := [4]int64{1000, 60 * 1000, 10 * 60 * 1000, 60 * 60 * 1000}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 {
			return
		}
		if len(ops) > 1+3*300 {
			ops = ops[:1+3*300] // the reference is quadratic
		}
		m := calendarMoments[int(ops[0])%len(calendarMoments)]
		at, err := time.Parse(time.RFC3339, m.at)
		if err != nil {
			t.Fatal(err)
		}
		d := domains[m.zone]
		var (
			s   Scratch
			rec []byte
			ref refKey
			now = at.UnixMilli() - 2*units[3]
		)
		for i := 1; i+3 <= len(ops); i += 3 {
			op := ops[i : i+3]
			now = max(0, now+int64(int8(op[0]))*units[op[2]>>6])
			it := Item{Cost: 1 + int(op[1]%6), Mode: Mode(op[2] % 3)}
			stepReference(t, d, &s, &rec, 0, &ref, now, it, func() string {
				return fmt.Sprintf("%s, op %d at %s", m.zone, i/3, time.UnixMilli(now).UTC().Format(time.RFC3339))
			})
		}
	})
}
