package window

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCompactChangesNoDecision builds random records, compacts each at a
// random time, and then applies the same random items, at that time or
// later, to the compacted record and to the original: every decision and
// error must be equal, and so must the records after the first recorded
// send (whose prune drops the original's dead logs too).
func TestCompactChangesNoDecision(t *testing.T) {
	domains := map[string][]Rule{
		"default": DefaultRules(),
		"content-longer": {
			rule("min", ScopeRecipient, 3, time.Minute),
			rule("c-hour", ScopeContent, 2, time.Hour),
		},
		// A day's bucket, which still holds sends after the content window.
		"with-counter": append(DefaultRules(), Rule{Name: "tb", Scope: ScopeRecipient, Limit: 20,
			Window: 24 * time.Hour, Algorithm: TokenBucket}),
	}
	for name, rules := range domains {
		t.Run(name, func(t *testing.T) {
			d, err := NewDomain(name, rules)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(5, uint64(len(name))))
			var s, sa, sb Scratch
			var da, db, dec Decision
			compacted := 0
			for round := range 400 {
				// A record of 1 to 40 sends over up to 3 hours.
				now := t0
				var rec []byte
				for range 1 + rng.IntN(40) {
					now += rng.Int64N(5 * 60_000)
					out, err := d.Apply(&s, rec, 7, now, Item{Content: uint64(1 + rng.IntN(6))}, &dec)
					if err != nil {
						t.Fatal(err)
					}
					if out != nil {
						rec = append(rec[:0], out...)
					}
				}
				at := now + rng.Int64N(3*3_600_000)
				out, ok, err := d.Compact(&s, rec, at)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					continue
				}
				compacted++
				small := append([]byte(nil), out...)
				if len(small) >= len(rec) {
					t.Fatalf("round %d: compacted %d bytes into %d", round, len(rec), len(small))
				}
				if again, ok, _ := d.Compact(&s, small, at); ok {
					t.Fatalf("round %d: a compacted record compacts again into %d bytes", round, len(again))
				}
				a, b := append([]byte(nil), rec...), small
				recorded := false
				for range 30 {
					at += rng.Int64N(90_000)
					it := Item{Content: uint64(1 + rng.IntN(6)), Mode: Mode(rng.IntN(3))}
					oa, ea := d.Apply(&sa, a, 7, at, it, &da)
					ob, eb := d.Apply(&sb, b, 7, at, it, &db)
					if !errors.Is(ea, eb) && (ea == nil || eb == nil || ea.Error() != eb.Error()) {
						t.Fatalf("round %d: errors differ: %v / %v", round, ea, eb)
					}
					if da != db {
						t.Fatalf("round %d at %d %+v: decisions differ:\n%+v\n%+v", round, at, it, da, db)
					}
					if oa != nil {
						a = append(a[:0], oa...)
						recorded = true
					}
					if ob != nil {
						b = append(b[:0], ob...)
					}
					if recorded && string(a) != string(b) {
						t.Fatalf("round %d: records differ after a recorded send", round)
					}
				}
			}
			if compacted < 50 {
				t.Fatalf("only %d of 400 records compacted; the test wants more", compacted)
			}
		})
	}
}

// TestCompactLeavesWhatCounts checks the cases Compact must leave alone: a
// newest send inside the content window, a domain without recipient or
// content rules, an empty record; and that a corrupt record is an error.
func TestCompactLeavesWhatCounts(t *testing.T) {
	d, _ := NewDomain("default", DefaultRules())
	var s Scratch
	var dec Decision
	rec, _ := d.Apply(&s, nil, 1, t0, Item{Content: 9}, &dec)
	rec = append([]byte(nil), rec...)
	const hour = 59 * 60_000 // the default rules' content window
	if _, ok, err := d.Compact(&s, rec, t0+hour-1); ok || err != nil {
		t.Errorf("compacted inside the content window: %v %v", ok, err)
	}
	if out, ok, err := d.Compact(&s, rec, t0+hour); !ok || err != nil || len(out) >= len(rec) {
		t.Errorf("at the window's end: %d bytes of %d, %v %v", len(out), len(rec), ok, err)
	}
	if _, ok, err := d.Compact(&s, nil, t0+10*hour); ok || err != nil {
		t.Errorf("empty record: %v %v", ok, err)
	}
	onlyContent, _ := NewDomain("c", []Rule{rule("c", ScopeContent, 2, time.Minute)})
	r2, _ := onlyContent.Apply(&s, nil, 1, t0, Item{Content: 9}, &dec)
	if _, ok, err := onlyContent.Compact(&s, append([]byte(nil), r2...), t0+10*hour); ok || err != nil {
		t.Errorf("domain without recipient rules: %v %v", ok, err)
	}
	bad := append([]byte(nil), rec...)
	bad[len(bad)-1] = 0xff
	bad = append(bad[:8], 0xff, 0xff, 0xff, 0xff)
	if _, _, err := d.Compact(&s, bad, t0+10*hour); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("corrupt record: %v", err)
	}
}

// FuzzCompact: arbitrary bytes never panic Compact or the in-place header
// reader it starts with; a record the decoder accepts has as many content
// logs as that reader counts, and what Compact returns for it decodes to the
// same record without its content logs.
func FuzzCompact(f *testing.F) {
	rng := rand.New(rand.NewPCG(8, 8))
	for range 8 {
		f.Add(randomState(rng).encode(nil), int64(0))
		f.Add(randomState(rng).encode(nil), int64(2*3_600_000)) // past the content window: compacts
	}
	f.Add([]byte{}, int64(1))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, int64(1))
	d, _ := NewDomain("default", DefaultRules())
	f.Fuzz(func(t *testing.T, b []byte, later int64) {
		var s Scratch
		var full, small state
		n, nerr := contentLogs(b)
		if err := full.decode(b); err != nil {
			return
		}
		if nerr != nil || n != len(full.clogs) {
			t.Fatalf("%x: header reader counts %d content logs (%v), the decoder %d", b, n, nerr, len(full.clogs))
		}
		now := full.newest + later&(1<<40-1)
		out, ok, err := d.Compact(&s, b, now)
		if err != nil {
			t.Fatalf("%x decodes but does not compact: %v", b, err)
		}
		if !ok {
			return
		}
		if out == nil {
			if len(full.recip) != 0 || len(full.counters) != 0 {
				t.Fatalf("%x: compacted to nothing, but it holds sends", b)
			}
			return
		}
		if err := small.decode(out); err != nil {
			t.Fatalf("compacted %x to %x, which does not decode: %v", b, out, err)
		}
		full.clogs, full.ctimes = full.clogs[:0], full.ctimes[:0]
		if !statesEqual(&full, &small) {
			t.Fatalf("compacted %x to %x, not the same record without content logs", b, out)
		}
	})
}
