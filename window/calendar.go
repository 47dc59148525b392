package window

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	_ "time/tzdata" // zones resolve the same on every node, with or without /usr/share/zoneinfo
)

// Calendar names the calendar period that a fixed-window rule's windows
// follow in its Zone, in place of windows of a fixed length aligned to the
// unix epoch (Braze's and Iterable's "per day in the user's time zone").
//
// A period is a maximal run of instants that read the same in Zone when cut
// to the calendar's unit: the same year, month and day (CalendarDay), also
// the same hour (CalendarHour), the same ISO week (CalendarWeek, from Monday
// 00:00) or the same year and month (CalendarMonth). So a period starts
// wherever the zone's clock reads a new unit, and lasts as long as the
// clock takes to read the next: New York's day of 2026-03-08 lasts 23 hours
// and that of 2026-11-01 25; the repeated hour 01:00 of a fall-back night
// is one hour period of 2 hours; a day whose midnight is skipped (São Paulo
// 2018-11-04) starts at 01:00; a skipped hour has no period. Periods follow
// the tz database embedded in the binary, so every node cuts them alike.
type Calendar uint8

const (
	CalendarNone  Calendar = iota // windows of Rule.Window aligned to the unix epoch
	CalendarHour                  // clock hours in Zone
	CalendarDay                   // calendar days in Zone
	CalendarWeek                  // ISO weeks (Monday to Sunday) in Zone
	CalendarMonth                 // calendar months in Zone
)

var calendarNames = [...]string{"", "hour", "day", "week", "month"}

// String returns the calendar's name as written in a rules file ("" for
// CalendarNone).
func (k Calendar) String() string {
	if int(k) < len(calendarNames) {
		return calendarNames[k]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(k))
}

// ParseCalendar parses "hour", "day", "week" or "month"; "" is CalendarNone.
func ParseCalendar(s string) (Calendar, error) {
	for i, n := range calendarNames {
		if s == n {
			return Calendar(i), nil
		}
	}
	return 0, fmt.Errorf("window: calendar %q is not one of hour, day, week, month", s)
}

const (
	msPerHour = int64(time.Hour / time.Millisecond)
	msPerDay  = 24 * msPerHour
	// maxZoneShift bounds how far a zone's clocks may be set back within
	// any 32 days (summed), which bounds how much longer than its nominal
	// length a period can last. The tz database's largest since 1970 is
	// 3 hours (Antarctica/Casey); zones beyond it are refused.
	maxZoneShift = 4 * msPerHour
	// calendarSteps is how many steps calendarClock.between and after
	// take before they count every remaining period at its longest.
	calendarSteps = 64
)

// Nominal returns the length of the calendar's unit on a clock that is
// never set: 1h, 24h, 168h, and for a month its longest, 31 days.
func (k Calendar) Nominal() time.Duration {
	switch k {
	case CalendarHour:
		return time.Hour
	case CalendarDay:
		return 24 * time.Hour
	case CalendarWeek:
		return 7 * 24 * time.Hour
	case CalendarMonth:
		return 31 * 24 * time.Hour
	}
	return 0
}

// span returns the longest a period can last, ms: its nominal length plus
// the most a zone may set its clocks back within it.
func (k Calendar) span() int64 { return int64(k.Nominal()/time.Millisecond) + maxZoneShift }

