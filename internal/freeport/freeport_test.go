package freeport

import (
	"fmt"
	"net"
	"testing"
)

func TestPortsAreFreeAndBelowTheEphemeralRange(t *testing.T) {
	lo, hi := portRange()
	for _, udp := range []bool{false, true} {
		for range 20 {
			port, err := pick(udp)
			if err != nil {
				t.Fatal(err)
			}
			if port < lo || port > hi {
				t.Fatalf("port %d outside [%d, %d]", port, lo, hi)
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatalf("port %d not free for TCP: %v", port, err)
			}
			l.Close()
		}
	}
}

func TestTakenPortIsNotFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if free(l.Addr().(*net.TCPAddr).Port, false) {
		t.Fatal("a port with a listener reported free")
	}
}
