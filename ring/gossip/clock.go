package gossip

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Clock skew. A member's decisions use its own wall clock, so a member whose
// clock is far from the others' would judge every window of a partition it
// takes over too long or too short. Each member measures its clock against
// every other live member's, NTP-style, over gossip's own packets, and
// judges itself: when its clock is more than MaxClockSkew from a strict
// majority of the live members' (itself counted as agreeing with itself),
// it publishes the skewed flag in its metadata, and every member, itself
// included, leaves it out of the ring (MemberState.Excluded says why) until
// it is back within the bound. Its partitions move as a disagreeing
// member's do. A cluster of two cannot tell which clock is wrong: it logs
// the difference and excludes neither.
//
// A measurement is a request stamped with the asker's clock (t1) and a
// reply stamped with the answerer's (t2); the round trip (rtt) is timed on
// the asker's monotonic clock. The offset of the answerer's clock is
// t2 - t1 - rtt/2, wrong by at most rtt/2 whatever the delays of each leg.
// Of the last clockSamples measurements of a member that are younger than
// clockSampleTTL, the one with the shortest round trip counts. A member is
// judged beyond the bound only when its offset is beyond it by more than
// that error, and within only when within it by more: in between, the
// judgment stays as it was, so a noisy round trip does not flip it.

// Defaults and bounds of the clock measurement.
const (
	DefaultMaxClockSkew  = 250 * time.Millisecond
	DefaultClockInterval = time.Second
	// clockSamples is how many measurements of each member are kept: few
	// enough that a clock stepped back into the bound is seen in as many
	// intervals.
	clockSamples = 4
	// clockSampleTTL is how long a measurement counts.
	clockSampleTTL = 30 * time.Second
	// maxClockRTT is the longest round trip a measurement is kept from.
	maxClockRTT = 10 * time.Second
)

// Kinds of message, the first byte of a memberlist user message.
const (
	msgClockRequest = 1 // clockMsg
	msgClockReply   = 2 // clockMsg
	msgDown         = 3 // downMsg (down.go)
)

// clockMsg is a clock request or reply, little-endian:
//
//	| kind u8 | sent u64 | t1 u64 | t2 u64 | u8 len | name |
//
// sent is the asker's monotonic time in ns since its Start, echoed in the
// reply; t1 is the asker's wall clock and t2 the answerer's (0 in a
// request), unix ns; name is the sender's member name.
type clockMsg struct {
	kind     byte
	sent     int64
	t1, t2   int64
	fromName string
}

// clockMsgHead is the fixed part of a clockMsg.
const clockMsgHead = 1 + 8 + 8 + 8 + 1

// errBadMessage is returned (wrapped) for a user message that does not decode.
var errBadMessage = errors.New("gossip: bad message")

func (c clockMsg) append(dst []byte) []byte {
	dst = append(dst, c.kind)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(c.sent))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(c.t1))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(c.t2))
	dst = append(dst, byte(len(c.fromName)))
	return append(dst, c.fromName...)
}

func decodeClockMsg(b []byte) (clockMsg, error) {
	if len(b) < clockMsgHead {
		return clockMsg{}, fmt.Errorf("%w: %d bytes, want at least %d", errBadMessage, len(b), clockMsgHead)
	}
	c := clockMsg{kind: b[0], sent: int64(binary.LittleEndian.Uint64(b[1:])),
		t1: int64(binary.LittleEndian.Uint64(b[9:])), t2: int64(binary.LittleEndian.Uint64(b[17:]))}
	if c.kind != msgClockRequest && c.kind != msgClockReply {
		return clockMsg{}, fmt.Errorf("%w: kind %d", errBadMessage, c.kind)
	}
	if n := int(b[25]); n != len(b)-clockMsgHead {
		return clockMsg{}, fmt.Errorf("%w: name of %d bytes, %d left", errBadMessage, n, len(b)-clockMsgHead)
	}
	c.fromName = string(b[clockMsgHead:])
	return c, nil
}

// clockSample is one measurement of a member's clock.
type clockSample struct {
	at     time.Time     // when it was taken (monotonic)
	offset time.Duration // the member's clock minus this one's
	rtt    time.Duration // the round trip, which bounds the error at rtt/2
}

// ClockState is a member's clock as measured against the live members.
type ClockState struct {
	// Offset is this member's clock minus the median of the live members'
	// clocks measured (its own counted), as of the last judgment.
	Offset time.Duration
	// Skewed is true while this member's clock is beyond MaxClockSkew of a
	// strict majority of the live members': it is out of every ring.
	Skewed bool
	// Measured counts the other live members with a measurement younger
	// than 30 s; Others counts the other live members.
	Measured, Others int
}

