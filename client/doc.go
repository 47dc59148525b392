// Package client is the ring-aware Go client of a freqring cluster. It sends
// each item straight to the node that owns its recipient, coalesces
// concurrent single checks into batch RPCs, follows ring changes, retries
// what a change or a crash interrupted, and answers by a failure policy when
// no node can decide in time, so that the sending pipeline never waits on
// the limiter longer than its deadline.
//
//	c, err := client.New(ctx, client.Config{Seeds: []string{"freqring-0.freqring:7070"}})
//	...
//	d, err := c.Check(ctx, client.Item{Recipient: "+8613800000000", Content: body})
//	if err == nil && d.Admitted {
//		send()
//	}
//
// # Routing
//
// New asks the seeds for the ring (Limiter.Ring: members, their gRPC
// addresses, the placement parameters, the epoch) and builds it with package
// ring, the code the nodes place keys with. If the epoch it computes differs
// from the node's, this build places keys differently and New fails with
// ErrEpochMismatch rather than route every item to the wrong node.
//
// The client keeps the ring current in two ways. A WatchRing stream to one
// member delivers every change; when it breaks, the client reconnects to
// another member with jittered backoff (50ms doubling to 2s). And every
// Check response carries the answering node's epoch: one that differs from
// the client's starts an immediate Ring RPC to that node, so a client whose
// watch lags still converges within a round trip of its first stale answer.
// Rings are swapped atomically; a call routes all its items by one ring.
//
// The client holds one gRPC connection per member address, opened on first
// use and closed when the member leaves the ring. Items carry the epoch they
// were routed by. A node that does not own an item forwards it to its owner,
// so a stale ring costs a hop, not a wrong answer.
//
// # Batching
//
// CheckBatch splits its items by owner and sends one request per owner in
// parallel (an owner of more than 10,000 items gets several), then merges
// the answers in order. Each request goes on a Limiter.CheckStream taken
// from a pool per member (batchstream.go): one request at a time on each,
// sent and answered on the caller's goroutine, so no answer needs matching
// and no goroutine hands it over. A stream that answered goes back to the
// pool (up to 64 idle a member); one whose request ran past its deadline is
// closed, since its late answer would otherwise be read as the next
// request's; an idle stream found broken (the node restarted) is replaced
// in the same attempt, the request sent again with its request ids.
//
// Concurrent Check calls for the same owner share an RPC: each member has a
// batcher goroutine that sends a queued item at once while fewer than
// Config.MaxInFlight (2) of its RPCs are outstanding, and otherwise lets
// items queue until one returns; the next RPC then carries all that queued
// (up to Config.MaxBatch, 256) as one columnar batch, and each caller gets
// its own decision. A lone call pays no delay, and under load the batches
// grow with the load. A positive Config.MaxDelay makes each batch also wait
// that long for more items (no timer is used otherwise: on an idle process
// Go timers under a millisecond fire about a millisecond late).
// Each caller still waits on its own context: a caller whose deadline comes
// first gets its answer by the failure policy, and an item whose caller has
// stopped waiting is not sent. Stats.Coalesced counts the items that shared
// an RPC.
//
// The coalesced batches go as requests on one Limiter.CheckStream per member
// (stream.go), not as unary Check RPCs: a request on an open stream costs
// neither side a new HTTP/2 stream, headers, trailers or a handler
// goroutine. Each request carries a stream_id, and its answer the same one:
// the node decides a stream's requests concurrently and answers each when it
// is decided, so answers are matched by id, not by order, and a request that
// waits (for a backup, a moving partition) holds no other back. The failure
// policy is unchanged: a request unanswered by the latest deadline of its
// items fails them as retryable; a stream that breaks (the node restarted
// or left) fails the requests it holds as retryable and the next batch
// opens a new one; a request the node fails whole comes back as Check's
// error would. Against a node that does not implement CheckStream
// (UNIMPLEMENTED: an older version during a rolling upgrade) the requests
// go again as unary Checks, and so do that member's batches for a minute
// before the stream is tried again. Config.UnaryChecks always sends unary
// Checks. Stats.Streamed counts the requests sent on streams.
//
// # Deadlines, retries and the failure policy
//
// A call's deadline is its context's, or Config.Timeout (500ms) after the
// call starts if that is earlier; a canceled context ends it too. An
// attempt fails retryably when the RPC fails (UNAVAILABLE, DEADLINE_EXCEEDED,
// a broken or refused connection, a member that left) or the node fails the
// item with UNAVAILABLE (it was routed by a stale ring, or its owner did not
// answer the node's forward), or with any other code that is not the item's
// fault (INTERNAL, say).
//
// A failed item is retried until a node answers it or the deadline ends:
// before each retry the client pauses (5 ms, doubling to at most 100 ms),
// refreshes the ring with a Ring RPC to a reachable member (asking others
// than the failed one first; concurrent refreshes share one fetch, and a
// ring fetched after the attempt began is not fetched again) and sends the
// item to its owner under that ring. Each attempt gets three quarters of
// the time left (all of it below 20 ms). Retrying with the same request id
// until an answer comes is what keeps an attempt whose answer was lost from
// being counted as a send the caller never learned of.
//
// An item still undecided at the deadline is answered by the policy:
// FailOpen (the default) admits it, FailClosed denies it, and both mark the
// decision Degraded. Check and CheckBatch never return an error for it and
// never wait past the deadline (by more than scheduling). Degraded means the
// decision is the client's, not a node's: nothing was checked, nothing is
// known to be recorded, Rules is empty; a caller that wants the other policy
// for one call reads Degraded. The client logs a warning at most once a
// second while it degrades, with the count and the last cause.
//
// Errors that are the caller's are not retried and not subject to the
// policy: an item the client or the node refuses (empty or oversized
// recipient, unknown domain, cost out of range: INVALID_ARGUMENT; a full
// record: RESOURCE_EXHAUSTED) comes back as *ItemError from Check, or listed
// in ItemErrors from CheckBatch, naming the field and value. The other calls
// return ErrClosed after Close, and nothing else.
//
// # Idempotency
//
// Every item carries a nonzero request id: Item.RequestID, or a random one
// the client draws (math/rand/v2's per-thread ChaCha8, seeded by the
// runtime from the OS) for the call. A retry reuses the id, so when the
// first attempt was recorded but its answer was lost (the connection broke,
// or the node answered after the attempt's deadline), the owner answers the
// repeat with the first decision, marked Decision.Duplicate, and does not
// record it twice. This holds through forwarding too: the id travels with the
// item to its owner. Nodes remember recorded ids for a bounded time
// (node.Config.IdempotencyWindow, 1 minute by default), far longer than any
// retry of the client. A caller that retries a call itself (after
// ErrClosed, or across a restart of its own) should set Item.RequestID to
// keep the item idempotent across calls.
//
// # Lifecycle
//
// A Client owns its goroutines: the ring watch, the refresh loop, one
// batcher per member in use, the batch RPCs they start and the receiver of
// each CheckStream. Close cancels and
// waits for them all and closes every connection; calls in flight and later
// calls return ErrClosed.
//
// # Files
//
// client.go holds Config, Client, New, Close and Stats. ring.go learns and
// follows the ring: the seed rounds of New, the WatchRing loop, refreshes
// (one fetch shared by concurrent callers), the epoch check of a node's ring,
// installing a ring and pruning the peers of members that left, and the
// owner table calls route by. conn.go is the one connection per member
// address. batcher.go coalesces single Checks into batch RPCs; stream.go
// sends them on a CheckStream per member; batchstream.go is CheckBatch's
// pool of CheckStreams. item.go is
// what a call carries: Item, Decision, the item errors, validation and
// request ids. rpc.go is one Check RPC: the columnar request and the checks
// and decoding of its response. check.go is Check and CheckBatch (splitting
// by owner, the attempt and its retry). policy.go is the failure policy:
// deadlines, the refresh before a retry, and degraded answers.
package client
