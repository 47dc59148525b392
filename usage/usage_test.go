package usage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/freqring/freqring/wal"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func newTracker(t testing.TB, cfg Config) *Tracker {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// refKey names a domain's day in the reference.
type refKey struct {
	zone   string
	date   string
	domain string
}

// refDay is the brute-force reference: every event kept, counted by
// walking them.
type refDay struct {
	admitted, denied int64
	rules            map[string][2]int64 // denied, would deny
	keys             map[uint64]bool
}

// reference counts events at times ms in every zone, computing each date
// with time.In directly.
type reference map[refKey]*refDay

func (ref reference) add(zones []*time.Location, ms int64, e Event) {
	for _, loc := range zones {
		k := refKey{loc.String(), time.UnixMilli(ms).In(loc).Format(time.DateOnly), e.Domain}
		d := ref[k]
		if d == nil {
			d = &refDay{rules: map[string][2]int64{}, keys: map[uint64]bool{}}
			ref[k] = d
		}
		if e.Admitted {
			d.admitted++
		} else {
			d.denied++
			c := d.rules[e.DeniedBy]
			c[0]++
			d.rules[e.DeniedBy] = c
		}
		if e.WouldDenyBy != "" {
			c := d.rules[e.WouldDenyBy]
			c[1]++
			d.rules[e.WouldDenyBy] = c
		}
		d.keys[e.Key] = true
	}
}

// compare requires got to hold exactly the reference's days and counters,
// and distinct-recipient estimates within three standard errors.
func (ref reference) compare(t *testing.T, got []DomainDay) {
	t.Helper()
	seen := map[refKey]bool{}
	for _, g := range got {
		k := refKey{g.Zone, g.Date.String(), g.Domain}
		seen[k] = true
		want := ref[k]
		if want == nil {
			t.Errorf("%v: a day the reference does not have", k)
			continue
		}
		if g.Admitted != want.admitted || g.Denied != want.denied {
			t.Errorf("%v: admitted %d denied %d, want %d %d", k, g.Admitted, g.Denied, want.admitted, want.denied)
		}
		rules := map[string][2]int64{}
		for _, r := range g.Rules {
			rules[r.Rule] = [2]int64{r.Denied, r.WouldDeny}
		}
		if !reflect.DeepEqual(rules, want.rules) {
			t.Errorf("%v: rules %v, want %v", k, rules, want.rules)
		}
		checkEstimate(t, fmt.Sprint(k), g.Recipients.Estimate(), len(want.keys))
	}
	for k := range ref {
		if !seen[k] {
			t.Errorf("%v: missing", k)
		}
	}
}

// checkEstimate requires est within three standard errors of n.
func checkEstimate(t *testing.T, what string, est float64, n int) {
	t.Helper()
	if math.Abs(est-float64(n)) > 3*StdError*float64(n)+0.5 {
		t.Errorf("%s: %.1f distinct recipients estimated, %d true: off by %.2f%%, more than 3 standard errors (%.2f%%)",
			what, est, n, 100*math.Abs(est-float64(n))/float64(n), 300*StdError)
	}
}

// TestCountMatchesReference counts seeded random events over ten days in
// UTC and a zone with DST, against the reference.
func TestCountMatchesReference(t *testing.T) {
	for _, zone := range []string{"America/New_York", "Asia/Kolkata", "UTC"} {
		t.Run(zone, func(t *testing.T) {
			loc := mustZone(t, zone)
			tr := newTracker(t, Config{Zone: loc})
			zones := []*time.Location{time.UTC}
			if zone != "UTC" {
				zones = append(zones, loc)
			}
			ref := reference{}
			rng := rand.New(rand.NewPCG(14, 2))
			t0 := time.Date(2026, 3, 4, 0, 0, 0, 0, time.UTC).UnixMilli() // New York changes its clocks on March 8
			ms := t0
			for range 50_000 {
				ms += rng.Int64N(40_000) // ten days in all
				e := Event{Domain: []string{"default", "otp", "marketing"}[rng.IntN(3)], Key: xxhash.Sum64String(fmt.Sprint("+86", rng.IntN(3000)))}
				if rng.IntN(3) > 0 {
					e.Admitted = true
				} else {
					e.DeniedBy = []string{"recipient-1m", "recipient-24h", "content-59s"}[rng.IntN(3)]
				}
				if rng.IntN(5) == 0 {
					e.WouldDenyBy = "shadow-1h"
				}
				tr.Count(ms, e)
				ref.add(zones, ms, e)
			}
			ref.compare(t, tr.All())
			if d := tr.Dropped(); d != 0 {
				t.Errorf("Dropped %d, want 0", d)
			}
		})
	}
}

