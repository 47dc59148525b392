package node

import (
	"strings"
	"testing"
)

// TestVerifyPeerCall: a signature verifies for its method and time under
// the key it was made with, within PeerCallSkew either way; a changed
// method, name, time or key, a stale or future call and malformed headers
// do not, each with an error that says why.
func TestVerifyPeerCall(t *testing.T) {
	k := peerKey([]byte("0123456789abcdef"))
	other := peerKey([]byte("fedcba9876543210"))
	const method = "/freqring.v1.Peer/Acquire"
	t0 := int64(1_800_000_000_000)
	sig := signPeerCall(k, method, "node-1", t0)
	skew := PeerCallSkew.Milliseconds()
	for _, tc := range []struct {
		name   string
		v      string
		method string
		keys   [][]byte
		now    int64
		want   string // "" for a verified call
	}{
		{"same time", sig, method, [][]byte{k}, t0, ""},
		{"second key", sig, method, [][]byte{other, k}, t0, ""},
		{"skew behind", sig, method, [][]byte{k}, t0 + skew, ""},
		{"skew ahead", sig, method, [][]byte{k}, t0 - skew, ""},
		{"stale", sig, method, [][]byte{k}, t0 + skew + 1, "from this node's clock"},
		{"future", sig, method, [][]byte{k}, t0 - skew - 1, "from this node's clock"},
		{"other method", sig, "/freqring.v1.Peer/Release", [][]byte{k}, t0, "verifies under none"},
		{"other key", sig, method, [][]byte{other}, t0, "verifies under none of this node's 1 cluster keys"},
		{"other name", strings.Replace(sig, "bm9kZS0x", "bm9kZS0y", 1), method, [][]byte{k}, t0, "verifies under none"},
		{"other time", signPeerCall(k, method, "node-1", t0-1)[:len(sig)-43] + sig[len(sig)-43:], method, [][]byte{k}, t0, "verifies under none"},
		{"not v1", "v2" + sig[2:], method, [][]byte{k}, t0, "not a v1 signature"},
		{"empty name", "v1..1.AAAA", method, [][]byte{k}, t0, "bad caller name"},
		{"bad time", "v1.bm9kZS0x.x.AAAA", method, [][]byte{k}, t0, `bad time "x"`},
		{"no key", sig, method, nil, t0, "none of this node's 0 cluster keys"},
	} {
		name, err := verifyPeerCall(tc.v, tc.method, tc.keys, tc.now)
		switch {
		case tc.want == "" && (err != nil || name != "node-1"):
			t.Errorf("%s: %q, %v; want node-1", tc.name, name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %q, %v; want an error with %q", tc.name, name, err, tc.want)
		}
	}
}
