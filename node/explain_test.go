package node_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

// TestExplainFromAnyNode sends one content three times to a recipient of
// a three-node cluster (the third is denied by content-59s) and explains
// it through every node, in process and over gRPC: each answer is the
// owner's, the same, and lists exactly the two admitted sends at the times
// their checks were decided.
func TestExplainFromAnyNode(t *testing.T) {
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitSettled(t, c)
	const rcp = "+8613800000001"
	content := []byte("your code is 1234")
	entry := c.Members()[0].Node
	var admitted []int64
	for i := range 3 {
		resp, err := entry.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Contents: [][]byte{content}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("check %d: %v %v", i, resp, err)
		}
		if resp.Admitted[0] != (i < 2) {
			t.Fatalf("check %d: admitted %v", i, resp.Admitted[0])
		}
		if resp.Admitted[0] {
			admitted = append(admitted, resp.DecidedAtMs[0])
		}
	}
	owner := entry.Ring().OwnerString(rcp).Name
	req := &pb.ExplainRequest{Recipient: rcp, Content: content}
	var first *pb.ExplainResponse
	for _, m := range c.Members() {
		conn, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		viaGRPC, err := pb.NewLimiterClient(conn).Explain(context.Background(), req)
		if err != nil {
			t.Fatalf("%s over gRPC: %v", m.Name, err)
		}
		inProcess, err := m.Node.Explain(context.Background(), req)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		for _, got := range []*pb.ExplainResponse{viaGRPC, inProcess} {
			got.NowMs = 0 // the owner's clock moves between calls, and the retries with it
			for _, r := range got.Rules {
				if r.RetryAfterMs > 0 {
					r.RetryAfterMs = 1
				}
			}
			if got.Node != owner {
				t.Fatalf("%s: answered by %s, want the owner %s", m.Name, got.Node, owner)
			}
			if first == nil {
				first = got
			}
			if !proto.Equal(got, first) {
				t.Fatalf("%s: %v\nwant %v", m.Name, got, first)
			}
		}
	}
	if first.Admitted || first.DeniedBy != "content-59s" || first.NextAdmittedMs != admitted[0]+59_000 {
		t.Fatalf("admitted %v denied by %q next at %d; want denied by content-59s, next at %d", first.Admitted, first.DeniedBy, first.NextAdmittedMs, admitted[0]+59_000)
	}
	fp := window.ContentFingerprint(node.ContentHash(content))
	for _, r := range first.Rules {
		if r.Algorithm != "sliding-log" || !r.Judged || int(r.Used) != len(admitted) {
			t.Fatalf("rule %v: want a judged sliding-log rule using %d", r, len(admitted))
		}
		for i, s := range r.Sends {
			wantFP := fp
			if r.Scope == "recipient" {
				wantFP = 0
			}
			if s.AtMs != admitted[i] || s.ContentFingerprint != wantFP {
				t.Fatalf("rule %s send %d: %v, want at %d fingerprint %d", r.Name, i, s, admitted[i], wantFP)
			}
		}
		if len(r.Sends) != len(admitted) {
			t.Fatalf("rule %s: %d sends, want %d", r.Name, len(r.Sends), len(admitted))
		}
	}
	if c.Members()[0].Node.Stats().Explains == 0 {
		t.Fatal("explains not counted")
	}
}

// TestExplainBadRequest: a bad request names the ExplainRequest's field
// and its value.
func TestExplainBadRequest(t *testing.T) {
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 1, InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := c.Members()[0].Node
	for _, tc := range []struct {
		req  *pb.ExplainRequest
		want string
	}{
		{&pb.ExplainRequest{}, "recipient: empty recipient"},
		{&pb.ExplainRequest{Recipient: "+1", Domain: "nope"}, `domain: unknown domain "nope"`},
		{&pb.ExplainRequest{Recipient: "+1", Cost: 5000}, "cost: cost 5000 out of range"},
	} {
		_, err := n.Explain(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Explain(%v) = %v, want INVALID_ARGUMENT %q", tc.req, err, tc.want)
		}
	}
}

// TestExplainStateAndOverride: a counting rule's state and a recipient's
// override reach Explain's answer: a GCRA rule's theoretical arrival time
// moves on by its emission interval per send, and an exempt recipient is
// named with its override, admitted whatever its rules count.
func TestExplainStateAndOverride(t *testing.T) {
	rs, err := rules.Parse("t", []byte(`domains:
- name: api
  rules:
  - {name: burst, algorithm: gcra, limit: 60, window: 1m, capacity: 2}
overrides:
- {name: ops, domain: api, recipients: ["ops"], exempt: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 1, InMemory: true, Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := c.Members()[0].Node
	for _, rcp := range []string{"app", "app", "ops", "ops", "ops"} {
		if _, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{rcp}, Domains: []string{"api"}}); err != nil {
			t.Fatal(err)
		}
	}
	app, err := n.Explain(context.Background(), &pb.ExplainRequest{Recipient: "app", Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	st := map[string]float64{}
	for _, v := range app.Rules[0].State {
		st[v.Name] = v.Value
	}
	// Two sends a second apart at most: the TAT is 2 s (two emission
	// intervals) ahead of the first, so at least 1 s ahead of now.
	if ahead := int64(st["tat_unix_ms"]) - app.NowMs; st["burst"] != 2 || st["emission_interval_ms"] != 1000 || ahead < 1000 || ahead > 2000 {
		t.Fatalf("state %v at %d (TAT %d ms ahead): want burst 2, emission interval 1000 ms, TAT 1-2 s ahead", st, app.NowMs, ahead)
	}
	if app.Admitted || app.DeniedBy != "burst" || app.Override != "" {
		t.Fatalf("app: %v, want denied by burst (its 2 sends fill the burst)", app)
	}
	ops, err := n.Explain(context.Background(), &pb.ExplainRequest{Recipient: "ops", Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if !ops.Admitted || ops.Override != "ops" || !ops.Exempt || ops.Rules[0].Used != 2 {
		t.Fatalf("ops: %v, want admitted, exempt under override ops, its burst full", ops)
	}
}