// clocks holds a Membership's clock measurements.
type clocks struct {
	mu      sync.Mutex
	samples map[string][]clockSample // per member, oldest first, at most clockSamples
	state   ClockState
	// lastWarn is when a difference no majority judges was last logged.
	lastWarn time.Time
	// judgeMu serializes judgeClock, so that judgments publish in order.
	judgeMu sync.Mutex
	// replies carries requests to answer from NotifyMsg (which must not
	// block memberlist's packet reader) to clockLoop; full, it drops.
	replies chan clockMsg
	// measured is signalled (capacity 1) when a measurement is stored.
	measured chan struct{}
}

// now is the member's wall clock in unix ns (Config.Now).
func (m *Membership) now() int64 { return m.cfg.Now().UnixNano() }

// mono is the time since Start on the monotonic clock, in ns.
func (m *Membership) mono() int64 { return int64(time.Since(m.started)) }

// clockLoop measures the clocks of the live members every ClockInterval
// and judges this member's, and answers the requests NotifyMsg queued. It
// runs from Start until Close.
func (m *Membership) clockLoop() {
	t := time.NewTicker(m.cfg.ClockInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case req := <-m.clk.replies:
			m.answerClock(req)
		case <-t.C:
			m.judgeClock()
			m.askClocks()
		}
	}
}

// askClocks sends a clock request to every other live member.
func (m *Membership) askClocks() {
	req := clockMsg{kind: msgClockRequest, sent: m.mono(), t1: m.now(), fromName: m.cfg.NodeName}.append(nil)
	for name, addr := range m.otherAddrs() {
		if err := m.sendTo(name, addr, req); err != nil {
			m.log.Debug("gossip: clock request", "member", name, "err", err)
		}
	}
}

// answerClock replies to a clock request with this member's clock.
func (m *Membership) answerClock(req clockMsg) {
	addr, ok := m.liveAddr(req.fromName)
	if !ok {
		return // not a live member (yet)
	}
	rep := clockMsg{kind: msgClockReply, sent: req.sent, t1: req.t1, t2: m.now(), fromName: m.cfg.NodeName}
	if err := m.sendTo(req.fromName, addr, rep.append(nil)); err != nil {
		m.log.Debug("gossip: clock reply", "member", req.fromName, "err", err)
	}
}

// sendTo sends a user message to a member, unless the Membership is closed.
func (m *Membership) sendTo(name, addr string, msg []byte) error {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return m.ml.SendToAddress(memberlist.Address{Addr: addr, Name: name}, msg)
}

// liveAddr returns the gossip address of live member name, unless it is
// marked down.
func (m *Membership) liveAddr(name string) (string, bool) {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	n, ok := m.nodes[name]
	if _, down := m.down[name]; down {
		return "", false
	}
	return n.gossipAddr, ok
}

// otherAddrs returns the gossip address of every other live member not
// marked down, by name.
func (m *Membership) otherAddrs() map[string]string {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	out := make(map[string]string, len(m.nodes))
	for name, n := range m.nodes {
		if _, down := m.down[name]; !down && name != m.cfg.NodeName {
			out[name] = n.gossipAddr
		}
	}
	return out
}

// clockMessage handles a clock message from NotifyMsg: a request is queued
// for clockLoop to answer, a reply is stored as a measurement.
func (m *Membership) clockMessage(b []byte) {
	c, err := decodeClockMsg(b)
	if err != nil {
		m.log.Debug("gossip: clock message dropped", "err", err)
		return
	}
	if c.kind == msgClockRequest {
		select {
		case m.clk.replies <- c:
		default: // a burst of requests: the asker measures again later
		}
		return
	}
	rtt := time.Duration(m.mono() - c.sent)
	if rtt < 0 || rtt > maxClockRTT || c.fromName == m.cfg.NodeName {
		return // not an answer to a request of this run
	}
	s := clockSample{at: time.Now(), offset: time.Duration(c.t2-c.t1) - rtt/2, rtt: rtt}
	m.clk.mu.Lock()
	ss := append(m.clk.samples[c.fromName], s)
	if len(ss) > clockSamples {
		ss = slices.Delete(ss, 0, len(ss)-clockSamples)
	}
	m.clk.samples[c.fromName] = ss
	m.clk.mu.Unlock()
	select {
	case m.clk.measured <- struct{}{}:
	default:
	}
}

// best returns the measurement of ss younger than clockSampleTTL at now
// with the shortest round trip.
func best(ss []clockSample, now time.Time) (clockSample, bool) {
	var b clockSample
	ok := false
	for _, s := range ss {
		if now.Sub(s.at) < clockSampleTTL && (!ok || s.rtt < b.rtt) {
			b, ok = s, true
		}
	}
	return b, ok
}

// clockTally is the live members' measured clocks judged against the
// bound: each one beyond it, or within it, by more than its error.
type clockTally struct {
	offsets        []time.Duration // this member's (0) and each measured member's
	beyond, within int
	far            []string // the members beyond, with their offsets, for the log
}

