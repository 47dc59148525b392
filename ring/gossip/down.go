package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Fast failover. memberlist declares a crashed member dead after a failed
// probe and a suspicion timeout: about 3 s with the defaults. A process
// that was killed leaves better evidence at once: the kernel resets its
// connections and its gRPC port refuses new ones. A node whose call to a
// member fails asks Suspect to look: if the member's gRPC address refuses a
// connection (Config.Refuses), nothing listens there, so the member's
// process is gone (a frozen or slow process still accepts; a restarted one
// has a new boot id). The member is then marked down: left out of the ring,
// of Members and counted in Departed and Departures, as if memberlist had
// declared it dead. The claim goes to every other live member, and each
// one looks for itself before it marks the member down too, so a claim
// that is false where it arrives changes nothing there. A mark ends when
// memberlist declares the member dead (it is then a departure as any
// other) or sees it again under a new boot id (it restarted).

// defaultRefusesTimeout bounds the dial of the default Refuses.
const defaultRefusesTimeout = 250 * time.Millisecond

// suspectInterval is the shortest time between two looks at one member.
const suspectInterval = 100 * time.Millisecond

// refusesTCP reports whether a TCP connection to addr is refused: nothing
// listens there. A timeout or any other error is not a refusal.
func refusesTCP(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, defaultRefusesTimeout)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// downMsg is the claim that a member is down, a memberlist user message,
// little-endian:
//
//	| kind u8 = 3 | boot u64 | u8 len | name |
//
// boot is the member's boot id the claim is about.
type downMsg struct {
	boot uint64
	name string
}

const downMsgHead = 1 + 8 + 1

func (d downMsg) append(dst []byte) []byte {
	dst = append(dst, msgDown)
	dst = binary.LittleEndian.AppendUint64(dst, d.boot)
	dst = append(dst, byte(len(d.name)))
	return append(dst, d.name...)
}

func decodeDownMsg(b []byte) (downMsg, error) {
	if len(b) < downMsgHead || b[0] != msgDown {
		return downMsg{}, fmt.Errorf("%w: not a down claim of at least %d bytes", errBadMessage, downMsgHead)
	}
	if n := int(b[9]); n != len(b)-downMsgHead {
		return downMsg{}, fmt.Errorf("%w: name of %d bytes, %d left", errBadMessage, n, len(b)-downMsgHead)
	}
	return downMsg{boot: binary.LittleEndian.Uint64(b[1:]), name: string(b[downMsgHead:])}, nil
}

// downMark is a member marked down: the boot id it was marked under.
type downMark struct {
	boot uint64
	at   time.Time
}

// Suspect asks the membership to look at member name, whose call failed:
// if its gRPC address refuses connections, it is marked down here and the
// claim sent to the other members. It returns at once; the look runs in the
// background, at most one per member at a time and one every 100 ms. Safe
// for concurrent use.
func (m *Membership) Suspect(name string) { m.look(name, 0, true) }

// look starts a look at member name (under boot, or its current boot if
// 0) unless one runs or ran in the last suspectInterval, or the member is
// not serving or is marked down already; claim sends the claim on when the
// look marks it down.
func (m *Membership) look(name string, boot uint64, claim bool) {
	if name == m.cfg.NodeName {
		return
	}
	m.nodesMu.Lock()
	now := time.Now()
	_, marked := m.down[name]
	if marked || m.looking[name] || now.Sub(m.lastLook[name]) < suspectInterval {
		m.nodesMu.Unlock()
		return // the common case of a burst of failed calls: no decoding
	}
	md, err := decodeMeta(m.nodes[name].meta)
	if err != nil || md.State != StateServing || (boot != 0 && boot != md.Boot) {
		m.nodesMu.Unlock()
		return
	}
	m.looking[name], m.lastLook[name] = true, now
	m.nodesMu.Unlock()
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return
	}
	m.wg.Go(func() {
		refused := m.cfg.Refuses(md.GRPC)
		m.nodesMu.Lock()
		delete(m.looking, name)
		m.nodesMu.Unlock()
		if !refused || !m.markDown(name, md.Boot, md.GRPC) || !claim {
			return
		}
		msg := downMsg{boot: md.Boot, name: name}.append(nil)
		for o, addr := range m.otherAddrs() {
			if o == name {
				continue
			}
			if err := m.sendTo(o, addr, msg); err != nil {
				m.log.Debug("gossip: down claim", "member", o, "err", err)
			}
		}
	})
}

// markDown marks member name down under boot, unless it is gone or has
// another boot by now, and reports whether it did.
func (m *Membership) markDown(name string, boot uint64, addr string) bool {
	m.nodesMu.Lock()
	md, err := decodeMeta(m.nodes[name].meta)
	if _, marked := m.down[name]; err != nil || md.Boot != boot || marked {
		m.nodesMu.Unlock()
		return false
	}
	now := time.Now()
	m.down[name] = downMark{boot: boot, at: now}
	m.departed[name] = Departure{At: now}
	m.departures[name]++
	m.nodesMu.Unlock()
	m.markedDown.Add(1)
	m.changed()
	m.log.Warn("gossip: member refuses connections: out of the ring now, without waiting for failure detection",
		"member", name, "grpc_addr", addr)
	return true
}

// downMessage handles a down claim from NotifyMsg: the member is looked at
// here, and marked down only if it refuses connections here too.
func (m *Membership) downMessage(b []byte) {
	d, err := decodeDownMsg(b)
	if err != nil {
		m.log.Debug("gossip: down claim dropped", "err", err)
		return
	}
	m.look(d.name, d.boot, false)
}

// Down returns the members marked down (see Suspect) and when, by name.
// Safe for concurrent use.
func (m *Membership) Down() map[string]time.Time {
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	out := make(map[string]time.Time, len(m.down))
	for name, d := range m.down {
		out[name] = d.at
	}
	return out
}
