package client

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

// defaultDomain is the domain of an item that names none (node.DefaultDomain).
const defaultDomain = "default"

// Mode says what a check does with an item.
type Mode int

const (
	// CheckAndRecord admits the item if every rule allows it, and records it
	// if admitted. The zero value.
	CheckAndRecord Mode = iota
	// Peek decides as CheckAndRecord would and changes nothing.
	Peek
	// RecordOnly records the item without checking it: check with Peek,
	// send, then record.
	RecordOnly
	// Refund takes back the send that the item's RequestID recorded for its
	// recipient (in its domain, with its content), because the message was
	// not delivered: it no longer counts. RequestID is required; Cost is the
	// send's. One refund per send: a repeated refund changes nothing and is
	// answered with Duplicate. A refund must come while the node remembers
	// the id (its idempotency window, 1 minute by default); after that the
	// item fails with NOT_FOUND.
	Refund
)

func (m Mode) String() string {
	switch m {
	case CheckAndRecord:
		return "CheckAndRecord"
	case Peek:
		return "Peek"
	case RecordOnly:
		return "RecordOnly"
	case Refund:
		return "Refund"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Item is one message to check.
type Item struct {
	Domain    string // rule set, UTF-8; "" means "default"
	Recipient string // who receives the message, 1 to 256 bytes of UTF-8; routes the item
	// Content is the message content; the client hashes it (ContentHash) and
	// sends only the hash. Empty means no content: content rules do not apply.
	// At most 64 KiB.
	Content []byte
	// ContentHash is the content's 64-bit hash, for callers that have it
	// (ContentHash(content)); 0 means none. Set at most one of Content and
	// ContentHash.
	ContentHash uint64
	Cost        int  // sends the item counts as; 0 means 1; [1, 1000]
	Mode        Mode // zero value: CheckAndRecord
	// RequestID identifies the item across retries: a node answers a repeat
	// of a recorded id with the first decision and does not record it again.
	// 0 means the client draws a random nonzero id for the call (and reuses it
	// for the call's retry). Set it to keep an item idempotent across calls
	// too, for example when the caller retries after ErrClosed or a crash.
	// An id names one item: reused for the same recipient with another
	// domain, content, cost or mode, it fails that item (ALREADY_EXISTS).
	RequestID uint64
}

// Decision is the answer for one item.
type Decision struct {
	Admitted bool // the message may be sent; always true for RecordOnly
	Recorded bool // the node recorded the send
	// Degraded means no node decided the item before the call's deadline:
	// Admitted is the FailurePolicy's answer (true for FailOpen) and nothing
	// else is set but DecidedAt. A caller that wants the other policy for one
	// call reads Degraded.
	Degraded bool
	// Duplicate means the node had already recorded an item with this
	// request id and recipient (an earlier attempt whose answer was lost, or
	// an earlier call with the same Item.RequestID): the answer is the first
	// decision (admitted and recorded, DecidedAt its time; Rules as of now)
	// and nothing was recorded again.
	Duplicate bool
	DeniedBy  string // the rule that denied the item (the one with the longest RetryAfter); "" if admitted
	// ShadowDeniedBy is the shadow rule that would have denied the item
	// (the one with the longest retry); "" if none. A shadow rule never
	// denies: an item only shadow rules would deny is admitted.
	ShadowDeniedBy string
	// Refunded means this Refund item took back its send now.
	Refunded   bool
	RetryAfter time.Duration // until the item would be admitted; 0 if admitted
	// DecidedAt is the node's clock at the decision (millisecond precision),
	// or the client's clock for a degraded answer.
	DecidedAt time.Time
	Rules     []RuleState // every rule of the item's domain, in the domain's order
	Node      string      // the node the client asked, which answered (or forwarded); "" if degraded
}

// RuleState is one rule's state for an item after its decision.
type RuleState struct {
	Name       string
	Limit      int
	Window     time.Duration
	Shadow     bool          // a shadow rule: evaluated and reported, never denies
	Used       int           // sends of the rule's scope in the window, this one included if recorded
	Remaining  int           // Limit - Used, at least 0
	RetryAfter time.Duration // until this rule admits the item; 0 if it does; -1ms never (a shadow rule below the item's cost)
}

// ItemError is an item the caller got wrong: the client or the node refused
// it (INVALID_ARGUMENT: empty recipient, unknown domain, cost out of range;
// RESOURCE_EXHAUSTED: the recipient's record is full). It is not recorded,
// and the FailurePolicy does not apply: retrying it cannot help.
type ItemError struct {
	Index   int        // the item's index in the call (0 for Check)
	Code    codes.Code // a gRPC code
	Message string     // names the field and the value
	// Field is the request column at fault (wire.Costs, ...) when the
	// item's own input is; "" otherwise.
	Field string
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("client: item %d: %s (%v)", e.Index, e.Message, e.Code)
}

// at returns e as item i of the caller's call, for an error a node reported
// as item j of its request: a message that names its field with index j
// first (the node's style: "domains[3]: unknown domain ...") names i. The
// field is e.Field; from a node that does not say (an older version), a
// first word followed by "[j]".
func (e *ItemError) at(i, j int) *ItemError {
	msg, field := e.Message, e.Field
	if field == "" {
		if b := strings.IndexByte(msg, '['); b > 0 && isWord(msg[:b]) {
			field = msg[:b]
		}
	}
	if field != "" {
		if rest, ok := strings.CutPrefix(msg, field+"["+strconv.Itoa(j)+"]"); ok {
			msg = field + "[" + strconv.Itoa(i) + "]" + rest
		}
	}
	return &ItemError{Index: i, Code: e.Code, Message: msg, Field: e.Field}
}

func isWord(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_') {
			return false
		}
	}
	return true
}

