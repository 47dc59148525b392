package window

import (
	"math/rand/v2"
	"testing"
)

// full reports whether a log of capacity cap whose entries after horizon
// count is full, as Remove judges it.
func full(log []int64, cap int, horizon int64) bool {
	return len(log) >= cap && len(log) > 0 && log[0] > horizon
}

// TestRemoveMatchesReference refunds random recorded sends among random
// checks. While Remove meets no full log it must be exact: every later
// decision equals the brute-force reference's with the refunded sends
// taken out. When it meets a full log (see Remove), a peek right after
// must count at least what the reference counts for every rule (it may
// count more: never fewer, or it would over-admit); that recipient then
// starts afresh in both.
func TestRemoveMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 4))
	for round := range 40 {
		d := randomDomain(rng, false)
		if round == 0 {
			d, _ = NewDomain("default", DefaultRules())
		}
		const keys = 16
		recs := make([][]byte, keys)
		refs := make([]refRecipient, keys)
		var s Scratch
		now := t0
		exact, safe := 0, 0
		for op := range 4000 {
			now += int64(rng.IntN(int(d.Longest()/20) + 1))
			k := rng.IntN(keys)
			if rng.IntN(4) == 0 && len(refs[k].sends) > 0 {
				// Refund a recorded send: all the units of its time and content.
				pick := refs[k].sends[rng.IntN(len(refs[k].sends))]
				it := Item{Content: pick.content}
				for _, x := range refs[k].sends {
					if x == pick {
						it.Cost++
					}
				}
				it.Cost = 1 + rng.IntN(it.Cost)
				wasFull := false
				if len(recs[k]) > 0 {
					var st state
					if err := st.decode(recs[k]); err != nil {
						t.Fatal(err)
					}
					wasFull = d.recipCap > 0 && full(st.recip, d.recipCap, st.newest-d.recipSpan)
					for _, c := range st.clogs {
						wasFull = wasFull || full(st.ctimes[c.off:c.off+c.n], d.contentCap, st.newest-d.contentSpan)
					}
				}
				out, removed, emptied, err := d.Remove(&s, recs[k], uint16(k), pick.at, it)
				if err != nil {
					t.Fatalf("round %d op %d: Remove: %v", round, op, err)
				}
				switch {
				case emptied:
					recs[k] = nil
				case out != nil:
					recs[k] = append(recs[k][:0], out...)
				}
				n := 0 // take the refunded units out of the reference
				kept := refs[k].sends[:0]
				for _, x := range refs[k].sends {
					if x == pick && n < removed {
						n++
						continue
					}
					kept = append(kept, x)
				}
				refs[k].sends = kept
				if !wasFull {
					exact++
					continue
				}
				safe++
				peek := Item{Content: pick.content, Mode: Peek}
				want := refs[k].decide(d, now, peek)
				var got Decision
				if _, err := d.Apply(&s, recs[k], uint16(k), now, peek, &got); err != nil {
					t.Fatal(err)
				}
				for i := range d.NumRules() {
					if got.Rules[i].Used < want.Rules[i].Used {
						t.Fatalf("round %d op %d: after a refund in a full log rule %v counts %d, fewer than the %d sends made",
							round, op, d.Rule(i), got.Rules[i].Used, want.Rules[i].Used)
					}
				}
				recs[k], refs[k] = nil, refRecipient{}
				continue
			}
			it := Item{Cost: 1}
			if c := rng.IntN(4); c > 0 {
				it.Content = uint64(c) * 0x9e3779b97f4a7c15
			}
			if rng.IntN(10) == 0 {
				it.Mode = RecordOnly // may fill a log beyond a limit
			}
			want := refs[k].decide(d, now, it)
			var got Decision
			out, err := d.Apply(&s, recs[k], uint16(k), now, it, &got)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("round %d op %d key %d: after refunds\n got %+v\nwant %+v", round, op, k, got, want)
			}
			if out != nil {
				recs[k] = append(recs[k][:0], out...)
			}
		}
		if round == 0 && exact == 0 {
			t.Fatal("no exact refund")
		}
		t.Logf("round %d: %d exact refunds, %d in full logs", round, exact, safe)
	}
}
