package nodetest

import (
	"context"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// TestFaults: on a cluster with Config.Faults, an isolated member and a
// frozen one drop out of the others' rings and come back when healed and
// thawed; a check sent to a frozen member is answered once it thaws.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	c, err := Start(ctx, Config{Faults: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ms := c.Members()
	if err := c.Isolate(ms[2]); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConvergedOn(ctx, ms[:2], 2); err != nil {
		t.Fatalf("isolated: %v", err)
	}
	c.Heal()
	if err := c.WaitConverged(ctx, 3); err != nil {
		t.Fatalf("healed: %v", err)
	}
	c.Freeze(ms[0])
	if err := c.WaitConvergedOn(ctx, ms[1:], 2); err != nil {
		t.Fatalf("frozen: %v", err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := c.Check(ctx, ms[0], &pb.CheckRequest{Recipients: []string{"+8613800000000"}})
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a frozen member answered: %v", err)
	default:
	}
	c.Thaw(ms[0])
	if err := <-answered; err != nil {
		t.Fatalf("the check held while frozen: %v", err)
	}
	if err := c.WaitConverged(ctx, 3); err != nil {
		t.Fatalf("thawed: %v", err)
	}
}