// ItemErrors lists the failed items of a CheckBatch call, by index. Their
// decisions are the zero Decision (not admitted). errors.As finds it, and
// each *ItemError in it.
type ItemErrors []*ItemError

func (es ItemErrors) Error() string {
	switch len(es) {
	case 0:
		return "client: no item errors"
	case 1:
		return es[0].Error()
	}
	return fmt.Sprintf("%v (and %d more failed items)", es[0], len(es)-1)
}

// Unwrap returns the item errors, for errors.Is and errors.As.
func (es ItemErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// ContentHash returns the hash nodes give a message content: xxhash64 (seed
// 0) of its bytes, never 0; 0 for an empty content.
func ContentHash(content []byte) uint64 {
	if len(content) == 0 {
		return 0
	}
	return max(ring.Hash(content), 1)
}

// prepared is a validated item, as it goes on the wire.
type prepared struct {
	recipient, domain string
	hash              uint64
	cost              uint32
	mode              pb.Mode
	id                uint64
}

// prepare validates item i and encodes it.
func prepare(it *Item, i int) (prepared, *ItemError) {
	bad := func(format string, args ...any) (prepared, *ItemError) {
		return prepared{}, &ItemError{Index: i, Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case it.Recipient == "":
		return bad("Recipient: empty recipient")
	case len(it.Recipient) > MaxRecipientBytes:
		return bad("Recipient: %d bytes, more than %d", len(it.Recipient), MaxRecipientBytes)
	case !utf8.ValidString(it.Recipient):
		return bad("Recipient: %q is not valid UTF-8", it.Recipient)
	case !utf8.ValidString(it.Domain):
		return bad("Domain: %q is not valid UTF-8", it.Domain)
	case len(it.Content) > 0 && it.ContentHash != 0:
		return bad("Content and ContentHash: both set; set at most one")
	case len(it.Content) > MaxContentBytes:
		return bad("Content: %d bytes, more than %d", len(it.Content), MaxContentBytes)
	}
	cost := it.Cost
	if cost == 0 {
		cost = 1
	}
	if cost < 1 || cost > MaxCost {
		return bad("Cost: %d out of range [1, %d] (0 means 1)", it.Cost, MaxCost)
	}
	var mode pb.Mode
	switch it.Mode {
	case CheckAndRecord:
		mode = pb.Mode_MODE_CHECK_AND_RECORD
	case Peek:
		mode = pb.Mode_MODE_PEEK
	case RecordOnly:
		mode = pb.Mode_MODE_RECORD_ONLY
	case Refund:
		if it.RequestID == 0 {
			return bad("RequestID: 0; a Refund names the send it takes back by the RequestID it was recorded with")
		}
		mode = pb.Mode_MODE_REFUND
	default:
		return bad("Mode: unknown mode %d", int(it.Mode))
	}
	h := it.ContentHash
	if len(it.Content) > 0 {
		h = ContentHash(it.Content)
	}
	return prepared{recipient: it.Recipient, domain: it.Domain, hash: h, cost: uint32(cost), mode: mode, id: it.RequestID}, nil
}

// newID returns a nonzero request id.
func (c *Client) newID() uint64 {
	for {
		var id uint64
		if c.cfg.Rand == nil {
			id = rand.Uint64()
		} else {
			c.randMu.Lock()
			id = c.cfg.Rand.Uint64()
			c.randMu.Unlock()
		}
		if id != 0 {
			return id
		}
	}
}
