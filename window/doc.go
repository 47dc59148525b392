// Package window is freqring's rule engine: exact sliding-window frequency
// limits over compact per-recipient records, and the counting algorithms
// (sliding-counter, token-bucket, leaky-bucket, gcra, fixed-window) for
// limits a timestamp log cannot hold. Each rule names its Algorithm; a
// domain may mix them, and an item is admitted only if every rule admits
// it, and then recorded in every rule's state at once (counter.go defines
// each algorithm). It is pure code: no goroutines,
// no I/O, no clock; the same inputs always give the same outputs.
//
// # Rules and semantics
//
// A Domain is a set of Rules. A Rule (Limit L, Window W, Scope) admits a send
// at time t only if fewer than L admitted sends of its scope lie in the
// half-open window (t-W, t]. ScopeRecipient counts every admitted send to the
// recipient; ScopeContent counts admitted sends to the recipient with the same
// content (identified by a 64-bit content hash). An item of cost c is admitted
// iff, for every rule that applies, used+c <= L; it is then recorded as c sends
// at t, once for all rules. Denied attempts are not recorded. Content rules do
// not apply to an item without content.
//
// Time is an argument, in unix milliseconds; the caller's clock decides. If
// now is earlier than the newest send in a record (the clock stepped back), the
// decision is taken at that newest send instead: a record's time never moves
// backwards, and nothing panics.
//
// Because each scope keeps its newest sends in order, a rule is decided by one
// entry: with cost c it admits iff the log holds fewer than L-c+1 entries in
// the window, and otherwise it admits again at e+W, where e is the
// (L-c+1)-th newest entry. RetryAfter is exact to the millisecond. Used counts
// need one binary search per rule.
//
// # Records
//
// This is record format 3 (RecordFormat); ConvertRecord reads and writes
// formats 1 and 2 for snapshots and peers of older releases. Format 3 is
// format 2 followed by the counter states of the counting rules (see
// decodeCounters): a 32-bit id per rule (its name, algorithm, window and
// buckets), the algorithm, and a few numbers. The sliding-log rules decide
// by the logs below.
//
// A record is the state of one recipient in one domain: a recipient log of
// at most max(recipient limits) timestamps within the longest recipient
// window, and one content log per content seen within the longest content
// window, each of at most max(content limits) timestamps. Anything older, or
// beyond those capacities, is dropped when the record is next written, since
// no rule can count it. Logs are kept as a bit stream, least significant bit
// first:
//
//	tag      16 bits  opaque to this package (the store keeps a key verifier here)
//	newest   44 bits  unix ms of the newest send in any log (until year 2527)
//	n        count    recipient entries
//	  aged    1 bit   (if n > 0) the newest recipient entry is older than newest;
//	  age    44 bits  (if aged) by this many ms
//	  width   6 bits  (if n > 1) bits per gap
//	  gaps   (n-1) x width, newest first: entry[i] - entry[i-1]
//	k        count    content logs
//	  refs    1 bit   (if k > 0) 0: every log as in format 1 (see codec_v1.go)
//	  width   6 bits  (if k > 0) bits per explicit value in every content log
//	  then k times:
//	    fp   32 bits  fingerprint of the content hash (h ^ h>>32)
//	    m    count    entries (>= 1)
//	    m entries, newest first, each a 1-bit kind and then:
//	      1: the entry is also in the recipient log: the gamma code of how
//	         many positions before the log's previous such entry (the end
//	         of the recipient log at first) it sits, 1 to 7 bits in practice
//	      0: width bits, the previous entry (newest at first) minus this one
//	c        count    counter states (format 3), by ascending id, each:
//	  id     32 bits, algorithm 3 bits, m count, the age of the state's
//	                  time from newest (6-bit width, value), then m-1 counts
//	                  (6-bit width, values)
//
//	count: 4 bits v; if v == 15, 11 more bits e and the count is 15+e.
//
// Gaps in ms need about log2(span/n)+1 bits each: the seed's steady state of
// 30 sends spread over 24 hours costs 24-25 bits a timestamp, and each of
// its 3 content logs about 40 bits (115 bytes in all, against 122 in format
// 1, which wrote every content entry as a timestamp). Records are
// rewritten whole on every recorded send; a check that records nothing only
// decodes.
//
// Two contents of one recipient whose fingerprints collide share their logs:
// the recipient may be denied early, never admitted beyond a limit.
package window