// trunc returns the start of the unit holding the wall time w (ms since
// 1970-01-01 00:00 on the zone's clock).
func (k Calendar) trunc(w int64) int64 {
	switch k {
	case CalendarHour:
		return floorDiv(w, msPerHour) * msPerHour
	case CalendarDay:
		return floorDiv(w, msPerDay) * msPerDay
	case CalendarWeek:
		d := floorDiv(w, msPerDay)
		return (d - (d+3)%7) * msPerDay // 1970-01-01 was a Thursday: day d is weekday (d+3)%7 counting from Monday
	}
	tm := time.UnixMilli(w).UTC()
	return time.Date(tm.Year(), tm.Month(), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
}

// units returns how many units start after the unit starting at the wall
// time ws and at or before the wall time w.
func (k Calendar) units(ws, w int64) int64 {
	if k == CalendarMonth {
		month := func(w int64) int64 {
			tm := time.UnixMilli(w).UTC()
			return int64(tm.Year())*12 + int64(tm.Month())
		}
		return month(w) - month(ws)
	}
	return floorDiv(w-ws, int64(k.Nominal()/time.Millisecond))
}

// add returns the start of the n-th unit after the unit starting at the
// wall time ws.
func (k Calendar) add(ws, n int64) int64 {
	if k == CalendarMonth {
		tm := time.UnixMilli(ws).UTC()
		return time.Date(tm.Year(), tm.Month()+time.Month(n), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	}
	return ws + n*int64(k.Nominal()/time.Millisecond)
}

// floorDiv returns a/b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// calendarClock cuts unix ms into the periods of a calendar in a zone. It
// is safe for concurrent use.
type calendarClock struct {
	cal Calendar
	loc *time.Location
	// recent is the period last asked for: nearly every check falls in
	// the current period, which then costs two comparisons.
	recent atomic.Pointer[period]
}

// period is a calendar period, unix ms [start, end).
type period struct{ start, end int64 }

// periodOf returns the period holding t.
func (k *calendarClock) periodOf(t int64) period {
	if p := k.recent.Load(); p != nil && p.start <= t && t < p.end {
		return *p
	}
	s := k.start(t)
	p := period{s, k.end(s)}
	k.recent.Store(&p)
	return p
}

// zoneAt returns the zone's offset at t, ms, and the bounds of the span of
// instants around t that share it, [start, end) (math.MinInt64 and
// math.MaxInt64 when unbounded).
func (k *calendarClock) zoneAt(t int64) (off, start, end int64) {
	tm := time.UnixMilli(t).In(k.loc)
	_, o := tm.Zone()
	s, e := tm.ZoneBounds()
	start, end = math.MinInt64, math.MaxInt64
	if !s.IsZero() {
		start = s.UnixMilli()
	}
	if !e.IsZero() {
		end = e.UnixMilli()
	}
	if start > t {
		start = t
	}
	if end <= t {
		// Past a zone's last listed transition Go derives the bounds
		// from its rule string and, on the last day of a leap year,
		// returns an end at or before t. Find the end by probing: no
		// zone changes its offset twice within an hour.
		end = t + msPerHour
		if k.offset(end) != int64(o)*1000 {
			lo := t // offset as at t
			for lo+1 < end {
				mid := lo + (end-lo)/2
				if k.offset(mid) == int64(o)*1000 {
					lo = mid
				} else {
					end = mid
				}
			}
		}
	}
	return int64(o) * 1000, start, end
}

// offset returns the zone's offset at t, ms.
func (k *calendarClock) offset(t int64) int64 {
	_, o := time.UnixMilli(t).In(k.loc).Zone()
	return int64(o) * 1000
}

// unit returns the wall start of the unit the zone's clock reads at t: two
// instants are in one period iff every instant between them has the same.
func (k *calendarClock) unit(t int64) int64 {
	off, _, _ := k.zoneAt(t)
	return k.cal.trunc(t + off)
}

// start returns the first instant of the period holding t.
func (k *calendarClock) start(t int64) int64 {
	for {
		off, zs, _ := k.zoneAt(t)
		w := t + off
		ws := k.cal.trunc(w)
		s0 := t - (w - ws) // where the unit began if the offset held since
		if zs < s0 {
			return s0 // it did: the instant before s0 reads the unit before
		}
		// The offset changed at zs, inside the unit: the period began
		// there, unless the instant before still reads the same unit.
		if k.unit(zs-1) != ws {
			return zs
		}
		t = zs - 1
	}
}

// end returns the first instant after t that reads another unit: the end
// (exclusive) of t's period and the start of the next.
func (k *calendarClock) end(t int64) int64 {
	for {
		off, _, ze := k.zoneAt(t)
		w := t + off
		ws := k.cal.trunc(w)
		e0 := t + (k.cal.add(ws, 1) - w) // where the unit ends if the offset holds
		if ze > e0 {
			return e0
		}
		if k.unit(ze) != ws {
			return ze
		}
		t = ze
	}
}

// between returns the number of periods from the one starting at a to the
// one starting at b (period starts, a <= b): counted by arithmetic across
// each span of constant offset, and stepped across each offset change.
// After calendarSteps steps (some 30 years of twice-yearly changes) it
// counts each remaining period as lasting span ms, its longest, and so
// returns at most the true number.
func (k *calendarClock) between(a, b, span int64) int64 {
	var n int64
	for steps := 0; a < b; steps++ {
		if steps == calendarSteps {
			return n + (b-a)/span
		}
		if m, to := k.skip(a, b, math.MaxInt64); m > 0 {
			n, a = n+m, to
			continue
		}
		a = k.end(a)
		n++
	}
	return n
}

// after returns the start of the period n periods after the one starting
// at start (n >= 0), as between counts them: beyond calendarSteps steps at
// or after the true one.
func (k *calendarClock) after(start, n, span int64) int64 {
	for steps := 0; n > 0; steps++ {
		if steps == calendarSteps {
			return k.start(start + n*span)
		}
		if m, to := k.skip(start, math.MaxInt64, n); m > 0 {
			n, start = n-m, to
			continue
		}
		start = k.end(start)
		n--
	}
	return start
}

// skip counts the periods that start after the period start a, at or
// before b, before the zone's offset next changes, and no more than most
// of them: it returns how many and where the last starts. Within a span of
// constant offset a period starts wherever the clock reads the start of a
// unit, so they are counted by arithmetic on the clock's readings.
func (k *calendarClock) skip(a, b, most int64) (n, last int64) {
	off, _, ze := k.zoneAt(a)
	if ze != math.MaxInt64 {
		b = min(b, ze-1)
	}
	ws := k.cal.trunc(a + off)
	n = most
	if b != math.MaxInt64 { // else no bound but most; b+off would overflow
		n = min(most, k.cal.units(ws, b+off))
	}
	if n <= 0 {
		return 0, a
	}
	return n, k.cal.add(ws, n) - off
}

type zoneEntry struct {
	loc *time.Location
	err error
}

var zones sync.Map // zone name -> zoneEntry

// LoadZone returns the time zone named name ("" is UTC) for a calendar
// rule, from the tz database embedded in the binary. It refuses "Local",
// which differs between nodes, and a zone that sets its clocks back by
// more than 4 hours within 32 days from 1970 to 2200, whose periods could
// outlast the span records keep.
func LoadZone(name string) (*time.Location, error) {
	if e, ok := zones.Load(name); ok {
		return e.(zoneEntry).loc, e.(zoneEntry).err
	}
	e := loadZone(name)
	zones.Store(name, e)
	return e.loc, e.err
}

func loadZone(name string) zoneEntry {
	if name == "Local" {
		return zoneEntry{err: fmt.Errorf("%q is each node's own zone; name one such as Asia/Shanghai", name)}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return zoneEntry{err: fmt.Errorf("%q is not a time zone of the tz database such as Asia/Shanghai or America/New_York", name)}
	}
	// Walk the zone's transitions, summing the setbacks of the last 32 days.
	type back struct{ at, by int64 }
	var recent []back
	var sum int64
	k := &calendarClock{cal: CalendarDay, loc: loc}
	end := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for t := int64(0); t < end; {
		off, _, ze := k.zoneAt(t)
		if ze == math.MaxInt64 {
			break
		}
		next, _, _ := k.zoneAt(ze)
		for len(recent) > 0 && recent[0].at <= ze-32*msPerDay {
			sum -= recent[0].by
			recent = recent[1:]
		}
		if by := off - next; by > 0 {
			recent = append(recent, back{ze, by})
			sum += by
			if sum > maxZoneShift {
				return zoneEntry{err: fmt.Errorf("%q sets its clocks back by %v within 32 days before %s, more than the %v a calendar rule allows",
					name, time.Duration(sum)*time.Millisecond, time.UnixMilli(ze).UTC().Format(time.DateOnly), time.Duration(maxZoneShift)*time.Millisecond)}
			}
		}
		t = ze
	}
	return zoneEntry{loc: loc}
}
