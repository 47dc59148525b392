package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// This file is the node's admin overrides: a layer of rules.Overrides the
// view is built from, beside the rules set's own (bind), set and lifted
// through the Admin service, and kept in the data directory
// (overridesFile). A rebinding (an override set or lifted, a rules reload)
// builds a new view from the rules set and this layer and swaps it in: the
// records stay where they are, bound to their domain's name.

// overridesFile is the admin overrides' file in the data directory: JSON,
// written whole, atomically (temp file, fsync, rename, fsync the directory).
const overridesFile = "overrides.json"

// adminOverrides is the node's admin override layer.
type adminOverrides struct {
	mu   sync.Mutex // guards list, tombs; held across a change, its file write and the rebinding, so changes apply in order
	list map[string]rules.Override
	// tombs holds the version (unix ms) of each lifted admin override, at
	// most MaxOverrides (the oldest go first), so that a member that missed
	// the delete does not bring it back through syncOverrides.
	tombs map[string]int64
}

// overridesJSON is the file format of overridesFile.
type overridesJSON struct {
	Format    int              `json:"format"` // 1
	Overrides []rules.Override `json:"overrides"`
	Deleted   map[string]int64 `json:"deleted,omitempty"` // tombstones: name -> version
}

// adminList returns the admin overrides sorted by name.
func (a *adminOverrides) sorted() []rules.Override {
	out := slices.Collect(maps.Values(a.list))
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// overridesFor returns the overrides a view of rs is built from: the rules
// file's, then the admin ones that are valid for rs (one that names a
// domain or rule rs lacks, after a reload, is logged and skipped until the
// rules have it again). Callers hold n.admin.mu or are New.
func (n *Node) overridesFor(rs *rules.Set) []rules.Override {
	out := rs.Overrides()
	for _, o := range n.admin.sorted() {
		if err := o.Validate(rs); err != nil {
			n.log.Warn("admin override skipped: it does not fit the rules in force", "override", o.Name, "err", err)
			continue
		}
		out = append(out, o)
	}
	return out
}

// rebind swaps in a view of rs with the current overrides. Callers hold
// n.admin.mu, so that a concurrent change cannot swap in an older layer.
func (n *Node) rebind(rs *rules.Set) {
	n.view.Store(n.bind(rs))
}

// loadOverrides reads the admin overrides from the data directory, before
// recovery binds records: a raised limit's records must be replayed under
// the widened domain (rules.Binding.Base), or replay would prune them.
func (n *Node) loadOverrides() error {
	path := filepath.Join(n.cfg.DataDir, overridesFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node: admin overrides: %w", err)
	}
	var f overridesJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("node: admin overrides: %s: %w", path, err)
	}
	if f.Format != 1 {
		return fmt.Errorf("node: admin overrides: %s: format %d, want 1", path, f.Format)
	}
	n.admin.mu.Lock()
	defer n.admin.mu.Unlock()
	n.admin.list = make(map[string]rules.Override, len(f.Overrides))
	for _, o := range f.Overrides {
		n.admin.list[o.Name] = o
	}
	n.admin.tombs = f.Deleted
	n.rebind(n.view.Load().rules)
	n.log.Info("admin overrides loaded", "file", path, "overrides", len(f.Overrides))
	return nil
}

