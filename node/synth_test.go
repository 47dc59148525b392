package node

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

const synthRules = `
domains:
  - name: default
    rules:
      - {name: recipient-1m, scope: recipient, limit: 15, window: 1m}
      - {name: recipient-24h, scope: recipient, limit: 50, window: 24h}
      - {name: content-59s, scope: recipient+content, limit: 2, window: 59s}
      - {name: content-59m, scope: recipient+content, limit: 5, window: 59m}
  - name: content-only
    rules:
      - {name: c, scope: recipient+content, limit: 3, window: 1h}
`

// TestSynthServes writes 2,000 synthetic recipients, starts a node on the
// directory and peeks at recipients: each one's record is the one Apply
// builds from its sends, byte for byte, and the node counts exactly them.
func TestSynthServes(t *testing.T) {
	rs, err := rules.Parse("synth", []byte(synthRules))
	if err != nil {
		t.Fatal(err)
	}
	const n, seed = 2000, 7
	now := t0 + 86_400_000
	dir := filepath.Join(t.TempDir(), "data")
	st, err := Synthesize(context.Background(), SynthConfig{DataDir: dir, Recipients: n, Seed: seed, Rules: rs, Now: now, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if st.Records != n || !slices.Equal(st.Domains, []string{"default"}) {
		t.Fatalf("synth wrote %d records in %v, want %d in [default] (content-only has no recipient rule)", st.Records, st.Domains, n)
	}

	clk := &testClock{}
	clk.set(now)
	cfg := durableConfig(t, dir, clk)
	cfg.Rules = rs
	nd := openNode(t, cfg)
	if rs := nd.Recovery(); rs.SnapshotRecords != n || rs.Records != n {
		t.Fatalf("recovered %d records (%d from the snapshot), want %d", rs.Records, rs.SnapshotRecords, n)
	}

	d := rs.Domain("default")
	var s window.Scratch
	phi := uint64(0x9e3779b97f4a7c15) // the steady state's 3 live contents are phi, 2 phi, 3 phi
	contents := []uint64{0, phi, 2 * phi, 3 * phi, 12345}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, i := range append([]uint64{0, 1, n - 1}, rng.Uint64N(n), rng.Uint64N(n), rng.Uint64N(n)) {
		rcp := SynthRecipient(i)
		if want := bench.RecipientName(uint32(i)); rcp != want {
			t.Fatalf("SynthRecipient(%d) = %q, bench.RecipientName = %q", i, rcp, want)
		}
		// The record Apply builds from the recipient's sends, one at a time.
		key, tag := KeyOf(rcp)
		var want []byte
		var dec window.Decision
		for _, snd := range SynthSends(nil, seed, i, now) {
			out, err := d.Apply(&s, want, tag, snd.At, window.Item{Content: snd.Content}, &dec)
			if err != nil || !dec.Admitted {
				t.Fatalf("recipient %d: Apply %v, admitted %v", i, err, dec.Admitted)
			}
			want = append(want[:0], out...)
		}
		var got []byte
		nd.store.ForEach(nd.store.PartitionOf(key), func(domain string, k uint64, rec []byte) bool {
			if domain == "default" && k == key {
				got = slices.Clone(rec)
			}
			return got == nil
		})
		if !bytes.HasPrefix(got, want) { // a record sits in a slot, which may be longer
			t.Fatalf("recipient %d: stored record %x, want %x", i, got, want)
		}

		for _, c := range contents {
			resp, err := nd.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{c}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}})
			if err != nil || len(resp.Errors) > 0 {
				t.Fatalf("peek: %v %v", err, resp.GetErrors())
			}
			var ref window.Decision
			if _, err := d.Apply(&s, want, tag, now, window.Item{Content: c, Mode: window.Peek}, &ref); err != nil {
				t.Fatal(err)
			}
			for r := range ref.NumRules {
				if got, want := resp.Used[r], uint32(ref.Rules[r].Used); got != want {
					t.Errorf("recipient %d content %x rule %s: used %d, want %d", i, c, d.Rule(r).Name, got, want)
				}
			}
			if resp.Used[1] != 30 {
				t.Errorf("recipient %d: recipient-24h used %d, want the steady state's 30", i, resp.Used[1])
			}
		}
	}
	if err := nd.Close(); err != nil {
		t.Fatal(err)
	}

	// A second synth into the directory, now a node's, fails and changes nothing.
	before := dirListing(t, dir)
	_, err = Synthesize(context.Background(), SynthConfig{DataDir: dir, Recipients: n, Rules: rs, Now: now})
	if !errors.Is(err, ErrDataDirNotEmpty) || !bytes.Contains([]byte(err.Error()), []byte(dir)) {
		t.Fatalf("second synth: %v, want ErrDataDirNotEmpty naming %s", err, dir)
	}
	if after := dirListing(t, dir); !slices.Equal(before, after) {
		t.Fatalf("a refused synth changed %s: %v, then %v", dir, before, after)
	}
}