// TestSketchAccuracy estimates seeded sets of 10, 1k and 100k distinct keys
// (each key added three times) within three standard errors.
func TestSketchAccuracy(t *testing.T) {
	for _, n := range []int{10, 1000, 20_000, 100_000} {
		for seed := range uint64(3) {
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			var s Sketch
			var live liveSketch
			for i := range n {
				h := xxhash.Sum64String(fmt.Sprintf("+86%d-%d", rng.Uint64(), i))
				for range 3 {
					s.Add(h)
					live.add(h)
				}
			}
			checkEstimate(t, fmt.Sprintf("n=%d seed=%d", n, seed), s.Estimate(), n)
			var c Sketch
			live.copyTo(&c)
			if c != s {
				t.Fatalf("n=%d: the live sketch's registers differ from the plain one's", n)
			}
			if n == 10 && math.Round(s.Estimate()) != 10 {
				t.Errorf("10 keys estimated as %.3f, want 10 (linear counting)", s.Estimate())
			}
		}
	}
	var empty Sketch
	if e := empty.Estimate(); e != 0 {
		t.Errorf("empty sketch estimates %v, want 0", e)
	}
}

// TestRollover counts one event an hour, at times an injected clock gives,
// across the days New York and Kolkata change dates, and checks each day's
// count and span.
func TestRollover(t *testing.T) {
	for _, c := range []struct {
		zone  string
		from  time.Time // UTC
		hours int
		want  map[string]int64 // events per date in the zone
	}{
		// 2026-03-08 has 23 hours in New York (02:00 EST becomes 03:00 EDT).
		{"America/New_York", time.Date(2026, 3, 7, 5, 0, 0, 0, time.UTC), 72,
			map[string]int64{"2026-03-07": 24, "2026-03-08": 23, "2026-03-09": 24, "2026-03-10": 1}},
		// 2026-11-01 has 25 hours (02:00 EDT becomes 01:00 EST).
		{"America/New_York", time.Date(2026, 10, 31, 4, 0, 0, 0, time.UTC), 74,
			map[string]int64{"2026-10-31": 24, "2026-11-01": 25, "2026-11-02": 24, "2026-11-03": 1}},
		// Kolkata is UTC+05:30: its days start at 18:30 UTC; events on the half hour.
		{"Asia/Kolkata", time.Date(2026, 6, 30, 18, 30, 0, 0, time.UTC), 49,
			map[string]int64{"2026-07-01": 24, "2026-07-02": 24, "2026-07-03": 1}},
	} {
		t.Run(c.zone+c.from.Format("-01-02"), func(t *testing.T) {
			tr := newTracker(t, Config{Zone: mustZone(t, c.zone)})
			utc := map[string]int64{}
			for h := range c.hours {
				at := c.from.Add(time.Duration(h) * time.Hour)
				tr.Count(at.UnixMilli(), Event{Domain: "d", Key: uint64(h), Admitted: true})
				utc[at.Format(time.DateOnly)]++
			}
			got := map[string]int64{}
			gotUTC := map[string]int64{}
			for _, d := range tr.All() {
				if d.Zone == "UTC" {
					gotUTC[d.Date.String()] = d.Admitted
				} else {
					got[d.Date.String()] = d.Admitted
				}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s days %v, want %v", c.zone, got, c.want)
			}
			if !reflect.DeepEqual(gotUTC, utc) {
				t.Errorf("UTC days %v, want %v", gotUTC, utc)
			}
			// The last midnight crossed: one millisecond before is the day before.
			last := c.from.Add(time.Duration(c.hours-1) * time.Hour)
			z := tr.zones[1]
			cur := z.cur.Load()
			if cur.start > last.UnixMilli() || time.UnixMilli(cur.start-1).In(z.loc).Format(time.DateOnly) == cur.date.String() ||
				time.UnixMilli(cur.start).In(z.loc).Format(time.DateOnly) != cur.date.String() {
				t.Errorf("current day %v starts at %v, not at its midnight", cur.date, time.UnixMilli(cur.start).In(z.loc))
			}
		})
	}
}