// saveOverrides writes list as the data directory's admin overrides:
// temp file, fsync, rename, fsync the directory. Without a DataDir it does
// nothing.
func (n *Node) saveOverrides(list []rules.Override, tombs map[string]int64) error {
	dir := n.cfg.DataDir
	if dir == "" {
		return nil
	}
	b, err := json.MarshalIndent(overridesJSON{Format: 1, Overrides: list, Deleted: tombs}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(dir, overridesFile, b)
}

// writeFileAtomic replaces dir/name with b: temp file, fsync, rename, fsync
// the directory, so that a crash leaves the old file or the new one whole.
func writeFileAtomic(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// overrideOf converts an Admin request's override.
func overrideOf(p *pb.Override) rules.Override {
	o := rules.Override{Name: p.Name, Domain: p.Domain, Recipients: p.Recipients, Prefixes: p.Prefixes, Exempt: p.Exempt, Version: p.Version, SetBy: p.SetBy}
	if len(p.Limits) > 0 {
		o.Limits = make(map[string]int, len(p.Limits))
		for k, v := range p.Limits {
			// Exact, so that an error names the limit given: an int holds
			// every uint32 on the 64-bit platforms freqring is built for (on
			// a 32-bit one, a limit above MaxInt32, out of range anyway,
			// would read as MaxInt32).
			o.Limits[k] = int(min(uint64(v), math.MaxInt))
		}
	}
	return o
}

// overrideProto converts an override for a response.
func overrideProto(o rules.Override, source string) *pb.Override {
	p := &pb.Override{Name: o.Name, Domain: o.Domain, Recipients: o.Recipients, Prefixes: o.Prefixes, Exempt: o.Exempt, Version: o.Version, Source: source, SetBy: o.SetBy}
	if len(o.Limits) > 0 {
		p.Limits = make(map[string]uint32, len(o.Limits))
		for k, v := range o.Limits {
			p.Limits[k] = uint32(v)
		}
	}
	return p
}

// SetOverride answers Admin.SetOverride: it validates the override against
// the rules in force (INVALID_ARGUMENT naming the field and the value;
// nothing changes), writes the admin overrides to the data directory, and
// swaps in a view with it. Records are untouched: the keys' history is
// judged by the new limits from the next check on.
func (n *Node) SetOverride(ctx context.Context, req *pb.OverrideSetRequest) (*pb.OverrideSetResponse, error) {
	if req.Override == nil {
		return nil, status.Error(codes.InvalidArgument, "override: missing")
	}
	o := overrideOf(req.Override)
	o.SetBy = setterOf(ctx) // the node says who, not the override
	if o.Version == 0 {
		o.Version = n.nowMs()
	}
	if err := n.checkVersion("override "+strconvQuote(o.Name), o.Version); err != nil {
		return nil, err
	}
	n.admin.mu.Lock()
	defer n.admin.mu.Unlock()
	rs := n.view.Load().rules
	if err := o.Validate(rs); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if v, ok := n.admin.tombs[o.Name]; ok && v >= o.Version {
		return nil, status.Errorf(codes.FailedPrecondition, "override %q: version: %d is not newer than its deletion (%d)", o.Name, o.Version, v)
	}
	for _, f := range rs.Overrides() {
		if f.Name == o.Name {
			return nil, status.Errorf(codes.InvalidArgument, "override %q: name: a rules-file override has this name (%s); change it there, or choose another name", o.Name, rs.Source())
		}
	}
	if _, ok := n.admin.list[o.Name]; !ok && len(n.admin.list) >= rules.MaxOverrides {
		return nil, status.Errorf(codes.ResourceExhausted, "override %q: name: the node has %d admin overrides, the most it keeps", o.Name, rules.MaxOverrides)
	}
	if prev, ok := n.admin.list[o.Name]; ok && prev.Version > o.Version {
		return nil, status.Errorf(codes.FailedPrecondition, "override %q: version: %d is older than the one in force (%d)", o.Name, o.Version, prev.Version)
	}
	next := maps.Clone(n.admin.list)
	if next == nil {
		next = map[string]rules.Override{}
	}
	next[o.Name] = o
	tombs := maps.Clone(n.admin.tombs)
	delete(tombs, o.Name)
	if err := n.commitOverrides(next, tombs, rs); err != nil {
		return nil, err
	}
	n.log.Info("admin override set", "override", o.Name, "set_by", o.SetBy, "domain", o.Domain, "recipients", len(o.Recipients), "prefixes", len(o.Prefixes), "limits", o.Limits, "exempt", o.Exempt)
	return &pb.OverrideSetResponse{Node: n.cfg.Name, Override: overrideProto(o, "admin")}, nil
}

// DeleteOverride answers Admin.DeleteOverride: it lifts the admin override
// of that name, durably, and swaps in a view without it.
func (n *Node) DeleteOverride(ctx context.Context, req *pb.OverrideDeleteRequest) (*pb.OverrideDeleteResponse, error) {
	version := req.Version
	if version == 0 {
		version = n.nowMs()
	}
	if err := n.checkVersion("delete of override "+strconvQuote(req.Name), version); err != nil {
		return nil, err
	}
	n.admin.mu.Lock()
	defer n.admin.mu.Unlock()
	prev, ok := n.admin.list[req.Name]
	if !ok {
		return &pb.OverrideDeleteResponse{Node: n.cfg.Name}, nil
	}
	if prev.Version > version {
		return nil, status.Errorf(codes.FailedPrecondition, "override %q: version: the delete's %d is older than the override in force (%d)", req.Name, version, prev.Version)
	}
	next := maps.Clone(n.admin.list)
	delete(next, req.Name)
	if err := n.commitOverrides(next, withTomb(n.admin.tombs, req.Name, version), n.view.Load().rules); err != nil {
		return nil, err
	}
	n.log.Info("admin override lifted", "override", req.Name)
	return &pb.OverrideDeleteResponse{Node: n.cfg.Name, Deleted: true}, nil
}

// MaxVersionAhead is how far ahead of a node's clock the version of an
// admin override or of its deletion (unix ms, the time it was made) may be.
// A version far ahead would outrank every change an operator makes until
// then: one of 2^62 could never be lifted.
const MaxVersionAhead = time.Minute

// checkVersion refuses a version (unix ms) that is negative or more than
// MaxVersionAhead ahead of the node's clock; what names the change.
func (n *Node) checkVersion(what string, version int64) error {
	now := n.nowMs()
	switch {
	case version < 0:
		return status.Errorf(codes.InvalidArgument, "%s: version: %d is negative", what, version)
	case version > now+MaxVersionAhead.Milliseconds():
		return status.Errorf(codes.InvalidArgument, "%s: version: %d is %v ahead of node %s's clock (%d ms), more than %v: versions are the unix milliseconds of the change; is the caller's clock right?",
			what, version, (time.Duration(version-now) * time.Millisecond).Round(time.Second), n.cfg.Name, now, MaxVersionAhead)
	}
	return nil
}

// strconvQuote quotes a name for a message.
func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }

// commitOverrides makes next the admin layer: on disk first, then in
// memory and in the view. Callers hold n.admin.mu.
func (n *Node) commitOverrides(next map[string]rules.Override, tombs map[string]int64, rs *rules.Set) error {
	list := slices.Collect(maps.Values(next))
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	if err := n.saveOverrides(list, tombs); err != nil {
		n.log.Error("admin overrides not saved: nothing changed", "err", err)
		return status.Errorf(codes.Internal, "saving the admin overrides: %v; nothing changed", err)
	}
	n.admin.list, n.admin.tombs = next, tombs
	n.rebind(rs)
	return nil
}

// withTomb returns a copy of tombs with name deleted at version, keeping
// the newest MaxOverrides.
func withTomb(tombs map[string]int64, name string, version int64) map[string]int64 {
	out := maps.Clone(tombs)
	if out == nil {
		out = map[string]int64{}
	}
	out[name] = max(out[name], version)
	for len(out) > rules.MaxOverrides {
		oldest, ov := "", int64(0)
		for k, v := range out {
			if oldest == "" || v < ov || v == ov && k < oldest {
				oldest, ov = k, v
			}
		}
		delete(out, oldest)
	}
	return out
}

// ListOverrides answers Admin.ListOverrides: the rules file's overrides
// and the admin ones, by name.
func (n *Node) ListOverrides(context.Context, *pb.OverrideListRequest) (*pb.OverrideListResponse, error) {
	n.admin.mu.Lock()
	admin := n.admin.sorted()
	resp := &pb.OverrideListResponse{Node: n.cfg.Name}
	for _, name := range slices.Sorted(maps.Keys(n.admin.tombs)) {
		resp.Deleted = append(resp.Deleted, &pb.Override{Name: name, Version: n.admin.tombs[name], Source: "admin"})
	}
	n.admin.mu.Unlock()
	for _, o := range n.view.Load().rules.Overrides() {
		resp.Overrides = append(resp.Overrides, overrideProto(o, "file"))
	}
	for _, o := range admin {
		resp.Overrides = append(resp.Overrides, overrideProto(o, "admin"))
	}
	sort.SliceStable(resp.Overrides, func(i, j int) bool {
		return strings.Compare(resp.Overrides[i].Name, resp.Overrides[j].Name) < 0
	})
	return resp, nil
}

// syncTimeout bounds one member's ListOverrides call in syncOverrides.
const syncTimeout = 5 * time.Second

// syncLoop pulls the admin overrides of the ring's other members each time
// kick fires (Open, and every ring change), until ctx is done.
func (n *Node) syncLoop(ctx context.Context, kick <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		n.syncOverrides(ctx)
	}
}

