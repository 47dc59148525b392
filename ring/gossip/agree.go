package gossip

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/freqring/freqring/ring"
)

// Agreement is what a member must share with the ring to own partitions: the
// same rules and protocol (Config.Agreement) and the same placement
// (Config.Placement). Each member publishes its own in its metadata.
//
// Of the serving members, the ring takes those of the agreement that the most
// serving members publish; a tie goes to the agreement of the member whose
// name sorts first among the tied ones. Every member computes the same
// choice from the same metadata, so all of them, those left out included,
// see one ring: a member whose rules differ is given no partitions, still
// forwards its callers' checks to their owners, and hands over what it holds
// to the ring's members. A member of a binary that publishes no agreement
// (metadata version 1 without the fields) agrees with every ring.
type Agreement struct {
	// Rules identifies the rule set: its hash (rules.Set.Hash); 0 means none
	// is published.
	Rules uint64
	// Protocol is the version of the peer protocol and record formats; members
	// with different ones do not share partitions.
	Protocol uint32
	// Version is the binary's version, published so that operators can see
	// it; it is not compared. At most 64 bytes.
	Version string
}

// maxVersion bounds Agreement.Version in the metadata.
const maxVersion = 64

// agreementKey is what members must share: the compared fields.
type agreementKey struct {
	rules     uint64
	protocol  uint32
	placement ring.Config
}

func (k agreementKey) String() string {
	return fmt.Sprintf("rules %016x, protocol %d, placement %d partitions/%d virtual nodes/load %g",
		k.rules, k.protocol, k.placement.PartitionCount, k.placement.ReplicationFactor, k.placement.Load)
}

// differences names the fields in which k differs from ring's agreement.
func (k agreementKey) differences(ring agreementKey) string {
	var d []string
	if k.rules != ring.rules {
		d = append(d, fmt.Sprintf("rules hash %016x, the ring's %016x", k.rules, ring.rules))
	}
	if k.protocol != ring.protocol {
		d = append(d, fmt.Sprintf("protocol %d, the ring's %d", k.protocol, ring.protocol))
	}
	if k.placement != ring.placement {
		d = append(d, fmt.Sprintf("placement %d/%d/%g, the ring's %d/%d/%g (partitions/virtual nodes/load)",
			k.placement.PartitionCount, k.placement.ReplicationFactor, k.placement.Load,
			ring.placement.PartitionCount, ring.placement.ReplicationFactor, ring.placement.Load))
	}
	return strings.Join(d, "; ")
}

// candidate is a serving member, as the ring is chosen from.
type candidate struct {
	name   string
	addr   string
	key    agreementKey
	legacy bool // publishes no agreement: agrees with any ring
}

// chooseRing returns the members of the ring and, for each serving member
// left out, why. It is a pure function of its input's set (order does not
// matter), so that members with the same view choose the same ring.
func chooseRing(cands []candidate) (in []ring.Member, out map[string]string) {
	counts := map[agreementKey]int{}
	first := map[agreementKey]string{} // the first name publishing each key
	for _, c := range cands {
		if c.legacy {
			continue
		}
		counts[c.key]++
		if f, ok := first[c.key]; !ok || c.name < f {
			first[c.key] = c.name
		}
	}
	var best agreementKey
	bestN, bestFirst := 0, ""
	for k, n := range counts {
		if n > bestN || n == bestN && first[k] < bestFirst {
			best, bestN, bestFirst = k, n, first[k]
		}
	}
	for _, c := range cands {
		if c.legacy || bestN == 0 || c.key == best {
			in = append(in, ring.Member{Name: c.name, Addr: c.addr})
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[c.name] = fmt.Sprintf("disagrees with the ring (%d of %d serving members agree on %s): %s",
			bestN, len(cands), best, c.key.differences(best))
	}
	slices.SortFunc(in, func(a, b ring.Member) int { return cmp.Compare(a.Name, b.Name) })
	return in, out
}

// effectivePlacement is c with ring's defaults filled in, as members compare
// it. An invalid c (rejected by Config.validate) is returned as it is.
func effectivePlacement(c ring.Config) ring.Config {
	r, err := ring.New(nil, c)
	if err != nil {
		return c
	}
	return r.Config()
}

// logExclusions logs each member newly left out of the ring for disagreeing
// with it (at Warn; this node's own exclusion says so), and each one back in.
func (m *Membership) logExclusions(prev, cur map[string]string) {
	self := m.cfg.NodeName
	for _, name := range slices.Sorted(maps.Keys(cur)) {
		if prev[name] == cur[name] {
			continue
		}
		if name == self {
			m.log.Warn("gossip: this node is left out of the ring and owns no partitions", "why", cur[name])
		} else {
			m.log.Warn("gossip: member left out of the ring", "member", name, "why", cur[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(prev)) {
		if _, ok := cur[name]; !ok {
			m.log.Info("gossip: member back in the ring", "member", name)
		}
	}
}
