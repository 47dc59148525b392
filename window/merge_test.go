package window

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// buildRecord inserts sends into an empty record, in the given order.
func buildRecord(t *testing.T, d *Domain, s *Scratch, tag uint16, sends []refSend) []byte {
	t.Helper()
	var rec []byte
	for _, snd := range sends {
		out, err := d.Insert(s, rec, tag, snd.at, Item{Content: snd.content})
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			rec = append(rec[:0], out...)
		}
	}
	return rec
}

// TestMergeIsTheUnionOfTwoCopies splits random histories into two copies
// that, at each millisecond, nest (one holds every send of that millisecond
// the other holds), as two nodes' copies of one recipient do, and checks that
// merging them gives exactly the record of the whole history, in either
// order, and that merging with an empty record or with itself changes nothing.
func TestMergeIsTheUnionOfTwoCopies(t *testing.T) {
	domains := []*Domain{}
	for _, rules := range [][]Rule{
		DefaultRules(),
		{{Name: "r", Scope: ScopeRecipient, Limit: 5, Window: time.Second}},
		{{Name: "c", Scope: ScopeContent, Limit: 3, Window: 2 * time.Second}},
	} {
		d, err := NewDomain("d", rules)
		if err != nil {
			t.Fatal(err)
		}
		domains = append(domains, d)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	var s Scratch
	for round := range 3000 {
		d := domains[round%len(domains)]
		const tag = 0xbeef
		var all, a, b []refSend
		at := int64(1_790_000_000_000)
		for range rng.IntN(60) {
			at += 1 + int64(rng.IntN(300)) // one group per millisecond
			// One millisecond's sends: the full side has them all, the
			// other a random subset.
			var group []refSend
			for range 1 + rng.IntN(3) {
				group = append(group, refSend{at: at, content: uint64(rng.IntN(4))})
			}
			all = append(all, group...)
			full, part := &a, &b
			if rng.IntN(2) == 0 {
				full, part = part, full
			}
			*full = append(*full, group...)
			for _, snd := range group {
				if rng.IntN(2) == 0 {
					*part = append(*part, snd)
				}
			}
		}
		want := buildRecord(t, d, &s, tag, all)
		ra := buildRecord(t, d, &s, tag, a)
		rb := buildRecord(t, d, &s, tag, b)
		for _, pair := range [][2][]byte{{ra, rb}, {rb, ra}} {
			got, err := d.Merge(&s, pair[0], pair[1])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("round %d: merge of %d and %d sends:\n got %x\nwant %x", round, len(a), len(b), got, want)
			}
		}
		for _, pair := range [][2][]byte{{ra, nil}, {nil, ra}, {ra, ra}} {
			got, err := d.Merge(&s, pair[0], pair[1])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, ra) {
				t.Fatalf("round %d: merge with empty or itself changed the record:\n got %x\nwant %x", round, got, ra)
			}
		}
	}
}

func TestMergeRefusesTwoRecipients(t *testing.T) {
	d, _ := NewDomain("d", DefaultRules())
	var s Scratch
	a := buildRecord(t, d, &s, 1, []refSend{{at: 1000}})
	b := buildRecord(t, d, &s, 2, []refSend{{at: 1000}})
	if _, err := d.Merge(&s, a, b); err == nil {
		t.Fatal("merged the records of two recipients")
	}
	if _, err := d.Merge(&s, a, []byte{1, 2, 3}); err == nil {
		t.Fatal("merged a corrupt record")
	}
}
