package gateway

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/api/wire"
	"github.com/freqring/freqring/rules"
)

// Limits of one ShouldRateLimit call. The node checks each item's content
// size (its --max-content-bytes) itself.
const (
	MaxRLSDescriptors = 64  // descriptors in one call
	maxRecipientBytes = 256 // as the node's; checked here to name the entries of a composed key
)

// RLSConfig configures an RLS.
type RLSConfig struct {
	Checker Checker // required
	// Rules returns the rules in force, whose envoy section (or its
	// absence: rules.ConventionalEnvoy) maps descriptors to items; required
	// (a *node.Node's RuleSet, which follows reloads).
	Rules func() *rules.Set
	// Serving reports whether the node serves; while it does not, every
	// call fails UNAVAILABLE. nil means always.
	Serving func() bool
	// Log receives what a caller's answer cannot carry: a roll-back that
	// failed. nil means slog.Default().
	Log *slog.Logger
}

// RLS serves envoy.service.ratelimit.v3.RateLimitService: Envoy's rate
// limit filter, and Istio's through an EnvoyFilter, call ShouldRateLimit
// before forwarding a request, and forward it only when the answer is OK.
//
// Each descriptor the rules map becomes one item of one Check call: the
// entries named by the mapping give its recipient, content and request id,
// hits_addend its cost (an explicit 0 peeks), and is_negative_hits makes it
// a refund of the send its request id recorded. A descriptor no mapping
// matches is not limited (status OK without current_limit), as
// envoyproxy/ratelimit answers descriptors it has no limit for.
//
// The call is all or nothing: Envoy forwards the request only when every
// descriptor is OK, so when one is OVER_LIMIT (or fails) the sends the
// others recorded are refunded before the answer, and what the node counts
// is what Envoy forwarded. It is safe for concurrent use.
type RLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg RLSConfig
	// ids gives the recording items of a call of several items a request
	// id of their own, so that a denied call can take its sends back:
	// idBase + ids.Add(1) never repeats within a process, and idBase is
	// random, so two processes' ids do not meet.
	ids    atomic.Uint64
	idBase uint64
}

// NewRLS returns an RLS for cfg.
func NewRLS(cfg RLSConfig) (*RLS, error) {
	if cfg.Checker == nil {
		return nil, errors.New("gateway: RLSConfig.Checker is nil")
	}
	if cfg.Rules == nil {
		return nil, errors.New("gateway: RLSConfig.Rules is nil")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	var b [8]byte
	rand.Read(b[:])
	return &RLS{cfg: cfg, idBase: binary.LittleEndian.Uint64(b[:])}, nil
}

// Register registers s on r (a node's gRPC server, through
// node.Config.Services). Its calls are decoded by decodeRLS, not by the
// server's codec.
func (s *RLS) Register(r grpc.ServiceRegistrar) {
	sd := rlsv3.RateLimitService_ServiceDesc
	sd.Methods = slices.Clone(sd.Methods)
	for i := range sd.Methods {
		h := sd.Methods[i].Handler
		sd.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error { return decodeRLS(dec, v) }, ic)
		}
	}
	r.RegisterService(&sd, s)
}

// decodeRLS reads a request through dec (a unary handler's) and decodes it
// into v, a proto message. The codec reads it as an empty message, whose
// fields protobuf keeps undecoded, and decodeRLS decodes those bytes, so
// that bytes that are not a request are INVALID_ARGUMENT with a message
// naming the field, not the INTERNAL grpc-go answers a codec's error with:
// Envoy sends a header's bytes as they came, and protobuf refuses a string
// that is not valid UTF-8.
func decodeRLS(dec func(any) error, v any) error {
	var raw emptypb.Empty
	if err := dec(&raw); err != nil {
		if status.Code(err) == codes.Internal { // the codec's error
			return status.Error(codes.InvalidArgument, status.Convert(err).Message())
		}
		return err
	}
	m, ok := v.(proto.Message)
	if !ok {
		panic(fmt.Sprintf("BUG: request type %T is not a proto message", v))
	}
	b := raw.ProtoReflect().GetUnknown()
	if err := proto.Unmarshal(b, m); err != nil {
		md := m.ProtoReflect().Descriptor()
		if why := invalidUTF8(b, md, ""); why != "" {
			return status.Error(codes.InvalidArgument, why)
		}
		return status.Errorf(codes.InvalidArgument, "undecodable %s: %v", md.Name(), err)
	}
	return nil
}

