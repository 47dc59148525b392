package node

import (
	"net"
	"strings"
	"testing"
)

// TestAdvertiseFor: a listener on one address advertises it; one on every
// interface advertises this host's routable address with its port, never
// the wildcard; New refuses a wildcard AdvertiseAddr, saying what to set.
func TestAdvertiseFor(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:7070", "10.1.2.3:7070", "[::1]:7070", "node-0.example:7070"} {
		if got, err := advertiseFor(addr); err != nil || got != addr {
			t.Errorf("advertiseFor(%q) = %q, %v; want it unchanged", addr, got, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:7070", "[::]:7070"} {
		got, err := advertiseFor(addr)
		if routableIP() == nil {
			if err == nil || !strings.Contains(err.Error(), "--advertise") {
				t.Errorf("advertiseFor(%q) on a host with no routable address: %q, %v", addr, got, err)
			}
			continue
		}
		host, port, err2 := net.SplitHostPort(got)
		if err != nil || err2 != nil || port != "7070" || net.ParseIP(host).IsUnspecified() || net.ParseIP(host).IsLoopback() {
			t.Errorf("advertiseFor(%q) = %q, %v; want a routable address, port 7070", addr, got, err)
		}
	}
	for _, addr := range []string{"0.0.0.0:7070", "[::]:7070"} {
		_, err := New(Config{AdvertiseAddr: addr})
		if err == nil || !strings.Contains(err.Error(), "--advertise HOST:PORT") {
			t.Errorf("New(AdvertiseAddr %q): %v, want a refusal naming --advertise", addr, err)
		}
	}
}
