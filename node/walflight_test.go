package node

import (
	"context"
	"testing"
	"testing/synctest"
)

// TestWALFlightBarrier: a barrier returns once every call that entered
// before it has left, whatever entered after; one whose caller gave up
// leaves no call of before the next barrier unwaited for.
func TestWALFlightBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var f walFlight
		wait := func(ctx context.Context) <-chan error {
			done := make(chan error, 1)
			go func() { done <- f.wait(ctx) }()
			synctest.Wait()
			return done
		}
		returned := func(done <-chan error) bool {
			synctest.Wait()
			select {
			case <-done:
				return true
			default:
				return false
			}
		}
		if err := <-wait(context.Background()); err != nil {
			t.Fatalf("barrier with no call in flight: %v", err)
		}
		a := f.enter()
		done := wait(context.Background())
		b := f.enter() // after the barrier began
		if returned(done) {
			t.Fatal("barrier returned while a call of before it is in flight")
		}
		f.leave(a)
		if !returned(done) {
			t.Fatal("barrier still waits once the calls of before it left")
		}
		f.leave(b)

		// A barrier given up leaves its slot filled.
		a = f.enter()
		ctx, cancel := context.WithCancel(context.Background())
		done = wait(ctx)
		cancel()
		if err := <-done; err == nil {
			t.Fatal("cancelled barrier returned nil")
		}
		c := f.enter()
		done = wait(context.Background())
		f.leave(c)
		if returned(done) {
			t.Fatal("barrier returned while a call of before the given-up barrier is in flight")
		}
		f.leave(a)
		if !returned(done) {
			t.Fatal("barrier still waits once every call left")
		}
	})
}
