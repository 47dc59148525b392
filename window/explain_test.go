package window

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestExplainMatchesReferenceLogs replays random sequences into the engine
// and the brute-force reference, and after every step explains a random
// content: the decision must be the reference's Peek, and each rule's sends
// the reference's sends in its window (the newest its scope keeps).
func TestExplainMatchesReferenceLogs(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 77))
		d := randomDomain(rng, seed%2 == 0)
		var (
			s   Scratch
			rec []byte
			ref refRecipient
			now = t0
		)
		for op := range 600 {
			now += int64(rng.IntN(20_000))
			it := Item{Cost: 1 + rng.IntN(2)}
			if c := rng.IntN(4); c > 0 {
				it.Content = uint64(c) * 0x9e3779b97f4a7c15
			}
			if rng.IntN(10) == 0 {
				it.Mode = RecordOnly
			}
			ref.decide(d, now, it) // records what it admits
			var dec Decision
			out, err := d.Apply(&s, rec, 7, now, it, &dec)
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatal(err)
			}
			if out != nil {
				rec = append(rec[:0], out...)
			}
			q := Item{Cost: 1 + rng.IntN(2)}
			if c := rng.IntN(4); c > 0 {
				q.Content = uint64(c) * 0x9e3779b97f4a7c15
			}
			what := func() string { return fmt.Sprintf("seed %d op %d item %+v rules %+v", seed, op, q, d.rules) }
			ex, err := d.Explain(&s, rec, 7, now, q)
			peek := q
			peek.Mode = Peek
			want := ref.decide(d, now, peek)
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s: %v", what(), err)
				}
				continue
			}
			if ex.Decision != want {
				t.Fatalf("%s:\n got %+v\nwant %+v", what(), ex.Decision, want)
			}
			for i, r := range d.rules {
				if got, want := ex.Rules[i].Sends, ref.logged(d, r, ex.Decision.At, q.Content); !slices.Equal(got, want) {
					t.Fatalf("%s: rule %s sends\n got %v\nwant %v", what(), r.Name, got, want)
				}
			}
		}
	}
}

// logged lists by brute force the sends rule r counts at t (Explain's
// RuleView.Sends): per log (the recipient's, or each content's), the
// newest its scope keeps of those in the window.
func (r *refRecipient) logged(d *Domain, rl Rule, t int64, content uint64) []Logged {
	logs := map[uint32][]Logged{}
	for _, s := range r.sends {
		in := s.at > t-rl.WindowMillis() && s.at <= t
		switch {
		case !in:
		case rl.Scope == ScopeRecipient:
			logs[0] = append(logs[0], Logged{At: s.at})
		case s.content != 0 && (content == 0 || contentFP(s.content) == contentFP(content)):
			fp := contentFP(s.content)
			logs[fp] = append(logs[fp], Logged{At: s.at, Content: fp})
		}
	}
	keep := d.recipCap
	if rl.Scope == ScopeContent {
		keep = d.contentCap
	}
	var out []Logged
	for _, l := range logs {
		out = append(out, l[max(0, len(l)-keep):]...)
	}
	slices.SortFunc(out, func(a, b Logged) int {
		if a.At != b.At {
			return int(a.At - b.At)
		}
		return int(a.Content) - int(b.Content)
	})
	return out
}

// TestExplainMatchesReferenceCounters does the same for every counting
// algorithm: the decision is the reference's Peek, and each state agrees
// with it (a GCRA's theoretical arrival time with the reference's exact
// one, a sliding counter's sub-windows and a fixed window's count with the
// reference's sends).
func TestExplainMatchesReferenceCounters(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 78))
		d := randomCounterDomain(rng, seed%2 == 0)
		var (
			s   Scratch
			rec []byte
			ref refKey
			now = t0
		)
		for op := range 400 {
			now += int64(rng.IntN(600))
			it := Item{Cost: 1 + rng.IntN(3)}
			if rng.IntN(10) == 0 {
				it.Mode = RecordOnly
			}
			stepReference(t, d, &s, &rec, 3, &ref, now, it, func() string { return fmt.Sprintf("seed %d op %d", seed, op) })
			q := Item{Cost: 1 + rng.IntN(2), Mode: Peek}
			want, valid := ref.decide(d, now, q)
			ex, err := d.Explain(&s, rec, 3, now, q)
			what := func() string { return fmt.Sprintf("seed %d op %d item %+v rules %+v", seed, op, q, d.rules) }
			if !valid {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("%s: Explain = %v, want ErrInvalid", what(), err)
				}
				continue
			}
			if err != nil || ex.Decision != want {
				t.Fatalf("%s: %v\n got %+v\nwant %+v", what(), err, ex.Decision, want)
			}
			at := ex.Decision.At
			for i, r := range d.rules {
				st := map[string]float64{}
				for _, v := range ex.Rules[i].State {
					st[v.Name] = v.Value
				}
				res := ex.Decision.Rules[i]
				fail := func(msg string, args ...any) {
					t.Helper()
					t.Fatalf("%s: rule %+v state %v result %+v: %s", what(), r, ex.Rules[i].State, res, fmt.Sprintf(msg, args...))
				}
				switch r.Algorithm {
				case TokenBucket:
					if tok := st["tokens"]; int(max(0, tok)) != res.Remaining || st["capacity"] != float64(r.BucketCapacity()) {
						fail("tokens %v, remaining %d", tok, res.Remaining)
					}
				case LeakyBucket:
					if lv := st["level"]; int(-int64(-lv*1e9)/1e9) > res.Used || lv > float64(res.Used) {
						fail("level %v, used %d", lv, res.Used)
					}
				case GCRA:
					b := ref.backlog(i, at)
					if got := int64(st["tat_unix_ms"]) - at; got != ratCeil(b) {
						fail("TAT %d ms ahead, the reference's %s", got, b.FloatString(3))
					}
				case FixedWindow:
					if st["count"]+st["owed"] != float64(res.Used) {
						fail("count + owed != used")
					}
					if r.Borrow == 0 && r.Calendar == CalendarNone {
						if n := ref.count(r, at); int64(st["count"]) != n {
							fail("count %v, the reference's %d", st["count"], n)
						}
					}
				case SlidingCounter:
					w := r.WindowMillis() / int64(r.buckets())
					cur := at / w * w
					sum := 0.0
					for k := 0; ; k++ {
						v, ok := st[fmt.Sprintf("sub_window_%d", k)]
						if !ok {
							break
						}
						var n int64
						for _, s := range ref.sends {
							if s.at/w*w == cur-int64(k)*w {
								n += s.cost
							}
						}
						if int64(v) != n {
							fail("sub-window %d: %v, the reference's %d", k, v, n)
						}
						sum += v
					}
					if sum != st["count"] || st["count"] != float64(res.Used) {
						fail("sub-windows sum to %v, count %v, used %d", sum, st["count"], res.Used)
					}
				}
			}
		}
	}
}
