package window

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// refSend is one recorded send in the reference model.
type refSend struct {
	at      int64
	content uint64 // 0: none
}

// refRecipient is the brute-force model of one record: a plain list of every
// recorded send, checked by counting.
type refRecipient struct {
	sends  []refSend
	newest int64
}

// decide computes what Apply must answer, by definition and brute force.
func (r *refRecipient) decide(d *Domain, now int64, it Item) Decision {
	cost := max(it.Cost, 1)
	t := max(now, r.newest)
	dec := Decision{DeniedBy: -1, At: t, NumRules: d.NumRules()}
	hasContent := it.Content != 0 && d.contentCap > 0
	counts := func(rl Rule, at int64) int {
		n := 0
		for _, s := range r.sends {
			if s.at > at-rl.WindowMillis() && s.at <= at && (rl.Scope == ScopeRecipient || contentFP(s.content) == contentFP(it.Content) && s.content != 0) {
				n++
			}
		}
		return n
	}
	for i, rl := range d.rules {
		if rl.Scope == ScopeContent && !hasContent {
			continue
		}
		used := counts(rl, t)
		dec.Rules[i].Used = used
		if it.Mode == RecordOnly || used+cost <= rl.Limit {
			continue
		}
		// The earliest later time at which the count drops enough: only
		// when some send leaves the window, at s.at+W.
		best := int64(-1)
		for _, s := range r.sends {
			at := s.at + rl.WindowMillis()
			if at > t && counts(rl, at)+cost <= rl.Limit && (best < 0 || at < best) {
				best = at
			}
		}
		if best < 0 { // cost above the limit: never admitted (Apply rejects the item)
			dec.Rules[i].RetryAfter, dec.DeniedBy = -1, i
			continue
		}
		dec.Rules[i].RetryAfter = best - t
		if best-t > dec.RetryAfter {
			dec.RetryAfter, dec.DeniedBy = best-t, i
		}
	}
	dec.Admitted = dec.DeniedBy < 0
	for i := range d.rules {
		if dec.Rules[i].RetryAfter < 0 {
			dec.Admitted = false
		}
	}
	record := dec.Admitted && it.Mode != Peek && (d.recipCap > 0 || hasContent)
	if record {
		dec.Recorded = true
		for range cost {
			s := refSend{at: t}
			if hasContent {
				s.content = it.Content
			}
			r.sends = append(r.sends, s)
		}
		r.newest = t
	}
	for i, rl := range d.rules {
		if rl.Scope == ScopeContent && !hasContent {
			dec.Rules[i].Remaining = rl.Limit
			continue
		}
		if record {
			dec.Rules[i].Used += cost
		}
		c := d.recipCap
		if rl.Scope == ScopeContent {
			c = d.contentCap
		}
		dec.Rules[i].Used = min(dec.Rules[i].Used, c)
		dec.Rules[i].Remaining = max(0, rl.Limit-dec.Rules[i].Used)
	}
	return dec
}

func randomDomain(rng *rand.Rand) *Domain {
	n := 1 + rng.IntN(5)
	rules := make([]Rule, n)
	for i := range rules {
		sc := ScopeRecipient
		if rng.IntN(2) == 0 {
			sc = ScopeContent
		}
		rules[i] = Rule{
			Name:   fmt.Sprintf("r%d", i),
			Scope:  sc,
			Limit:  1 + rng.IntN(12),
			Window: time.Duration(1+rng.IntN(120_000)) * time.Millisecond,
		}
	}
	d, err := NewDomain("random", rules)
	if err != nil {
		panic(err)
	}
	return d
}