// invalidUTF8 names the first string field of b, a message md at path,
// that is not valid UTF-8, with its value, and the key of its message if
// that has one: `descriptors[1].entries[0] (recipient): value "\xff" is not
// valid UTF-8`. It is "" if there is none, or b is not wire format.
func invalidUTF8(b []byte, md protoreflect.MessageDescriptor, path string) string {
	all := b
	var seen map[protowire.Number]int // occurrences of each repeated field so far
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		val := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			continue
		}
		v, _ := protowire.ConsumeBytes(val)
		name := string(fd.Name())
		if fd.IsList() {
			if seen == nil {
				seen = map[protowire.Number]int{}
			}
			name = fmt.Sprintf("%s[%d]", name, seen[num])
			seen[num]++
		}
		if fd.Kind() == protoreflect.MessageKind {
			sub := name
			if path != "" {
				sub = path + "." + name
			}
			if why := invalidUTF8(v, fd.Message(), sub); why != "" {
				return why
			}
			continue
		}
		if utf8.Valid(v) {
			continue
		}
		where := path
		if k := md.Fields().ByName("key"); k != nil && k != fd && k.Kind() == protoreflect.StringKind {
			if key, ok := lastBytes(all, k.Number()); ok && utf8.Valid(key) && len(key) <= 64 {
				where += " (" + string(key) + ")"
			}
		}
		if where != "" {
			where += ": "
		}
		return fmt.Sprintf("%s%s %s is not valid UTF-8", where, name, cut(string(v)))
	}
	return ""
}

// lastBytes is the value of the last field num of message b, a string or
// bytes field, as protobuf decodes it; ok is false when b has none.
func lastBytes(b []byte, num protowire.Number) (v []byte, ok bool) {
	for len(b) > 0 {
		n2, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return v, ok
		}
		b = b[n:]
		if n2 == num && typ == protowire.BytesType {
			if x, m := protowire.ConsumeBytes(b); m >= 0 {
				v, ok = x, true
			}
		}
		n = protowire.ConsumeFieldValue(n2, typ, b)
		if n < 0 {
			return v, ok
		}
		b = b[n:]
	}
	return v, ok
}

// rlsCall is a ShouldRateLimit call translated: descriptor i became item
// index[i] of req, or no item (-1) when no mapping matched it.
type rlsCall struct {
	req   *pb.CheckRequest
	index []int
}

// translate maps an Envoy call to a CheckRequest under rs. A call it cannot
// translate is INVALID_ARGUMENT, naming the descriptor, the entry or the
// field and the value; nothing is checked then.
func translate(rs *rules.Set, r *rlsv3.RateLimitRequest) (*rlsCall, error) {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, format, args...)
	}
	ed, ok := rs.Envoy(r.GetDomain())
	if !ok {
		return nil, bad("domain %q: not an Envoy domain of the rules (have %s)", r.GetDomain(), strings.Join(rs.EnvoyNames(), ", "))
	}
	ds := r.GetDescriptors()
	if len(ds) == 0 {
		return nil, bad("descriptors: none; Envoy sends at least one")
	}
	if len(ds) > MaxRLSDescriptors {
		return nil, bad("descriptors: %d, more than %d", len(ds), MaxRLSDescriptors)
	}
	c := &rlsCall{req: &pb.CheckRequest{}, index: make([]int, len(ds))}
	var ids []uint64
	hasIDs := false
	for i, d := range ds {
		c.index[i] = -1
		m, vals := match(ed, d.GetEntries())
		if m == nil {
			continue
		}
		if d.GetLimit() != nil {
			return nil, bad("descriptors[%d].limit: per-request limit overrides are not supported; set a freqring override (freqring override set) instead", i)
		}
		key, err := recipientKey(m, vals, i)
		if err != nil {
			return nil, err
		}
		var content []byte
		if v, ok := vals[m.Content]; ok && m.Content != "" {
			content = []byte(v.value)
		}
		var id uint64
		if v, ok := vals[m.RequestID]; ok && m.RequestID != "" {
			if v.value == "" {
				return nil, bad("descriptors[%d].entries[%d] (%s): value is empty", i, v.at, m.RequestID)
			}
			id = requestID(m.Domain, string(content), v.value)
			hasIDs = true
		}
		cost, mode := uint64(r.GetHitsAddend()), pb.Mode_MODE_CHECK_AND_RECORD
		if cost == 0 {
			cost = 1
		}
		if h := d.GetHitsAddend(); h != nil {
			cost = h.GetValue()
			if cost == 0 {
				cost, mode = 1, pb.Mode_MODE_PEEK
			}
		}
		if cost > MaxCost {
			field := "hits_addend"
			if d.GetHitsAddend() != nil {
				field = fmt.Sprintf("descriptors[%d].hits_addend", i)
			}
			return nil, bad("%s: %d is more than %d", field, cost, MaxCost)
		}
		if d.GetIsNegativeHits() {
			if mode == pb.Mode_MODE_PEEK {
				return nil, bad("descriptors[%d].is_negative_hits: with hits_addend 0 there is nothing to take back", i)
			}
			if id == 0 {
				return nil, bad("descriptors[%d].is_negative_hits: a refund takes back the send a request id recorded; map an entry to request_id (have entries %s)", i, entryKeys(d.GetEntries()))
			}
			mode = pb.Mode_MODE_REFUND
		}
		c.index[i] = len(c.req.Recipients)
		c.req.Recipients = append(c.req.Recipients, key)
		c.req.Domains = append(c.req.Domains, m.Domain)
		c.req.Contents = append(c.req.Contents, content)
		c.req.Costs = append(c.req.Costs, uint32(cost))
		c.req.Modes = append(c.req.Modes, mode)
		ids = append(ids, id)
	}
	if hasIDs {
		c.req.RequestIds = ids
	}
	return c, nil
}

