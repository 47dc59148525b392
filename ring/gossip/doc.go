// Package gossip finds the members of a freqring cluster with
// github.com/hashicorp/memberlist and keeps a ring.Ring of the live ones.
// Nodes import it; clients need only package ring.
//
// # Membership and the ring
//
// Each node announces small metadata (see meta.go): its gRPC address, its
// State and a random boot number. The ring counts every member memberlist
// holds alive or suspect whose metadata decodes and whose state is
// StateServing. It is rebuilt from a copy of memberlist's member list after
// every join, leave, failure and metadata update, and published (Ring,
// Watch) only when its epoch changes. Suspect members stay in the ring until
// they are declared dead, so a slow node does not move keys.
//
// States: a node starts in StateJoining (a member, not in the ring, so that
// nobody routes to it while it gets ready), moves to StateServing once it can
// decide, and before a graceful exit to StateLeaving: it leaves the ring at
// once, so its keys move while it is still up, then Leave tells peers it is
// gone.
//
// # Joining
//
// Start joins the seeds in Config.Join. memberlist resolves a DNS name to all
// of its addresses and contacts each. Start retries with jittered exponential
// backoff (100ms to 5s) until one address answers or ctx ends; a node with no
// seeds forms a cluster of one. Every RejoinInterval (10s) the seeds are
// joined again, which merges clusters that started apart or split.
//
// A node that restarts under the same name comes back at once when it has
// the same address, or a new address after a graceful Leave. If it crashed
// and comes back from a new address (a new pod IP), peers ignore it until the
// old member has been dead for DeadNodeReclaimTime (5s), then take it at its
// next push-pull or rejoin. Right after a Leave and restart, the leave message
// still in flight can mark the new member dead for a moment (it refutes it
// within milliseconds); rings may flip once.
//
// # Timings
//
// memberlist's LAN defaults, halved for failure detection in one data
// center or one Kubernetes cluster, where round trips are under a millisecond:
//
//   - ProbeInterval 500ms (LAN 1s): each member probes one other member per
//     interval, round robin, so a dead member is probed within about one
//     interval.
//   - ProbeTimeout 250ms (LAN 500ms): wait for a direct ack before asking up
//     to 3 other members to probe indirectly, plus a TCP probe; the probe
//     fails at the end of the interval. It tolerates GC pauses and CPU
//     throttling of a few hundred ms; memberlist's Lifeguard stretches it up
//     to 8x on a member that is itself slow.
//   - SuspicionMult 4: a suspect member has at least
//     4*max(1, log10(members))*ProbeInterval to refute: 2s up to 10 members,
//     4s at 100. The timer starts 6x longer (12s) and falls to that minimum as
//     2 other members confirm the suspicion (at once in clusters under 4).
//   - GossipInterval 200ms (LAN default): every 200ms a member sends queued
//     news to 3 random members; news reaches everyone in about
//     log(members) rounds.
//   - PushPullInterval 15s (LAN 30s): full state exchange with one random
//     member, which repairs anything gossip missed.
//   - TCPTimeout 3s (LAN 10s): join, push-pull and TCP probes; it also bounds
//     how long Close waits for a join in flight.
//   - DeadNodeReclaimTime 5s (memberlist: never): see above.
//
// Expected detection of a crash: about 0.5–1s until a failed probe, 2s of
// suspicion, and one gossip round: about 3s for up to 10 members, at most
// about 13s when confirmations are slow in a larger cluster. Measured by
// TestCluster with 3 members on one host: crash to converged rings 3.0–3.7s
// (4.1s under -race on a busy 2-core machine); after Leave 0.2–0.4s; a
// restarted member rejoins in about 0.2s.
//
// # Clocks and fast failover
//
// Members measure each other's wall clocks over memberlist's user messages
// (clock.go): a member whose clock is beyond Config.MaxClockSkew of a
// strict majority's publishes so in its metadata and is left out of every
// ring until it is back (MemberState.Excluded says why; Clock reports a
// member's own judgment). A node whose call to a member fails asks Suspect
// to look (down.go): if the member's gRPC address refuses connections, its
// process is gone, and it is out of the ring at once rather than after the
// failure detection above; each member that hears the claim looks for
// itself.
//
// # Transport
//
// Config.Transport replaces memberlist's UDP and TCP sockets. The tests run
// clusters inside one process on the transports of one memberlist.MockNetwork
// (TestMockNetworkCluster), whose limits they work around:
//
//   - NewTransport is not safe for concurrent use, nor while the network
//     carries traffic: make every transport before the first Start.
//   - A packet or stream is handed over with no buffer, so a send waits until
//     the receiver reads it. memberlist answers a ping from the goroutine
//     that reads packets, so two members pinging each other at once can
//     deadlock. Shutdown does nothing, so a send or dial to a closed member
//     blocks its sender for ever (the dial timeout is not used).
//   - Addresses are labels, "127.0.0.1:1", "127.0.0.1:2", ... in the order
//     the transports were made: seeds are given as those labels, and a seed
//     that is a DNS name (a Kubernetes headless service) cannot be tried.
//
// The tests wrap each mock transport to buffer what arrives and drop it once
// shut down, as a socket would.
//
// # Logging
//
// Membership logs joins, leaves, state changes and ring changes at Info.
// memberlist's own lines go to the same logger at Debug, or at Warn for its
// [ERR] and [WARN] lines. memberlist logs a line for each packet it refuses,
// and anyone who reaches the gossip port of a plaintext cluster can send
// packets it refuses, so every [ERR] and [WARN] line is counted
// (Stats.Warnings) and at most one line of a kind (its leading words; every
// undecodable packet is one kind) is logged every 10 s, with not_logged, the
// number of that kind left out since (Stats.WarningsNotLogged). A nil Logger
// discards everything.
//
// # Encryption
//
// Without Config.Keyring, gossip is neither encrypted nor authenticated:
// anyone who reaches the gossip port can join. With a Keyring (AES-GCM,
// memberlist's keyring), every packet and stream is encrypted with the
// primary key and one that no key opens is dropped, so a node without a
// shared key cannot join. Keyring.Set rotates keys on a running member; the
// Keyring comment gives the three steps.
package gossip