// dirListing returns the names and sizes of the files under dir.
func dirListing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		out = append(out, path, string(rune(fi.Size())))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSynthDeterministic: the same seed, count and time give the same
// records whatever the number of workers. (Not the same bytes: each store
// index draws its own hash seed, which orders an image's records.)
func TestSynthDeterministic(t *testing.T) {
	var got []map[uint64]string
	for _, w := range []int{1, 4} {
		dir := filepath.Join(t.TempDir(), "d")
		st, err := Synthesize(context.Background(), SynthConfig{DataDir: dir, Recipients: 3000, Seed: 3, Now: t0, Workers: w, Partitions: 7})
		if err != nil {
			t.Fatal(err)
		}
		clk := &testClock{}
		clk.set(t0)
		n, err := New(Config{Clock: clk, Placement: ring.Config{PartitionCount: 7}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.loadSnapshot(st.File, t0); err != nil {
			t.Fatal(err)
		}
		recs := map[uint64]string{}
		for p := range 7 {
			n.store.ForEach(p, func(_ string, key uint64, rec []byte) bool {
				recs[key] = string(rec)
				return true
			})
		}
		if len(recs) != 3000 {
			t.Fatalf("%d workers: %d records, want 3000", w, len(recs))
		}
		got = append(got, recs)
	}
	if !maps.Equal(got[0], got[1]) {
		t.Fatal("the records of 1 and 4 workers differ")
	}
}

func TestSynthRefuses(t *testing.T) {
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Synthesize(context.Background(), SynthConfig{DataDir: full, Recipients: 10})
	if !errors.Is(err, ErrDataDirNotEmpty) || !bytes.Contains([]byte(err.Error()), []byte(full+" holds x")) {
		t.Fatalf("synth into a non-empty directory: %v", err)
	}
	if ents, _ := os.ReadDir(full); len(ents) != 1 {
		t.Fatalf("a refused synth left %d entries, want the 1 that was there", len(ents))
	}
	for _, tc := range []struct {
		name string
		cfg  SynthConfig
		want string
	}{
		{"no dir", SynthConfig{Recipients: 1}, "DataDir is empty"},
		{"no recipients", SynthConfig{DataDir: t.TempDir(), Recipients: 0}, "Recipients 0 out of range"},
		{"too many", SynthConfig{DataDir: t.TempDir(), Recipients: MaxSynthRecipients + 1}, "Recipients 2147483649 out of range"},
		{"workers", SynthConfig{DataDir: t.TempDir(), Recipients: 1, Workers: -1}, "Workers -1 out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Synthesize(context.Background(), tc.cfg); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("Synthesize: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// A synth cancelled midway leaves the directory empty, to be run again.
	dir := filepath.Join(t.TempDir(), "d")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Synthesize(ctx, SynthConfig{DataDir: dir, Recipients: 1000}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled synth: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a cancelled synth left %d entries", len(ents))
	}
}