// syncOverrides asks every other member of the ring for its admin
// overrides and adopts, per name, the newest version of the override or of
// its deletion, if newer than this node's. An override that does not fit
// this node's rules is logged and not adopted. Members it cannot reach are
// logged; the next ring change tries again. A member that joins or restarts
// thus gets the overrides set while it was away, and a delete it missed
// does not come back from it: the tombstone is newer.
func (n *Node) syncOverrides(ctx context.Context) {
	newest := n.peersOverrides(ctx)
	if len(newest) == 0 {
		return
	}
	n.admin.mu.Lock()
	defer n.admin.mu.Unlock()
	rs := n.view.Load().rules
	next, tombs := maps.Clone(n.admin.list), maps.Clone(n.admin.tombs)
	if next == nil {
		next = map[string]rules.Override{}
	}
	changed := 0
	for _, name := range slices.Sorted(maps.Keys(newest)) {
		if n.adoptOverride(name, newest[name], next, &tombs, rs) {
			changed++
		}
	}
	if changed == 0 {
		return
	}
	if err := n.commitOverrides(next, tombs, rs); err != nil {
		return // logged
	}
	n.log.Info("override sync: adopted peers' newer admin overrides", "changed", changed)
}

// peerOverride is the newest version of one override the other members
// hold: the override, or its deletion.
type peerOverride struct {
	o       *pb.Override
	deleted bool
}

