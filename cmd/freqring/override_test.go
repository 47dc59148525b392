package main

import (
	"context"
	"strings"
	"testing"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// TestOverrideCommand: "override set" reaches every member of a two-node
// cluster and the override decides checks on both; "list" shows it agreed,
// then the member that lacks it after a local delete; a malformed override
// is refused by every member and changes nothing; "delete" lifts it.
func TestOverrideCommand(t *testing.T) {
	ctx := context.Background()
	tokens := writeTokenFile(t)
	operator, err := loadTokenFile(tokens)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := nodetest.Start(ctx, nodetest.Config{Size: 2, Rules: rules.Default(), Node: func(cfg *node.Config) { cfg.AdminTokens = operator }})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	addr := lc.Addrs()[0]
	// Without the operator's token, every member refuses.
	code, out, errOut := runCmd(ctx, "override", "set", "--addr", addr, "--prefixes", "+1555", "--limit", "recipient-1m=1", "vip")
	if code == 0 || strings.Count(out, "Unauthenticated") != 2 || !strings.Contains(out, "--admin-token-file") {
		t.Fatalf("set without a token: exit %d\n%s%s", code, out, errOut)
	}
	runCmd := func(ctx context.Context, args ...string) (int, string, string) {
		return runCmd(ctx, append(args, "--token-file", tokens)...)
	}
	code, out, errOut = runCmd(ctx, "override", "set", "--addr", addr, "--prefixes", "+1555", "--limit", "recipient-1m=1", "vip")
	if code != 0 || strings.Count(out, `set "vip", version `) != 2 {
		t.Fatalf("set: exit %d\n%s%s", code, out, errOut)
	}
	for _, m := range lc.Members() {
		resp, err := m.Node.Check(ctx, &pb.CheckRequest{Recipients: []string{"+15550001", "+15550001"}, Modes: []pb.Mode{pb.Mode_MODE_PEEK}, Costs: []uint32{1, 2}})
		if err != nil || !resp.Admitted[0] || resp.Admitted[1] {
			t.Fatalf("%s: %v admitted %v, want the override's limit 1", m.Name, err, resp.GetAdmitted())
		}
	}
	code, out, _ = runCmd(ctx, "override", "list", "--addr", addr)
	if code != 0 || !strings.Contains(out, "vip") || !strings.Contains(out, "recipient-1m=1") || !strings.Contains(out, "all agree") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	code, out, _ = runCmd(ctx, "override", "set", "--addr", addr, "--prefixes", "+1555", "--limit", "recipient-2m=1", "bad")
	if code == 0 || strings.Count(out, `override "bad": limits: unknown rule "recipient-2m"`) != 2 {
		t.Fatalf("malformed set: exit %d\n%s", code, out)
	}
	// One member loses it: list says which.
	m1 := lc.Members()[1]
	if _, err := m1.Node.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCmd(ctx, "override", "list", "--addr", addr)
	if code != 0 || !strings.Contains(out, "DISAGREE: missing on "+m1.Name) || strings.Contains(out, `"bad"`) {
		t.Fatalf("list after a local delete: exit %d\n%s", code, out)
	}
	code, out, _ = runCmd(ctx, "override", "delete", "--addr", addr, "vip")
	if code != 0 || !strings.Contains(out, `lifted "vip"`) || !strings.Contains(out, `no admin override "vip"`) {
		t.Fatalf("delete: exit %d\n%s", code, out)
	}
	for _, m := range lc.Members() {
		if l, _ := m.Node.ListOverrides(ctx, nil); len(l.Overrides) != 0 {
			t.Fatalf("%s still has %v", m.Name, l.Overrides)
		}
	}
}

// TestLimitFlagNamesExactNumbers: --limit refuses a limit above any rule's
// bound, even one past 2^32 or 2^64, with the number as given and the
// bounds; the node names the rule's own bound for the rest, exactly.
func TestLimitFlagNamesExactNumbers(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"r=10000001", `limit 10000001 of rule "r" out of range [1, 10000000] (the most a counting rule takes; a sliding-log rule takes up to 1000)`},
		{"r=5000000000", `limit 5000000000 of rule "r" out of range [1, 10000000]`},
		{"r=99999999999999999999999", `limit 99999999999999999999999 of rule "r" out of range [1, 10000000]`},
		{"r=1.5", `limit "1.5" of rule "r" is not a whole number`},
		{"r=-1", `limit "-1" of rule "r" is not a whole number`},
	} {
		err := limitFlags{}.Set(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--limit %s: %v, want %q", tc.in, err, tc.want)
		}
	}
	l := limitFlags{}
	if err := l.Set("r=3000000"); err != nil || l["r"] != 3_000_000 {
		t.Fatalf("--limit r=3000000: %v %v", err, l)
	}
}
