package node

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// peekDomain peeks at every test recipient in domain d, content 0.
func peekDomain(t *testing.T, n *Node, d string) []uint32 {
	t.Helper()
	resp, err := n.Check(context.Background(), &pb.CheckRequest{
		Recipients: testRecipients, Domains: []string{d}, ContentHashes: []uint64{0},
		Modes: []pb.Mode{pb.Mode_MODE_PEEK},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Used
}

// TestRemovedDomainRefusesToStart is issue 12 case 4: a restart whose rules
// lack a domain with history (in the snapshot and in the WAL) refuses to
// start, naming the domain and its counts and changing nothing, so that the
// domain's history is all there when it returns. Told to drop it, the node
// starts, logs a WARN with the counts, and the drop is durable: a later
// restart without the flag starts, and the domain comes back empty.
func TestRemovedDomainRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	clk := &testClock{}
	clk.set(t0)
	full := durableConfig(t, dir, clk)
	lacking := full
	rs, err := rules.Parse("lacking", []byte(durableRules[:strings.Index(durableRules, "  - name: fast")]))
	if err != nil {
		t.Fatal(err)
	}
	lacking.Rules = rs

	a := openNode(t, full)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 60 {
		if _, err := a.Check(context.Background(), randomBatch(rng)); err != nil {
			t.Fatal(err)
		}
		if i == 30 {
			if err := a.snapshot(); err != nil { // "fast" records in the snapshot, later sends in the WAL
				t.Fatal(err)
			}
		}
	}
	wantDefault, wantFast := peekDomain(t, a, "default"), peekDomain(t, a, "fast")
	if !slices.ContainsFunc(wantFast, func(u uint32) bool { return u > 0 }) {
		t.Fatal("no send recorded in domain fast")
	}
	crash(t, a)
	before := dirState(t, dir)

	b, err := New(lacking)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Open(context.Background())
	if !errors.Is(err, ErrRemovedDomains) || !strings.Contains(err.Error(), `domain "fast" (`) ||
		!strings.Contains(err.Error(), "WAL sends") || !strings.Contains(err.Error(), "--drop-removed-domains") {
		t.Fatalf("Open with rules lacking fast: %v, want ErrRemovedDomains naming fast and its counts", err)
	}
	b.Close()
	after := dirState(t, dir)
	for path, content := range before {
		if after[path] != content {
			t.Errorf("%s changed by the refused start", path)
		}
	}
	if len(after) != len(before) {
		t.Errorf("the refused start left %d files, was %d", len(after), len(before))
	}

	// The domain returns with its whole history.
	c := openNode(t, full)
	if got := peekDomain(t, c, "fast"); !slices.Equal(got, wantFast) {
		t.Fatalf("fast after the refused start: %v, want %v", got, wantFast)
	}
	crash(t, c)

	// Told to drop it: a WARN with the counts, and the drop lasts.
	var logs syncBuffer
	drop := lacking
	drop.DropRemovedDomains = true
	drop.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	d := openNode(t, drop)
	if r := d.Recovery(); r.UnknownRecords == 0 || r.UnknownDomain == 0 {
		t.Fatalf("recovery dropped %d records and %d sends, want some of each", r.UnknownRecords, r.UnknownDomain)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="dropping for good the history of domains the rules lack`) ||
		!strings.Contains(logs.String(), `domain \"fast\"`) {
		t.Fatalf("no WARN naming fast in\n%s", logs.String())
	}
	if got := peekDomain(t, d, "default"); !slices.Equal(got, wantDefault) {
		t.Fatalf("default after the drop: %v, want %v", got, wantDefault)
	}
	crash(t, d) // no final snapshot: the drop must already be durable
	e := openNode(t, lacking)
	crash(t, e)
	f := openNode(t, full)
	defer f.Close()
	if got := peekDomain(t, f, "fast"); slices.ContainsFunc(got, func(u uint32) bool { return u > 0 }) {
		t.Fatalf("fast after the drop: %v, want nothing", got)
	}
	if got := peekDomain(t, f, "default"); !slices.Equal(got, wantDefault) {
		t.Fatalf("default at the end: %v, want %v", got, wantDefault)
	}
}
