// Package freeport picks ports on 127.0.0.1 for tests that must name a port
// before the process that listens on it starts (a freqring serve run, a
// gossip member).
//
// A port taken by listening on port 0 and closing again is in the kernel's
// ephemeral range, where any outgoing connection of a busy test run may
// take it as its local port before the server binds it ("address already
// in use"). The ports returned here are below that range, which outgoing
// connections and listeners on port 0 never use: only another test that
// picks the same port at the same time can take one.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// low and high bound the ports picked when the kernel's ephemeral range
// cannot be read or leaves no room below it.
const (
	low  = 20000
	high = 32767
)

// TCP returns a port free for TCP on 127.0.0.1, below the ephemeral range.
// Safe for concurrent use.
func TCP() (int, error) { return pick(false) }

// TCPAndUDP returns a port free for both TCP and UDP on 127.0.0.1 (gossip
// uses both), below the ephemeral range. Safe for concurrent use.
func TCPAndUDP() (int, error) { return pick(true) }

func pick(udp bool) (int, error) {
	lo, hi := portRange()
	for range 1000 {
		port := lo + rand.IntN(hi-lo+1)
		if free(port, udp) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("freeport: no free port in [%d, %d] after 1000 tries", lo, hi)
}

// free reports whether port can be bound on 127.0.0.1 for TCP (and UDP).
func free(port int, udp bool) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	if !udp {
		return true
	}
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// portRange returns the ports below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), at most [low, high]; [low,
// high] where it cannot be read or leaves fewer than 1000 ports.
func portRange() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil {
		return low, high
	}
	if first-1 < high {
		hi = first - 1
	} else {
		hi = high
	}
	if hi-low < 1000 {
		return low, high
	}
	return low, hi
}