// tallyClocks tallies the best measurement younger than clockSampleTTL at
// now of each member of others.
func tallyClocks(samples map[string][]clockSample, others map[string]string, now time.Time, bound time.Duration) clockTally {
	t := clockTally{offsets: []time.Duration{0}}
	for name := range others {
		s, ok := best(samples[name], now)
		if !ok {
			continue
		}
		t.offsets = append(t.offsets, s.offset)
		d := s.offset.Abs()
		switch {
		case d-s.rtt/2 > bound:
			t.beyond++
			t.far = append(t.far, fmt.Sprintf("%s %+v", name, s.offset.Round(time.Millisecond)))
		case d+s.rtt/2 <= bound:
			t.within++
		}
	}
	return t
}

// skewed judges a member that was skewed (or not) among n live members,
// itself counted: skewed once a strict majority is surely beyond the
// bound, back once a strict majority, itself counted, is surely within.
func (t clockTally) skewed(was bool, n int) bool {
	switch {
	case !was && 2*t.beyond > n:
		return true
	case was && 2*(t.within+1) > n:
		return false
	}
	return was
}

// undecided reports whether some member is beyond the bound while no
// majority says either way (a cluster of two, an even split).
func (t clockTally) undecided(n int) bool {
	return t.beyond > 0 && 2*t.beyond <= n && 2*(t.within+1) <= n
}

// judgeClock judges this member's clock against the live members' and,
// when the judgment changes, logs it and publishes it (the skewed flag).
func (m *Membership) judgeClock() {
	m.clk.judgeMu.Lock()
	defer m.clk.judgeMu.Unlock()
	others := m.otherAddrs()
	now := time.Now()
	bound := m.cfg.MaxClockSkew
	n := len(others) + 1 // the live members, this one counted
	m.clk.mu.Lock()
	for name := range m.clk.samples {
		if _, live := others[name]; !live {
			delete(m.clk.samples, name)
		}
	}
	t := tallyClocks(m.clk.samples, others, now, bound)
	prev := m.clk.state
	cur := ClockState{Offset: -median(t.offsets), Skewed: prev.Skewed, Measured: len(t.offsets) - 1, Others: len(others)}
	if bound >= 0 {
		cur.Skewed = t.skewed(prev.Skewed, n)
	}
	m.clk.state = cur
	warn := bound >= 0 && t.undecided(n) && now.Sub(m.clk.lastWarn) >= time.Minute // at most once a minute
	if warn {
		m.clk.lastWarn = now
	}
	m.clk.mu.Unlock()
	if warn {
		m.log.Warn("gossip: clocks differ beyond the max clock skew, but no majority of members says this one is wrong: check every member's time sync",
			"beyond", t.far, "max_clock_skew", bound, "members", n)
	}
	if cur.Skewed != prev.Skewed {
		m.announceClock(cur, t.far, n)
	}
}

// announceClock logs a changed judgment of this member's clock and
// publishes it in the metadata.
func (m *Membership) announceClock(cur ClockState, far []string, n int) {
	if cur.Skewed {
		m.log.Error("gossip: this node's clock is beyond the max clock skew of most members': it owns nothing until its time sync brings it back",
			"offset", cur.Offset.Round(time.Millisecond), "max_clock_skew", m.cfg.MaxClockSkew, "beyond", far, "members", n)
	} else {
		m.log.Warn("gossip: this node's clock is back within the max clock skew: it rejoins the ring", "offset", cur.Offset.Round(time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultWait)
	defer cancel()
	if err := m.update(ctx, "clock", func(md *meta) {
		md.Skewed, md.Offset = cur.Skewed, cur.Offset.Round(time.Millisecond)
	}); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrLeft) {
		m.log.Warn("gossip: announcing the clock judgment: no peer confirmed it yet; gossip spreads it later", "err", err)
	}
}

// median returns the median of ds (the mean of the two middle ones for an
// even count); ds is sorted in place.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	h := len(ds) / 2
	if len(ds)%2 == 1 {
		return ds[h]
	}
	return ds[h-1] + (ds[h]-ds[h-1])/2
}

// Clock returns this member's clock as last judged. Safe for concurrent use.
func (m *Membership) Clock() ClockState {
	m.clk.mu.Lock()
	defer m.clk.mu.Unlock()
	return m.clk.state
}

// MeasureClock measures the clock of every other live member now, waits
// until each has answered or ctx ends, and judges this member's clock; it
// returns the judgment. A node calls it before it announces serving, so
// that a node whose clock is off never enters a ring. ctx ending is not an
// error: the judgment uses the measurements it has.
func (m *Membership) MeasureClock(ctx context.Context) ClockState {
	m.askClocks()
	for {
		others := m.otherAddrs()
		now := time.Now()
		m.clk.mu.Lock()
		missing := 0
		for name := range others {
			if _, ok := best(m.clk.samples[name], now); !ok {
				missing++
			}
		}
		m.clk.mu.Unlock()
		if missing == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-m.clk.measured:
			continue
		case <-time.After(m.cfg.ClockInterval):
			m.askClocks() // a request or its reply was lost
			continue
		}
		break
	}
	m.judgeClock()
	return m.Clock()
}
