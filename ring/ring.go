package ring

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// placementVersion names the placement algorithm: consistent v1.0.0 (virtual
// node keys "i:name", partition keys little-endian uint64) with xxhash64. It is
// hashed into every epoch, so two binaries that would place keys differently
// never agree on an epoch. Bump it whenever an upgrade of consistent or xxhash
// changes placement; TestPlacementGolden fails when that happens.
const placementVersion = 1

// Defaults and bounds of Config.
const (
	DefaultPartitionCount    = 271
	DefaultReplicationFactor = 20
	DefaultLoad              = 1.25

	MaxPartitionCount    = 1 << 16
	MaxReplicationFactor = 1024
	MaxLoad              = 10.0
)

// ErrDuplicateMember is returned by New when two members share a name.
var ErrDuplicateMember = errors.New("ring: duplicate member")

// Member is one node of the ring.
type Member struct {
	Name string // unique node name; the only input to placement
	Addr string // gRPC host:port; part of the epoch, not of placement
}

// Config holds the placement parameters. Every node and client must use the
// same values; they travel with the member set (and are hashed into the epoch).
// A zero field takes the default named in its comment.
type Config struct {
	PartitionCount    int     // partitions keys hash into; 0 means 271; [1, 65536]
	ReplicationFactor int     // virtual nodes per member; 0 means 20; [1, 1024]
	Load              float64 // bounded-load factor; 0 means 1.25; [1, 10]
}