// commonEntry is one entry of an Envoy descriptor.
type commonEntry = commonv3.RateLimitDescriptor_Entry

// entryValue is a descriptor entry's value and its index.
type entryValue struct {
	value string
	at    int
}

// match returns the first mapping of ed that matches entries, with the
// entries by key; nil if none does. An entry key that repeats matches
// nothing.
func match(ed rules.EnvoyDomain, entries []*commonEntry) (*rules.EnvoyDescriptor, map[string]entryValue) {
	vals := make(map[string]entryValue, len(entries))
	for j, e := range entries {
		if _, dup := vals[e.GetKey()]; dup {
			return nil, nil
		}
		vals[e.GetKey()] = entryValue{e.GetValue(), j}
	}
next:
	for k := range ed.Descriptors {
		m := &ed.Descriptors[k]
		known := len(m.Match) + len(m.Key)
		for _, me := range m.Match {
			if v, ok := vals[me.Key]; !ok || v.value != me.Value {
				continue next
			}
		}
		for _, key := range m.Key {
			if _, ok := vals[key]; !ok {
				continue next
			}
		}
		for _, opt := range []string{m.Content, m.RequestID} {
			if _, ok := vals[opt]; ok && opt != "" {
				known++
			}
		}
		if known == len(vals) {
			return m, vals
		}
	}
	return nil, nil
}

// recipientKey composes descriptor i's recipient from the values of m.Key,
// joined by U+001F (which HTTP header values cannot hold) when several.
func recipientKey(m *rules.EnvoyDescriptor, vals map[string]entryValue, i int) (string, error) {
	var b strings.Builder
	for n, k := range m.Key {
		v := vals[k]
		switch {
		case v.value == "":
			return "", status.Errorf(codes.InvalidArgument, "descriptors[%d].entries[%d] (%s): value is empty", i, v.at, k)
		case !utf8.ValidString(v.value):
			return "", status.Errorf(codes.InvalidArgument, "descriptors[%d].entries[%d] (%s): value %q is not valid UTF-8", i, v.at, k, v.value)
		case len(m.Key) > 1 && strings.ContainsRune(v.value, keySep):
			return "", status.Errorf(codes.InvalidArgument, "descriptors[%d].entries[%d] (%s): value %q holds U+001F, which separates the parts of a key", i, v.at, k, v.value)
		}
		if n > 0 {
			b.WriteRune(keySep)
		}
		b.WriteString(v.value)
	}
	if b.Len() > maxRecipientBytes {
		return "", status.Errorf(codes.InvalidArgument, "descriptors[%d]: recipient key from %s is %d bytes, more than %d", i, strings.Join(m.Key, ", "), b.Len(), maxRecipientBytes)
	}
	return b.String(), nil
}

