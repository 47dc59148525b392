package node

import (
	"fmt"
	"net"
)

// advertiseFor returns the address to advertise for a listener at addr:
// addr itself, or, for a listener on every interface (0.0.0.0, ::), the
// same port at this host's address on its default route (else its first
// address other than loopback and link-local), which clients and peers can
// dial. With no such address it fails, saying to set the address.
func advertiseFor(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		return addr, nil
	}
	ip := routableIP()
	if ip == nil {
		return "", fmt.Errorf("node: the listener is on every interface (%s) and this host has no address other than loopback to advertise: set the address clients and peers dial (--advertise HOST:PORT)", addr)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// routableIP returns the source address of this host's default route, or
// its first global unicast address, IPv4 before IPv6; nil if it has none.
func routableIP() net.IP {
	// A UDP "connection" sends nothing: it only picks the source address
	// the routing table would use.
	for _, probe := range []string{"192.0.2.1:9", "[2001:db8::1]:9"} {
		if c, err := net.Dial("udp", probe); err == nil {
			ip := c.LocalAddr().(*net.UDPAddr).IP
			c.Close()
			if ip.IsGlobalUnicast() {
				return ip
			}
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var v6 net.IP
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP
		}
		if v6 == nil {
			v6 = n.IP
		}
	}
	return v6
}

// unroutable reports whether addr's host is a wildcard (0.0.0.0, ::) that
// no client or peer can dial.
func unroutable(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}