// peersOverrides asks every other member of the ring for its admin
// overrides and returns, by name, the newest version of each, a deletion
// winning a tie. Members it cannot reach are logged and passed over.
func (n *Node) peersOverrides(ctx context.Context) map[string]peerOverride {
	newest := map[string]peerOverride{}
	for _, m := range n.clus.Load().ring().Members() {
		if m.Name == n.cfg.Name {
			continue
		}
		p, err := n.peers.Peer(m)
		if err != nil {
			n.log.Warn("override sync: peer unreachable", "peer", m.Name, "err", err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, syncTimeout)
		resp, err := p.ListOverrides(cctx, &pb.OverrideListRequest{})
		cancel()
		if err != nil {
			n.log.Warn("override sync: listing a peer's overrides failed", "peer", m.Name, "err", err)
			continue
		}
		for _, o := range resp.Overrides {
			if o.Source == "admin" && (newest[o.Name].o == nil || o.Version > newest[o.Name].o.Version) {
				newest[o.Name] = peerOverride{o: o}
			}
		}
		for _, o := range resp.Deleted {
			if e := newest[o.Name]; e.o == nil || o.Version >= e.o.Version {
				newest[o.Name] = peerOverride{o: o, deleted: true}
			}
		}
	}
	return newest
}

// adoptOverride applies the peers' version e of override name to next and
// *tombs (this node's overrides and deletions, being rebuilt) if it is
// newer than this node's, not versioned ahead of its clock, and, for an
// override, fits rules rs. It reports whether it changed anything. Held:
// n.admin.mu.
func (n *Node) adoptOverride(name string, e peerOverride, next map[string]rules.Override, tombs *map[string]int64, rs *rules.Set) bool {
	local := int64(-1)
	if o, ok := next[name]; ok {
		local = o.Version
	}
	if v, ok := (*tombs)[name]; ok {
		local = max(local, v)
	}
	if e.o.Version <= local {
		return false
	}
	if err := n.checkVersion("override "+strconvQuote(name), e.o.Version); err != nil {
		n.log.Warn("override sync: a peer's override is versioned ahead of this node's clock: not adopted", "override", name, "err", err)
		return false
	}
	if e.deleted {
		if _, ok := next[name]; ok || (*tombs)[name] < e.o.Version {
			delete(next, name)
			*tombs = withTomb(*tombs, name, e.o.Version)
			return true
		}
		return false
	}
	o := overrideOf(e.o)
	if err := o.Validate(rs); err != nil {
		n.log.Warn("override sync: a peer's override does not fit the rules here: not adopted", "override", name, "err", err)
		return false
	}
	next[name] = o
	delete(*tombs, name)
	return true
}
