// Package usage keeps usage statistics of a limiter: per calendar day and
// domain, the items admitted, the items denied (in total and per denying
// rule), the items each shadow rule would have denied, and a sketch of the
// distinct recipients. It answers seed 004's "how many calls did this
// application make today, and how many users".
//
// What is counted is the caller's choice (package node counts each decided
// check-and-record and record-only item once, at the node that decides it).
// A count is an Event: Tracker.Count adds it, at a time the caller gives
// (unix ms: time is an input), to the day of that time in UTC and, when
// Config.Zone is set, separately to its day in that zone.
//
// Days. A day is a calendar day of its zone, so a day of a zone with
// daylight saving time lasts 23 or 25 hours on the days the clocks change,
// and a zone with a non-whole-hour offset (Asia/Kolkata, +05:30) has its
// days start at 18:30 UTC. Each zone keeps Config.Days days (35 by
// default), today included: when a new day begins, the day Config.Days
// before it is dropped whole. That is retention, not loss; an event of a
// day older than the days kept (the clock went back more than that) is
// counted in Tracker.Dropped instead.
//
// Distinct recipients. A HyperLogLog sketch of precision 14: 16,384
// one-byte registers (16 KiB), fed the recipient's 64-bit key hash
// (xxhash64) as it is, never hashed again. Its relative standard error is
// 1.04/sqrt(16384) = 0.81% (StdError); up to 11,500 distinct recipients
// the estimate is linear counting's (from the empty registers), exact to a
// few recipients at small counts; above that, Ertl's improved estimator
// (2017), without the bias of the original's small-range correction.
// Sketches of one domain and day merge exactly (register-wise max): the
// sketch of a cluster is the merge of its nodes' sketches, whichever node
// saw which recipient.
//
// Memory: one domain on one day in one zone holds about 18 KiB (the 16 KiB
// sketch, the counters and its share of the day's map), so a domain with
// traffic every day costs 35 days × 2 zones × 18 KiB ≈ 1.2 MiB at the
// defaults (BenchmarkMemoryPerDomainDay measures it).
//
// Concurrency. Count is lock-free on its path: the zone's newest day is
// found through an atomic pointer (rolled over, under a mutex, at the first
// event past its midnight), a domain through a copy-on-write map, the
// counters are atomic, and the sketch's registers are raised by
// compare-and-swap; it allocates nothing once the day has the domain.
//
// Encodings: the saved form (Encode, Decode) is described in codec.go, the
// sketch's in sketch.go. Both are versioned and length-checked; decoders
// return ErrCorrupt for anything their encoder would not write.
package usage