// runReference drives the engine and the reference with one random sequence
// of operations over many recipients and compares every decision.
func runReference(t *testing.T, rng *rand.Rand, d *Domain, ops, keys, maxStep int) (deniedBy []int) {
	t.Helper()
	deniedBy = make([]int, d.NumRules())
	recs := make([][]byte, keys)
	refs := make([]refRecipient, keys)
	var s Scratch
	now := t0
	for op := range ops {
		switch x := rng.IntN(100); {
		case x < 2: // the clock steps back
			now -= int64(rng.IntN(5_000))
		case x < 4: // a long quiet spell
			now += int64(rng.IntN(int(3 * d.Longest())))
		default:
			now += int64(rng.IntN(maxStep))
		}
		k := rng.IntN(keys)
		it := Item{Cost: 1}
		if c := rng.IntN(5); c > 0 {
			it.Content = uint64(c) * 0x9e3779b97f4a7c15
		}
		if rng.IntN(8) == 0 {
			it.Cost = 1 + rng.IntN(3)
		}
		switch x := rng.IntN(20); {
		case x == 0:
			it.Mode = RecordOnly
		case x < 3:
			it.Mode = Peek
		}
		want := refs[k].decide(d, now, it)
		var got Decision
		out, err := d.Apply(&s, recs[k], uint16(k), now, it, &got)
		if err != nil {
			// A cost above a rule's limit is rejected before anything
			// changes; the reference must not have recorded it either.
			neverAdmitted := false
			for i := range d.rules {
				neverAdmitted = neverAdmitted || want.Rules[i].RetryAfter < 0
			}
			if !errors.Is(err, ErrInvalid) || !neverAdmitted || want.Recorded {
				t.Fatalf("op %d: Apply error %v, reference %+v", op, err, want)
			}
			continue
		}
		if got != want {
			t.Fatalf("op %d key %d now t0%+d item %+v:\n got %+v\nwant %+v\nsends %v", op, k, now-t0, it, got, want, refs[k].sends)
		}
		if got.DeniedBy >= 0 {
			deniedBy[got.DeniedBy]++
		}
		if out != nil {
			recs[k] = append(recs[k][:0], out...)
			if RecordTag(recs[k]) != uint16(k) {
				t.Fatalf("op %d: tag %d, want %d", op, RecordTag(recs[k]), k)
			}
		}
	}
	return deniedBy
}

func TestEngineMatchesReferenceDefaultRules(t *testing.T) {
	d, err := NewDomain("default", DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	// Few keys and short steps, so that all four rules bind.
	total := make([]int, d.NumRules())
	for seed := range uint64(4) {
		for i, n := range runReference(t, rand.New(rand.NewPCG(seed, 1)), d, 3000, 3, 1500) {
			total[i] += n
		}
	}
	t.Logf("denials per rule: %v", total)
	for i, n := range total {
		if n == 0 {
			t.Errorf("rule %q never denied: the sequence does not test it", d.Rule(i).Name)
		}
	}
}

func TestEngineMatchesReferenceRandomRules(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 2))
		d := randomDomain(rng)
		runReference(t, rng, d, 2500, 12, 3000)
	}
}

// TestInsertIsOrderIndependent: the sends a record was built from, inserted
// in any order into an empty record, rebuild it byte for byte.
func TestInsertIsOrderIndependent(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 5))
		d := randomDomain(rng)
		if seed%3 == 0 {
			d, _ = NewDomain("default", DefaultRules())
		}
		var s Scratch
		var rec []byte
		var sent []Send
		now := t0
		for range 400 {
			now += int64(rng.IntN(2000))
			if rng.IntN(30) == 0 {
				now -= int64(rng.IntN(3000)) // clock steps back: Apply clamps
			}
			it := Item{Content: uint64(rng.IntN(4)), Cost: 1 + rng.IntN(2)}
			if rng.IntN(10) == 0 {
				it.Mode = RecordOnly
			}
			var dec Decision
			out, err := d.Apply(&s, rec, 3, now, it, &dec)
			if err != nil {
				continue
			}
			if out != nil {
				rec = append(rec[:0], out...)
			}
			if dec.Recorded {
				snd := Send{At: dec.At, Content: it.Content}
				for range it.Cost {
					sent = append(sent, snd)
				}
			}
		}
		for round := range 5 {
			rng.Shuffle(len(sent), func(i, j int) { sent[i], sent[j] = sent[j], sent[i] })
			var got []byte
			for _, snd := range sent {
				out, err := d.Insert(&s, got, 3, snd.At, Item{Content: snd.Content})
				if err != nil {
					t.Fatal(err)
				}
				if out != nil {
					got = append(got[:0], out...)
				}
			}
			if string(got) != string(rec) {
				t.Fatalf("seed %d round %d: rebuilt record differs\n got %x\nwant %x", seed, round, got, rec)
			}
		}
	}
}