func (c Config) withDefaults() Config {
	if c.PartitionCount == 0 {
		c.PartitionCount = DefaultPartitionCount
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.Load == 0 {
		c.Load = DefaultLoad
	}
	return c
}

// validate checks a Config with defaults filled in.
func (c Config) validate() error {
	if c.PartitionCount < 1 || c.PartitionCount > MaxPartitionCount {
		return fmt.Errorf("ring: PartitionCount %d out of range [1, %d]", c.PartitionCount, MaxPartitionCount)
	}
	if c.ReplicationFactor < 1 || c.ReplicationFactor > MaxReplicationFactor {
		return fmt.Errorf("ring: ReplicationFactor %d out of range [1, %d]", c.ReplicationFactor, MaxReplicationFactor)
	}
	// Load >= 1 guarantees that members*ceil(partitions/members*Load) >= partitions,
	// so consistent always finds room for every partition (it panics otherwise).
	if !(c.Load >= 1 && c.Load <= MaxLoad) { // also rejects NaN
		return fmt.Errorf("ring: Load %g out of range [1, %g]", c.Load, MaxLoad)
	}
	return nil
}

// Ring is an immutable placement of keys on members. It is safe for
// concurrent use. A Ring with no members has epoch 0 and answers the zero
// Member for every key.
type Ring struct {
	cfg     Config   // defaults filled in
	np      uint64   // uint64(cfg.PartitionCount)
	members []Member // sorted by Name
	owner   []int32  // partition -> index into members; nil when members is empty
	replica []int32  // partition -> index into members; equals owner when len(members) == 1
	epoch   uint64
}

// New builds the placement of members under cfg. The result depends only on
// the set of members and cfg: order does not matter, and every process that
// builds a Ring from the same set gets the same owner for every key. It
// returns an error for an invalid cfg, an empty member name, or two members
// with the same name (ErrDuplicateMember). An empty set gives an empty Ring
// (epoch 0).
func New(members []Member, cfg Config) (*Ring, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
	for i, m := range ms {
		if m.Name == "" {
			return nil, fmt.Errorf("ring: member with addr %q has an empty name", m.Addr)
		}
		if i > 0 && ms[i-1].Name == m.Name {
			return nil, fmt.Errorf("%w: %q (addrs %q and %q)", ErrDuplicateMember, m.Name, ms[i-1].Addr, m.Addr)
		}
	}
	r := &Ring{cfg: cfg, np: uint64(cfg.PartitionCount), members: ms}
	if len(ms) == 0 {
		return r, nil
	}
	if err := r.place(); err != nil {
		return nil, err
	}
	r.epoch = epoch(cfg, ms)
	return r, nil
}

// hasher is the consistent.Hasher used for virtual nodes and partition ids.
type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// node is the consistent.Member of one ring member: its name.
type node string

func (n node) String() string { return string(n) }

// place fills r.owner and r.replica from consistent. It runs once per Ring;
// lookups never touch consistent (whose LocateKey takes a lock and returns an
// interface).
func (r *Ring) place() (err error) {
	defer func() {
		// consistent panics when it finds no room for a partition. validate rules
		// that out (Load >= 1); turn a panic into an error rather than kill a node
		// on a membership change.
		if p := recover(); p != nil {
			err = fmt.Errorf("ring: consistent: %v", p)
		}
	}()
	index := make(map[string]int32, len(r.members))
	cms := make([]consistent.Member, len(r.members))
	for i, m := range r.members {
		index[m.Name] = int32(i)
		cms[i] = node(m.Name)
	}
	// Members go in sorted by name. Placement does not depend on the order
	// anyway (consistent sorts its virtual nodes and walks partitions in id
	// order), except when two virtual nodes hash alike: then the member added
	// last wins the point. A fixed order makes even that case deterministic.
	c := consistent.New(cms, consistent.Config{
		Hasher:            hasher{},
		PartitionCount:    r.cfg.PartitionCount,
		ReplicationFactor: r.cfg.ReplicationFactor,
		Load:              r.cfg.Load,
	})
	owners := func(dst []int32) error {
		for p := range dst {
			m := c.GetPartitionOwner(p)
			if m == nil {
				return fmt.Errorf("ring: BUG: partition %d has no owner", p)
			}
			dst[p] = index[m.String()]
		}
		return nil
	}
	r.owner = make([]int32, r.cfg.PartitionCount)
	if err := owners(r.owner); err != nil {
		return err
	}
	r.replica = r.owner
	if len(r.members) == 1 {
		return nil
	}
	// The replica of a partition is the member that would own it if its owner
	// left: remove each owner in turn, read where its partitions went, put it
	// back. Add after Remove restores the same placement, because placement is
	// a function of the member set.
	r.replica = make([]int32, r.cfg.PartitionCount)
	without := make([]int32, r.cfg.PartitionCount)
	owns := make([]bool, len(r.members))
	for _, o := range r.owner {
		owns[o] = true
	}
	for i, m := range r.members {
		if !owns[i] {
			continue
		}
		c.Remove(m.Name)
		if err := owners(without); err != nil {
			return err
		}
		c.Add(node(m.Name))
		for p, o := range r.owner {
			if int(o) == i {
				r.replica[p] = without[p]
			}
		}
	}
	// Remove deletes a virtual node's point by hash; had two virtual nodes
	// collided (odds about (members*ReplicationFactor)²/2^65), the restored
	// placement could differ. Check rather than trust.
	if err := owners(without); err != nil {
		return err
	}
	if !slices.Equal(without, r.owner) {
		return errors.New("ring: virtual node hash collision: placement not restored after replica computation")
	}
	return nil
}

// epoch hashes the canonical member set (sorted, with addresses) and the
// placement parameters. 0 is reserved for "no ring", so a hash of 0 becomes 1.
func epoch(cfg Config, ms []Member) uint64 {
	b := make([]byte, 0, 64+32*len(ms))
	b = append(b, "freqring/ring"...)
	b = binary.AppendUvarint(b, placementVersion)
	b = binary.AppendUvarint(b, uint64(cfg.PartitionCount))
	b = binary.AppendUvarint(b, uint64(cfg.ReplicationFactor))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(cfg.Load))
	b = binary.AppendUvarint(b, uint64(len(ms)))
	for _, m := range ms {
		b = binary.AppendUvarint(b, uint64(len(m.Name)))
		b = append(b, m.Name...)
		b = binary.AppendUvarint(b, uint64(len(m.Addr)))
		b = append(b, m.Addr...)
	}
	if h := xxhash.Sum64(b); h != 0 {
		return h
	}
	return 1
}

