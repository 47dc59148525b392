package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/rules"
)

// skewRules has a content rule of seconds, so that a clock 15 s ahead
// forgets sends that still count.
const skewRules = `domains:
  - name: default
    rules:
      - {name: c-2-20s, scope: recipient+content, limit: 2, window: 20s}
`

// TestSkewedNodeOwnsNothing skews one node's clock 15 s ahead, beyond the
// 250 ms bound: it leaves every ring (its partitions move to the others),
// so that a third identical message 6 s after the first two is denied for
// every recipient, as the cluster's clocks see it; a node that kept
// deciding on its clock would see the first two 21 s old and admit it for
// the recipients it owns. Checks through the skewed node are
// still answered (forwarded). Once its clock is back, it rejoins the ring.
func TestSkewedNodeOwnsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	rs, err := rules.Parse("skew", []byte(skewRules))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := nodetest.Start(ctx, nodetest.Config{Size: 3, Rules: rs, Faults: true,
		Node: func(cfg *node.Config) { cfg.SweepInterval = -1 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ms := c.Members()
	skewed := ms[2]
	var recipients []string
	for i := range 60 {
		recipients = append(recipients, fmt.Sprintf("+86139%08d", i))
	}
	check := func(via *nodetest.Member, rcp string) bool {
		t.Helper()
		resp, err := c.Check(ctx, via, &pb.CheckRequest{Recipients: []string{rcp}, ContentHashes: []uint64{7}})
		if err != nil || len(resp.Errors) > 0 {
			t.Fatalf("%s via %s: %v %v", rcp, via.Name, err, resp.GetErrors())
		}
		return resp.Admitted[0]
	}
	owned := 0
	for i, rcp := range recipients {
		for range 2 {
			if !check(ms[i%2], rcp) {
				t.Fatalf("%s: denied before the limit", rcp)
			}
		}
		if skewed.Node.Ring().OwnerString(rcp).Name == skewed.Name {
			owned++
		}
	}
	if owned == 0 {
		t.Fatalf("%s owns none of the %d recipients: the test proves nothing", skewed.Name, len(recipients))
	}
	first := time.Now()

	c.SkewClock(skewed, 15*time.Second)
	if err := c.WaitConvergedOn(ctx, ms, 2); err != nil {
		t.Fatalf("after the skew: %v", err)
	}
	if err := c.WaitSettled(ctx); err != nil {
		t.Fatal(err)
	}
	st := skewed.Node.Stats()
	if !st.Clock.Skewed || st.Clock.Offset < 14*time.Second || st.Ring.Owned != 0 {
		t.Fatalf("the skewed node's clock %+v, owning %d partitions", st.Clock, st.Ring.Owned)
	}
	for _, m := range ms[:2] {
		if st := m.Node.Stats(); st.Clock.Skewed {
			t.Fatalf("%s judged itself skewed: %+v", m.Name, st.Clock)
		}
	}
	if d := time.Since(first); d > 5*time.Second {
		t.Logf("the cluster took %v to leave the skewed node out: it could have decided with its clock meanwhile", d)
	}
	time.Sleep(time.Until(first.Add(6 * time.Second)))
	for i, rcp := range recipients {
		via := ms[i%3] // the skewed node too: it forwards
		if check(via, rcp) {
			t.Errorf("%s via %s: a third identical message admitted %v after the first two (owner under the skewed node's ring: %s)",
				rcp, via.Name, time.Since(first).Round(time.Millisecond), skewed.Node.Ring().OwnerString(rcp).Name)
		}
	}
	if time.Since(first) >= 20*time.Second {
		t.Fatalf("the checks took until %v after the first sends: past the window, they prove nothing", time.Since(first))
	}

	c.SkewClock(skewed, 0)
	if err := c.WaitConvergedOn(ctx, ms, 3); err != nil {
		t.Fatalf("after the clock came back: %v", err)
	}
	if st := skewed.Node.Stats(); st.Clock.Skewed {
		t.Fatalf("still skewed: %+v", st.Clock)
	}
}