// keySep joins the parts of a recipient key composed of several entries.
const keySep = '\x1f'

// requestID hashes an entry's value, with the item's freqring domain and
// content, into a nonzero request id: descriptors of one request (one
// x-request-id) that are items of other domains or contents get ids of
// their own, and a negative-hits descriptor, made by the same mapping, the
// id of the send it takes back.
func requestID(domain, content, v string) uint64 {
	d := xxhash.New()
	for _, s := range []string{domain, content, v} {
		var n [4]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(s)))
		d.Write(n[:])
		d.WriteString(s)
	}
	if h := d.Sum64(); h != 0 {
		return h
	}
	return 1
}

func entryKeys(es []*commonEntry) string {
	keys := make([]string, len(es))
	for j, e := range es {
		keys[j] = strconv.Quote(e.GetKey())
	}
	return "[" + strings.Join(keys, ", ") + "]"
}

// ShouldRateLimit answers one Envoy call. Its errors are INVALID_ARGUMENT
// for a call it cannot translate, ALREADY_EXISTS for a request id whose
// send is still counted (an OK would be forwarded uncounted) or reused with
// another item, UNAVAILABLE for every failure of the node, so
// that the filter's failure_mode_deny decides; overall_code is never
// UNKNOWN.
func (s *RLS) ShouldRateLimit(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.cfg.Serving != nil && !s.cfg.Serving() {
		return nil, status.Error(codes.Unavailable, "node is not serving: recovering, moving or shutting down; retry")
	}
	c, err := translate(s.cfg.Rules(), r)
	if err != nil {
		return nil, err
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.index))}
	for i := range out.Statuses {
		out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	if len(c.req.Recipients) == 0 {
		return out, nil
	}
	s.giveIDs(c.req)
	resp, err := s.cfg.Checker.Check(ctx, c.req)
	if err != nil {
		return nil, rlsError(err)
	}
	answers, err := wire.Read(resp, len(c.req.Recipients))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "the node's answer is malformed: %v", err)
	}
	var failed error
	decisions := make([]*Decision, len(c.req.Recipients))
	for k := range decisions {
		if e := answers.Err(k); e != nil {
			if c.req.Modes[k] == pb.Mode_MODE_REFUND && codes.Code(e.Code) == codes.NotFound {
				continue // nothing recorded under that id: nothing to take back
			}
			if failed == nil {
				failed = rlsError(status.Error(codes.Code(e.Code), descriptorField(e.Message, c.index, k)))
			}
			continue
		}
		decisions[k] = decision(c.req, answers, k)
		if decisions[k].Duplicate && c.req.Modes[k] == pb.Mode_MODE_CHECK_AND_RECORD && failed == nil {
			// Envoy forwards on OK: answering a repeated id as the send it
			// recorded would let a client that reuses x-request-id send
			// again uncounted.
			failed = status.Error(codes.AlreadyExists, descriptorField(fmt.Sprintf(
				"request id %d already recorded a send of this recipient (at %s, not refunded); each request needs an id of its own",
				c.req.RequestIds[k], decisions[k].DecidedAt.Format(time.RFC3339Nano)), c.index, k))
		}
	}
	var binding *Decision
	for i, k := range c.index {
		if k < 0 || decisions[k] == nil {
			continue
		}
		d := decisions[k]
		st := out.Statuses[i]
		if !d.Admitted {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r := bindingRule(d); r != nil {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.Limit, Unit: unitOf(r.Window)}
			st.LimitRemaining = r.Remaining
			st.DurationUntilReset = durationpb.New(time.Duration(max(r.RetryAfterMs, 0)) * time.Millisecond)
			if binding == nil || moreBinding(d, binding) {
				binding = d
			}
		}
	}
	if failed != nil || out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		s.rollBack(ctx, c.req, decisions)
	}
	if failed != nil {
		return nil, failed
	}
	if binding != nil {
		out.ResponseHeadersToAdd = rlsHeaders(binding)
	}
	return out, nil
}

