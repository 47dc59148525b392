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
	dec.ShadowDeniedBy = -1
	never := false // a rule that is not a shadow has a limit below the cost: Apply rejects the item
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
		retry := int64(-1) // never
		if best >= 0 {
			retry = best - t
		}
		dec.Rules[i].RetryAfter = retry
		if rl.Shadow {
			// The shadow rule with the longest retry, never the longest of all;
			// the first such rule on ties.
			if sb := dec.ShadowDeniedBy; sb < 0 || dec.Rules[sb].RetryAfter >= 0 && (retry < 0 || retry > dec.Rules[sb].RetryAfter) {
				dec.ShadowDeniedBy = i
			}
			continue
		}
		if retry < 0 {
			never = true
			continue
		}
		if retry > dec.RetryAfter {
			dec.RetryAfter, dec.DeniedBy = retry, i
		}
	}
	dec.Admitted = dec.DeniedBy < 0 && !never
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

// randomDomain returns a domain of 1 to 5 random rules; with shadows, each
// rule is a shadow with probability 1/3 (a whole domain of shadows too).
func randomDomain(rng *rand.Rand, shadows bool) *Domain {
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
			Shadow: shadows && rng.IntN(3) == 0,
		}
		if shadows && rng.IntN(2) == 0 {
			// Few windows and limits, so that rules tie on their retry.
			rules[i].Limit, rules[i].Window = 1+rng.IntN(4), time.Duration(1+rng.IntN(4))*15*time.Second
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
func runReference(t *testing.T, rng *rand.Rand, d *Domain, ops, keys, maxStep int) (deniedBy, shadowDeniedBy []int) {
	t.Helper()
	deniedBy = make([]int, d.NumRules())
	shadowDeniedBy = make([]int, d.NumRules())
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
			// A cost above the limit of a rule that is not a shadow is
			// rejected before anything changes; the reference must not have
			// recorded it either.
			neverAdmitted := false
			for i, rl := range d.rules {
				neverAdmitted = neverAdmitted || want.Rules[i].RetryAfter < 0 && !rl.Shadow
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
		if got.ShadowDeniedBy >= 0 {
			shadowDeniedBy[got.ShadowDeniedBy]++
			if !d.rules[got.ShadowDeniedBy].Shadow {
				t.Fatalf("op %d: ShadowDeniedBy %d is not a shadow rule", op, got.ShadowDeniedBy)
			}
		}
		if got.DeniedBy >= 0 && d.rules[got.DeniedBy].Shadow {
			t.Fatalf("op %d: denied by shadow rule %d", op, got.DeniedBy)
		}
		if out != nil {
			recs[k] = append(recs[k][:0], out...)
			if RecordTag(recs[k]) != uint16(k) {
				t.Fatalf("op %d: tag %d, want %d", op, RecordTag(recs[k]), k)
			}
		}
	}
	return deniedBy, shadowDeniedBy
}

func TestEngineMatchesReferenceDefaultRules(t *testing.T) {
	d, err := NewDomain("default", DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	// Few keys and short steps, so that all four rules bind.
	total := make([]int, d.NumRules())
	for seed := range uint64(4) {
		denied, _ := runReference(t, rand.New(rand.NewPCG(seed, 1)), d, 3000, 3, 1500)
		for i, n := range denied {
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
		d := randomDomain(rng, false)
		runReference(t, rng, d, 2500, 12, 3000)
	}
}

// TestEngineMatchesReferenceShadowRules: random domains with shadow rules
// (some all shadows) decide as the reference on admission and on
// ShadowDeniedBy, and the shadows do deny now and then (or the test would
// prove nothing).
func TestEngineMatchesReferenceShadowRules(t *testing.T) {
	var shadowDenials, allShadow, allShadowAdmittedOver int
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		d := randomDomain(rng, true)
		_, shadow := runReference(t, rng, d, 2500, 6, 1500)
		n := 0
		for _, k := range shadow {
			n += k
		}
		shadowDenials += n
		all := true
		for _, r := range d.rules {
			all = all && r.Shadow
		}
		if all {
			allShadow++
			allShadowAdmittedOver += n
		}
	}
	t.Logf("shadow denials: %d; all-shadow domains: %d, with %d shadow denials", shadowDenials, allShadow, allShadowAdmittedOver)
	if shadowDenials == 0 || allShadow == 0 || allShadowAdmittedOver == 0 {
		t.Fatal("the random domains did not exercise shadow rules")
	}
}

// TestShadowRuleNeverDenies: a domain whose only rule is a shadow of limit
// 1 admits and records every send, and reports the rule as the one that
// would deny from the second send on, with the retry it would have.
func TestShadowRuleNeverDenies(t *testing.T) {
	d, err := NewDomain("s", []Rule{
		{Name: "real", Scope: ScopeRecipient, Limit: 3, Window: time.Minute},
		{Name: "shadow", Scope: ScopeRecipient, Limit: 1, Window: 10 * time.Second, Shadow: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	var s Scratch
	var rec []byte
	for k := range 4 {
		var dec Decision
		out, err := d.Apply(&s, rec, 0, t0+int64(k)*1000, Item{}, &dec)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			rec = append(rec[:0], out...)
		}
		wantShadow, wantAdmit := -1, k < 3
		if k > 0 {
			wantShadow = 1
		}
		if dec.Admitted != wantAdmit || dec.Recorded != wantAdmit || dec.ShadowDeniedBy != wantShadow {
			t.Fatalf("send %d: admitted %v recorded %v shadow %d, want %v %v %d", k, dec.Admitted, dec.Recorded, dec.ShadowDeniedBy, wantAdmit, wantAdmit, wantShadow)
		}
		if k == 1 && (dec.Rules[1].RetryAfter != 9000 || dec.Rules[1].Used != 2 || dec.Rules[1].Remaining != 0) {
			t.Fatalf("send 1: shadow rule reports %+v, want used 2, remaining 0, retry 9000", dec.Rules[1])
		}
		if k == 3 && dec.DeniedBy != 0 {
			t.Fatalf("send 3: denied by %d, want 0 (real)", dec.DeniedBy)
		}
	}
	// A cost above the shadow's limit is not an error: it would never admit.
	var dec Decision
	if _, err := d.Apply(&s, nil, 0, t0, Item{Cost: 2}, &dec); err != nil || !dec.Admitted || dec.ShadowDeniedBy != 1 || dec.Rules[1].RetryAfter != -1 {
		t.Fatalf("cost 2 over shadow limit 1: err %v, %+v", err, dec)
	}

	// Ties go to the first shadow rule; never beats any retry.
	tie, err := NewDomain("tie", []Rule{
		{Name: "a", Scope: ScopeRecipient, Limit: 2, Window: time.Minute, Shadow: true},
		{Name: "b", Scope: ScopeRecipient, Limit: 2, Window: time.Minute, Shadow: true},
		{Name: "c", Scope: ScopeRecipient, Limit: 1, Window: time.Second, Shadow: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec = nil
	for k, want := range []int{-1, 2, 0} {
		out, err := tie.Apply(&s, rec, 0, t0+int64(k), Item{}, &dec)
		if err != nil {
			t.Fatal(err)
		}
		rec = append(rec[:0], out...)
		if dec.ShadowDeniedBy != want {
			t.Fatalf("tie send %d: ShadowDeniedBy %d, want %d (%+v)", k, dec.ShadowDeniedBy, want, dec.Rules[:3])
		}
	}
	if _, err := tie.Apply(&s, rec, 0, t0+3, Item{Cost: 2}, &dec); err != nil || dec.ShadowDeniedBy != 2 {
		t.Fatalf("cost 2: err %v, ShadowDeniedBy %d, want 2 (never admits)", err, dec.ShadowDeniedBy)
	}
}

// TestInsertIsOrderIndependent: the sends a record was built from, inserted
// in any order into an empty record, rebuild it byte for byte.
func TestInsertIsOrderIndependent(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 5))
		d := randomDomain(rng, seed%2 == 0)
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
