// Package bench measures and audits freqring: a workload model of the seed's
// traffic, load generators, and Audit, the oracle that replays admitted
// sends against the rules and counts over-admissions.
//
// The seed 004 workload (api.go, RunAPI) is an open platform's API calls,
// each two checks: app\x1fip in domain api-ip (10,000 an hour) and
// app\x1fuser\x1finterface in api-user (1,000 an hour); a call is allowed
// only if both admit. The two keys live on different nodes, so freqring
// decides them independently, not atomically (each key records its own
// admitted check; APIFreqringTarget.Refund takes back a key's admission when
// the other key denied the call); the Redis targets run seed 004's fixed
// hourly counters or seed 003's hash of sub-window counters, both keys in one
// script. AuditKeys replays what each key recorded against the fixed-window
// and sliding-counter definitions, and the exact sliding window.
package bench