// giveIDs gives each recording item of req without a request id one of
// its own when req has other items (whose denial or failure denies the
// call), so that rollBack can take them back.
func (s *RLS) giveIDs(req *pb.CheckRequest) {
	recording := 0
	for _, m := range req.Modes {
		if m == pb.Mode_MODE_CHECK_AND_RECORD {
			recording++
		}
	}
	if recording == 0 || len(req.Modes) < 2 {
		return // a lone item that is denied or fails records nothing
	}
	if req.RequestIds == nil {
		req.RequestIds = make([]uint64, len(req.Recipients))
	}
	for k, m := range req.Modes {
		if m == pb.Mode_MODE_CHECK_AND_RECORD && req.RequestIds[k] == 0 {
			if req.RequestIds[k] = s.idBase + s.ids.Add(1); req.RequestIds[k] == 0 {
				req.RequestIds[k] = s.idBase + s.ids.Add(1)
			}
		}
	}
}

// rollBack refunds the sends that req recorded, by their decisions (nil
// for a failed item): the call is answered OVER_LIMIT or fails, so Envoy
// does not forward the request. A duplicate was recorded by an earlier
// call, not this one, and stays. A failure is logged: the sends stay
// counted, which can only deny more, never admit more.
func (s *RLS) rollBack(ctx context.Context, req *pb.CheckRequest, decisions []*Decision) {
	var undo pb.CheckRequest
	for k, d := range decisions {
		if d == nil || !d.Recorded || d.Duplicate || req.Modes[k] != pb.Mode_MODE_CHECK_AND_RECORD || len(req.RequestIds) <= k || req.RequestIds[k] == 0 {
			continue
		}
		undo.Recipients = append(undo.Recipients, req.Recipients[k])
		undo.Domains = append(undo.Domains, req.Domains[k])
		undo.Contents = append(undo.Contents, req.Contents[k])
		undo.Costs = append(undo.Costs, req.Costs[k])
		undo.Modes = append(undo.Modes, pb.Mode_MODE_REFUND)
		undo.RequestIds = append(undo.RequestIds, req.RequestIds[k])
	}
	if len(undo.Recipients) == 0 {
		return
	}
	resp, err := s.cfg.Checker.Check(context.WithoutCancel(ctx), &undo)
	if err == nil && len(resp.Errors) > 0 {
		err = fmt.Errorf("item %d: %s", resp.Errors[0].Index, resp.Errors[0].Message)
	}
	if err != nil {
		s.cfg.Log.Warn("Envoy RLS: taking back the sends of a call answered OVER_LIMIT failed; they stay counted", "items", len(undo.Recipients), "err", err)
	}
}

// moreBinding reports whether d binds harder than e: denied before
// admitted, then the longer retry-after, then the fewer remaining.
func moreBinding(d, e *Decision) bool {
	if d.Admitted != e.Admitted {
		return !d.Admitted
	}
	if !d.Admitted {
		return d.RetryAfterMs > e.RetryAfterMs
	}
	return bindingRule(d).Remaining < bindingRule(e).Remaining
}

// rlsHeaders are the response headers of the binding decision: the IETF
// draft's RateLimit-Policy and RateLimit, and Retry-After when denied.
func rlsHeaders(d *Decision) []*corev3.HeaderValue {
	policy, state, ok := rateLimitFields(d)
	if !ok {
		return nil
	}
	hs := []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: policy}, {Key: "RateLimit", Value: state}}
	if !d.Admitted {
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ceilSeconds(d.RetryAfterMs), 10)})
	}
	return hs
}

// unitOf is Envoy's unit for a window of exactly one unit, else UNKNOWN
// (the rule's name says its window).
func unitOf(window string) rlsv3.RateLimitResponse_RateLimit_Unit {
	w, err := time.ParseDuration(window)
	if err != nil {
		return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	}
	switch w {
	case time.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case time.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case 24 * time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case 7 * 24 * time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// rlsError maps a failed Check to the call's error: INVALID_ARGUMENT and
// ALREADY_EXISTS stay, everything else is UNAVAILABLE.
func rlsError(err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument, codes.AlreadyExists:
		return st.Err()
	}
	return status.Errorf(codes.Unavailable, "freqring: %s: %s", st.Code(), st.Message())
}

// descriptorField rewrites an item error's message to name descriptor i
// of item k.
func descriptorField(msg string, index []int, k int) string {
	for i, kk := range index {
		if kk == k {
			return fmt.Sprintf("descriptors[%d]: %s", i, msg)
		}
	}
	return msg
}