// TestRetention keeps three days: a fourth drops the oldest whole, and an
// event of a dropped day is counted as dropped.
func TestRetention(t *testing.T) {
	tr := newTracker(t, Config{Days: 3})
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for d := range 5 {
		tr.Count(t0.AddDate(0, 0, d).UnixMilli(), Event{Domain: "x", Admitted: true, Key: uint64(d)})
	}
	var dates []string
	for _, d := range tr.All() {
		dates = append(dates, d.Date.String())
	}
	if want := []string{"2026-05-03", "2026-05-04", "2026-05-05"}; !reflect.DeepEqual(dates, want) {
		t.Fatalf("days kept %v, want %v", dates, want)
	}
	tr.Count(t0.AddDate(0, 0, 1).UnixMilli(), Event{Domain: "x", Admitted: true}) // 2026-05-02: dropped
	tr.Count(t0.AddDate(0, 0, 2).UnixMilli(), Event{Domain: "x", Admitted: true}) // 2026-05-03: kept, counted
	if got := tr.Dropped(); got != 1 {
		t.Errorf("Dropped %d, want 1", got)
	}
	got, err := tr.Report(t0.AddDate(0, 0, 4).UnixMilli(), Query{Days: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Admitted != 2 || got[2].Admitted != 1 {
		t.Errorf("report %+v, want 3 days, the first with 2 admitted", got)
	}
	if got, _ := tr.Report(t0.AddDate(0, 0, 4).UnixMilli(), Query{}); len(got) != 1 || got[0].Date.String() != "2026-05-05" {
		t.Errorf("a report of 1 day is %+v, want 2026-05-05 alone", got)
	}
	if _, err := tr.Report(0, Query{Zone: "Europe/Paris"}); err == nil {
		t.Error("a report of a zone not kept succeeded")
	}
	for _, bad := range []int{-1, MaxDays + 1} {
		if _, err := New(Config{Days: bad}); err == nil || !bytes.Contains([]byte(err.Error()), []byte(fmt.Sprint(bad))) {
			t.Errorf("Days %d: error %v, want one naming the value", bad, err)
		}
	}
}

// randomDays returns a tracker's days after seeded events, in two zones.
func randomDays(t testing.TB, seed uint64, events int) []DomainDay {
	tr := newTracker(t, Config{Zone: mustZone(t, "Asia/Shanghai")})
	rng := rand.New(rand.NewPCG(seed, 0))
	ms := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for range events {
		ms += rng.Int64N(1_000_000)
		e := Event{Domain: fmt.Sprint("d", rng.IntN(3)), Key: rng.Uint64(), Admitted: rng.IntN(2) == 0}
		if !e.Admitted {
			e.DeniedBy = fmt.Sprint("r", rng.IntN(4))
		}
		tr.Count(ms, e)
	}
	return tr.All()
}

func TestEncodeDecode(t *testing.T) {
	for _, days := range [][]DomainDay{nil, randomDays(t, 1, 100), randomDays(t, 2, 30_000)} {
		b, err := Encode(nil, days)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(days) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, days) {
			t.Fatalf("round trip of %d days differs", len(days))
		}
	}
	b, _ := Encode(nil, randomDays(t, 3, 50))
	for n := range len(b) {
		if _, err := Decode(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix of %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, err := Decode(c); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := Encode(nil, []DomainDay{{Domain: "x", Admitted: -1}}); err == nil {
		t.Error("a negative counter encoded")
	}
}

func TestSketchEncoding(t *testing.T) {
	for _, n := range []int{0, 1, 100, 5000, 100_000} {
		var s Sketch
		for i := range n {
			s.Add(xxhash.Sum64String(fmt.Sprint(i)))
		}
		b := s.AppendBinary(nil)
		got, used, err := DecodeSketch(append(b, 7))
		if err != nil || used != len(b) || *got != s {
			t.Fatalf("n=%d: round trip: %v, used %d of %d", n, err, used, len(b))
		}
		for k := range len(b) {
			if _, _, err := DecodeSketch(b[:k]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("n=%d: prefix %d of %d: %v, want ErrCorrupt", n, k, len(b), err)
			}
		}
	}
}

// TestMerge splits seeded events between two trackers: merging their days
// gives exactly one tracker's days, sketches included, as a cluster's sum
// through a partition move does.
func TestMerge(t *testing.T) {
	loc := mustZone(t, "Europe/Berlin")
	one := newTracker(t, Config{Zone: loc})
	two := [2]*Tracker{newTracker(t, Config{Zone: loc}), newTracker(t, Config{Zone: loc})}
	rng := rand.New(rand.NewPCG(7, 7))
	ms := time.Date(2026, 3, 27, 0, 0, 0, 0, time.UTC).UnixMilli()
	for i := range 20_000 {
		ms += rng.Int64N(60_000)
		e := Event{Domain: fmt.Sprint("d", rng.IntN(2)), Key: xxhash.Sum64String(fmt.Sprint(rng.IntN(5000))), Admitted: rng.IntN(4) > 0}
		if !e.Admitted {
			e.DeniedBy = fmt.Sprint("r", rng.IntN(3))
		}
		one.Count(ms, e)
		two[i*2/20_000].Count(ms, e) // the first half on one node, the second on the other
	}
	got := Merge(two[0].All(), two[1].All())
	want := Merge(one.All(), nil)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged days differ from one tracker's: %d days, want %d", len(got), len(want))
	}
	// Restore sums into a tracker as Merge does.
	r := newTracker(t, Config{Zone: loc})
	if skipped := r.Restore(ms, two[0].All()) + r.Restore(ms, two[1].All()); skipped != 0 {
		t.Fatalf("Restore skipped %d days", skipped)
	}
	if back := Merge(r.All(), nil); !reflect.DeepEqual(back, want) {
		t.Fatal("restored days differ")
	}
	// A tracker without the zone skips its days; one keeping fewer days skips the old ones.
	utc := newTracker(t, Config{Days: 2})
	if skipped := utc.Restore(ms, one.All()); skipped != len(one.All())-2*2 {
		t.Errorf("Restore into a UTC tracker of 2 days skipped %d of %d days", skipped, len(one.All()))
	}
}

// TestCountConcurrent counts from many goroutines across a midnight: no
// count is lost.
func TestCountConcurrent(t *testing.T) {
	tr := newTracker(t, Config{Zone: mustZone(t, "Asia/Kolkata")})
	t0 := time.Date(2026, 8, 1, 18, 29, 0, 0, time.UTC).UnixMilli() // a minute before Kolkata's midnight
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				tr.Count(t0+int64(i)*60, Event{Domain: "d", Key: uint64(g*2000 + i), Admitted: i%2 == 0, DeniedBy: "r"})
			}
		})
	}
	wg.Wait()
	for _, zone := range tr.Zones() {
		var adm, den int64
		days, _ := tr.Report(t0+120_000, Query{Zone: zone, Days: 2})
		for _, d := range days {
			adm, den = adm+d.Admitted, den+d.Denied
		}
		if adm != 8000 || den != 8000 {
			t.Errorf("%s: admitted %d, denied %d, want 8000 each", zone, adm, den)
		}
		if zone != "UTC" && len(days) != 2 {
			t.Errorf("%s: %d days, want 2 (the events cross its midnight)", zone, len(days))
		}
	}
}

