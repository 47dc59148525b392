// Package console is the web console of a freqring node, served on its
// admin listener at /: the pages the people who run the service use to
// answer "why was this message denied?" and to see the cluster at a
// glance.
//
//   - Recipient (/): a search box, then the explanation of a recipient (the
//     Explain call) as a timeline per rule: its sends as marks in the
//     window, the limit, and when the next message would be admitted; with
//     forms to set an override for the recipient or lift one.
//   - Live (/live): admitted and denied per second per domain and rule
//     over the last 15 minutes, refreshed every second, from the members'
//     own counters (their usage statistics), no Prometheus needed.
//   - Cluster (/cluster): members with their state, partitions, replication
//     lag, clock offset, version and rules hash; an excluded member says why.
//   - Rules (/rules): the rules in force, the last reload and its result,
//     and the overrides, with who set them and when.
//   - Usage (/usage): the usage statistics per domain and day, summed over
//     the members, as a table and a chart.
//
// Pages are server-rendered (html/template) with a little plain
// JavaScript, and everything is embedded in the binary: a page loads
// nothing from elsewhere. Reading is open to whoever reaches the admin
// listener (127.0.0.1 by default). A form that changes state (an override)
// needs one of the node's admin tokens (--admin-token-file) in the form,
// and a CSRF token that matches its cookie. Each recipient lookup is
// logged by the node with the console's caller and counted.
//
// The console reaches the cluster through a Backend (package main
// implements it over gRPC), so it imports no node code: console -> api,
// net/http, html/template.
package console
