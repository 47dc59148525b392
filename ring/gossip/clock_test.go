package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestClockMsgRoundTrip(t *testing.T) {
	for _, c := range []clockMsg{
		{kind: msgClockRequest, sent: 1, t1: 1_700_000_000_000_000_000, fromName: "node-a"},
		{kind: msgClockReply, sent: 1 << 40, t1: -5, t2: 1<<63 - 1, fromName: strings.Repeat("n", 255)},
		{kind: msgClockReply},
	} {
		b := c.append(nil)
		got, err := decodeClockMsg(b)
		if err != nil || got != c {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", c, got, err)
		}
		for n := range len(b) {
			if _, err := decodeClockMsg(b[:n]); !errors.Is(err, errBadMessage) {
				t.Fatalf("decode of %d of %d bytes: %v, want errBadMessage", n, len(b), err)
			}
		}
	}
	if _, err := decodeClockMsg(clockMsg{kind: 3}.append(nil)); !errors.Is(err, errBadMessage) {
		t.Fatalf("kind 3: %v", err)
	}
}

func FuzzDecodeClockMsg(f *testing.F) {
	f.Add(clockMsg{kind: msgClockRequest, sent: 7, t1: 9, fromName: "a"}.append(nil))
	f.Add(clockMsg{kind: msgClockReply, sent: 7, t1: 9, t2: 11, fromName: "node-b"}.append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeClockMsg(b)
		if err != nil {
			return
		}
		if enc := c.append(nil); !bytes.Equal(enc, b) {
			t.Fatalf("decode(%x) = %+v, which encodes to %x", b, c, enc)
		}
	})
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{[]time.Duration{0}, 0},
		{[]time.Duration{0, -10, -10}, -10},
		{[]time.Duration{5, 0, 1}, 1},
		{[]time.Duration{0, 10}, 5},
		{[]time.Duration{0, 4, -2, 100}, 2},
	} {
		if got := median(append([]time.Duration(nil), c.in...)); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestJudgeClock judges a member against measured samples: a strict
// majority of the live members beyond the bound (by more than the error)
// makes it skewed, a majority within (by more than the error) brings it
// back, and in between the judgment stays.
func TestJudgeClock(t *testing.T) {
	const bound = 250 * time.Millisecond
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	for _, c := range []struct {
		name    string
		was     bool
		samples map[string]clockSample // by member; the others are live but unmeasured
		live    []string
		want    bool
	}{
		{"two others 10 s behind", false, map[string]clockSample{"b": {offset: ms(-10000), rtt: ms(1)}, "c": {offset: ms(-10000), rtt: ms(1)}}, []string{"b", "c"}, true},
		{"one of two others behind", false, map[string]clockSample{"b": {offset: ms(-10000), rtt: ms(1)}, "c": {offset: 0, rtt: ms(1)}}, []string{"b", "c"}, false},
		{"a cluster of two cannot tell", false, map[string]clockSample{"b": {offset: ms(-10000), rtt: ms(1)}}, []string{"b"}, false},
		{"beyond, but within the error", false, map[string]clockSample{"b": {offset: ms(300), rtt: ms(200)}, "c": {offset: ms(300), rtt: ms(200)}}, []string{"b", "c"}, false},
		{"unmeasured members do not count", false, map[string]clockSample{"b": {offset: ms(-10000), rtt: ms(1)}}, []string{"b", "c"}, false},
		{"back within", true, map[string]clockSample{"b": {offset: ms(10), rtt: ms(1)}, "c": {offset: ms(-10000), rtt: ms(1)}}, []string{"b", "c"}, false},
		{"not surely within: stays skewed", true, map[string]clockSample{"b": {offset: ms(200), rtt: ms(200)}, "c": {offset: ms(200), rtt: ms(200)}}, []string{"b", "c"}, true},
		{"four of five", false, map[string]clockSample{"b": {offset: ms(400), rtt: 0}, "c": {offset: ms(400), rtt: 0}, "d": {offset: ms(400), rtt: 0}, "e": {offset: 0, rtt: 0}}, []string{"b", "c", "d", "e"}, true},
		{"two of four others: no majority", false, map[string]clockSample{"b": {offset: ms(400), rtt: 0}, "c": {offset: ms(400), rtt: 0}, "d": {offset: 0, rtt: 0}, "e": {offset: 0, rtt: 0}}, []string{"b", "c", "d", "e"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &Membership{cfg: Config{NodeName: "a", MaxClockSkew: bound}, log: slog.New(slog.DiscardHandler),
				nodes: map[string]nodeInfo{"a": {}}, clk: clocks{samples: map[string][]clockSample{}}}
			m.closed = true // update returns ErrClosed: nothing to announce to
			for _, name := range c.live {
				m.nodes[name] = nodeInfo{gossipAddr: name}
			}
			now := time.Now()
			for name, s := range c.samples {
				s.at = now
				m.clk.samples[name] = []clockSample{{at: now, offset: ms(99999), rtt: ms(5000)}, s}
			}
			m.clk.state.Skewed = c.was
			m.judgeClock()
			if got := m.Clock(); got.Skewed != c.want || got.Measured != len(c.samples) || got.Others != len(c.live) {
				t.Fatalf("judged %+v, want skewed %v of %d measured, %d others", got, c.want, len(c.samples), len(c.live))
			}
		})
	}
}

// shiftedClock is a wall clock offset from the system's by a settable
// amount, in ns.
type shiftedClock struct{ off atomic.Int64 }

func (c *shiftedClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// TestSkewedMemberLeavesTheRing runs three members on the mock network, one
// of whose clocks jumps 10 s ahead: it judges itself skewed, and every
// member leaves it out of the ring with the reason; once its clock is set
// back, it is back in every ring.
func TestSkewedMemberLeavesTheRing(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c")
	var clk shiftedClock
	cfg := func(name string, seeds ...string) Config {
		c := mockConfig(t, n, name, seeds...)
		c.ClockInterval = 50 * time.Millisecond
		if name == "node-c" {
			c.Now = clk.now
		}
		return c
	}
	seed := n.byName["node-a"].addr
	a := start(t, cfg("node-a"))
	b := start(t, cfg("node-b", seed))
	c := start(t, cfg("node-c", seed))
	all := []*Membership{a, b, c}
	eventually(t, 10*time.Second, "three converge", converged(all, "node-a", "node-b", "node-c"))
	if st := c.MeasureClock(wait5s(t)); st.Skewed || st.Measured != 2 || st.Offset.Abs() > 100*time.Millisecond {
		t.Fatalf("c's clock before the jump: %+v", st)
	}

	clk.off.Store(int64(10 * time.Second))
	eventually(t, 10*time.Second, "c is left out of every ring", func() error {
		if err := converged(all, "node-a", "node-b")(); err != nil {
			return err
		}
		for _, m := range all {
			s, ok := member(m, "node-c")
			if !ok || !s.ClockSkewed || (s.ClockOffset-10*time.Second).Abs() > 100*time.Millisecond || !strings.Contains(s.Excluded, "its clock was") {
				return fmt.Errorf("%s sees node-c as %+v", m.Name(), s)
			}
		}
		return nil
	})
	if st := c.Clock(); !st.Skewed || (st.Offset-10*time.Second).Abs() > 100*time.Millisecond {
		t.Fatalf("c's clock after the jump: %+v", st)
	}
	for _, m := range []*Membership{a, b} {
		if st := m.Clock(); st.Skewed {
			t.Fatalf("%s judged itself skewed: %+v", m.Name(), st)
		}
	}

	clk.off.Store(int64(10 * time.Millisecond))
	eventually(t, 10*time.Second, "c is back in every ring", converged(all, "node-a", "node-b", "node-c"))
}

// TestNoMajorityExcludesNobody: of two members whose clocks differ by 10 s,
// neither can tell which is wrong; both stay in the ring.
func TestNoMajorityExcludesNobody(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b")
	var clk shiftedClock
	clk.off.Store(int64(10 * time.Second))
	ca := mockConfig(t, n, "node-a")
	ca.ClockInterval = 50 * time.Millisecond
	cb := mockConfig(t, n, "node-b", n.byName["node-a"].addr)
	cb.ClockInterval, cb.Now = 50*time.Millisecond, clk.now
	a, b := start(t, ca), start(t, cb)
	eventually(t, 10*time.Second, "a and b converge", converged([]*Membership{a, b}, "node-a", "node-b"))
	for _, m := range []*Membership{a, b} {
		if st := m.MeasureClock(wait5s(t)); st.Skewed || st.Measured != 1 || st.Offset.Abs() < 4*time.Second {
			t.Fatalf("%s: %+v, want measured, 5 s from the median, not skewed", m.Name(), st)
		}
	}
}