func TestCountAllocs(t *testing.T) {
	tr := newTracker(t, Config{Zone: mustZone(t, "Asia/Kolkata")})
	ms := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	e := Event{Domain: "default", Key: 1, DeniedBy: "recipient-1m", WouldDenyBy: "shadow"}
	tr.Count(ms, e)
	if a := testing.AllocsPerRun(1000, func() { e.Key++; tr.Count(ms, e) }); a != 0 {
		t.Errorf("Count allocates %v times, want 0", a)
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(nil, randomDays(f, 4, 20))
	f.Add(b)
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		days, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		again, err := Encode(nil, days)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(again)
		if err != nil || !reflect.DeepEqual(back, days) {
			t.Fatalf("re-encoded days differ: %v", err)
		}
	})
}

func FuzzDecodeSketch(f *testing.F) {
	var s Sketch
	for i := range 100 {
		s.Add(xxhash.Sum64String(fmt.Sprint(i)))
	}
	f.Add(s.AppendBinary(nil))
	f.Add(append([]byte{Precision, sketchDense}, make([]byte, Registers)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, n, err := DecodeSketch(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if !bytes.Equal(s.AppendBinary(nil), b[:n]) {
			t.Fatalf("re-encoding differs from the %d bytes decoded", n)
		}
	})
}

// TestDecodeVersion1: the saved form of version 1 (no frame, a CRC-32C of
// all before it at the end), which an earlier build wrote, still decodes,
// and its damage is still found.
func TestDecodeVersion1(t *testing.T) {
	days := randomDays(t, 4, 40)
	v1 := append([]byte(magic), 1)
	v1 = binary.LittleEndian.AppendUint32(v1, uint32(len(days)))
	for i := range days {
		v1 = days[i].appendBinary(v1)
	}
	v1 = binary.LittleEndian.AppendUint32(v1, crc32.Checksum(v1, wal.Castagnoli))
	got, err := Decode(v1)
	if err != nil || !reflect.DeepEqual(got, days) {
		t.Fatalf("version 1: %v, %d days of %d decoded alike", err, len(got), len(days))
	}
	v1[len(v1)/2] ^= 1
	if _, err := Decode(v1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 1, a byte flipped: %v", err)
	}
}