// Hash returns the 64-bit hash of a key: xxhash64 (seed 0) of its bytes. Nodes
// and clients hash the recipient string exactly this way, so a node can reuse
// the hash it routes by for its own index.
func Hash(key []byte) uint64 { return xxhash.Sum64(key) }

// HashString is Hash for a string key, without converting it to []byte.
func HashString(key string) uint64 { return xxhash.Sum64String(key) }

// Partition returns the partition of key: Hash(key) % PartitionCount.
func (r *Ring) Partition(key []byte) int { return int(xxhash.Sum64(key) % r.np) }

// PartitionString is Partition for a string key.
func (r *Ring) PartitionString(key string) int { return int(xxhash.Sum64String(key) % r.np) }

// PartitionHash returns the partition of a key whose Hash is h.
func (r *Ring) PartitionHash(h uint64) int { return int(h % r.np) }

// Owner returns the member that owns key, or the zero Member if the ring is
// empty. It does not allocate.
func (r *Ring) Owner(key []byte) Member { return r.PartitionOwner(r.Partition(key)) }

// OwnerString is Owner for a string key. It does not allocate.
func (r *Ring) OwnerString(key string) Member { return r.PartitionOwner(r.PartitionString(key)) }

// PartitionOwner returns the owner of partition p, or the zero Member if the
// ring is empty or p is outside [0, PartitionCount).
func (r *Ring) PartitionOwner(p int) Member {
	if uint(p) >= uint(len(r.owner)) {
		return Member{}
	}
	return r.members[r.owner[p]]
}

// Replica returns the replica of key: the member that would own it if its
// owner left the ring, which is where a crashed owner's keys go. ok is false
// when the ring has fewer than two members; then the member is the owner (or
// the zero Member for an empty ring). It does not allocate.
func (r *Ring) Replica(key []byte) (m Member, ok bool) {
	return r.PartitionReplica(r.Partition(key))
}

// ReplicaString is Replica for a string key.
func (r *Ring) ReplicaString(key string) (m Member, ok bool) {
	return r.PartitionReplica(r.PartitionString(key))
}

// PartitionReplica is Replica for partition p. ok is false, with the zero
// Member, when p is outside [0, PartitionCount).
func (r *Ring) PartitionReplica(p int) (m Member, ok bool) {
	if uint(p) >= uint(len(r.replica)) {
		return Member{}, false
	}
	return r.members[r.replica[p]], len(r.members) > 1
}

// Members returns a copy of the members, sorted by name.
func (r *Ring) Members() []Member { return slices.Clone(r.members) }

// Has reports whether the ring has a member of that name.
func (r *Ring) Has(name string) bool {
	_, ok := slices.BinarySearchFunc(r.members, name, func(m Member, n string) int { return strings.Compare(m.Name, n) })
	return ok
}

// Len returns the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Epoch identifies the ring: a 64-bit xxhash of the placement version, the
// placement parameters and the sorted (name, addr) pairs. Equal sets with
// equal parameters have equal epochs on every process; a change of any member,
// address or parameter changes the epoch, except with probability about 2^-64
// for any two different rings (about n²/2^65 that some pair among n distinct
// rings ever collides). Epoch 0 means no ring (no members).
func (r *Ring) Epoch() uint64 { return r.epoch }

// Config returns the placement parameters, defaults filled in.
func (r *Ring) Config() Config { return r.cfg }

// Counts returns the number of partitions each member owns, by member name.
// Every member is present, with 0 if it owns none.
func (r *Ring) Counts() map[string]int {
	n := make(map[string]int, len(r.members))
	for _, m := range r.members {
		n[m.Name] = 0
	}
	for _, o := range r.owner {
		n[r.members[o].Name]++
	}
	return n
}
