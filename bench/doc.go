// Package bench measures and audits freqring: a workload model of the seed's
// traffic, load generators, and Audit, the oracle that replays admitted sends
// against the rules and counts over-admissions.
package bench
