package gossip

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

// testKey returns a 32-byte key filled with b.
func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func keyring(t *testing.T, keys ...[]byte) *Keyring {
	t.Helper()
	k, err := NewKeyring(keys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mustNotJoin starts cfg and wants it to fail to join within 1s.
func mustNotJoin(t *testing.T, cfg Config, why string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if m, err := Start(ctx, cfg); err == nil {
		m.Close()
		t.Fatalf("%s joined an encrypted cluster", why)
	}
}

// TestKeyringKeepsStrangersOut (issue 12, case 5): in a cluster whose gossip
// is encrypted, a node with the key joins, and one without a key or with
// another key cannot, nor does it get into anyone's ring.
func TestKeyringKeepsStrangersOut(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c", "node-d")
	seed := n.byName["node-a"].addr
	k1 := testKey(1)
	cfg := mockConfig(t, n, "node-a")
	cfg.Keyring = keyring(t, k1)
	a := start(t, cfg)
	cfg = mockConfig(t, n, "node-b", seed)
	cfg.Keyring = keyring(t, k1)
	b := start(t, cfg)
	eventually(t, 10*time.Second, "a and b converge", converged([]*Membership{a, b}, "node-a", "node-b"))

	mustNotJoin(t, mockConfig(t, n, "node-c", seed), "a node without a key")
	cfg = mockConfig(t, n, "node-d", seed)
	cfg.Keyring = keyring(t, testKey(2))
	mustNotJoin(t, cfg, "a node with another key")
	if err := converged([]*Membership{a, b}, "node-a", "node-b")(); err != nil {
		t.Fatalf("after the strangers tried: %v", err)
	}
}

// TestKeyRotation rotates the key of a running two-node cluster in the
// three documented steps: the members keep hearing each other throughout,
// a node with only the new key joins, and one with only the old key no
// longer can.
func TestKeyRotation(t *testing.T) {
	n := newMockNet(t, "node-a", "node-b", "node-c", "node-d")
	seed := n.byName["node-a"].addr
	oldKey, newKey := testKey(1), testKey(2)
	ka, kb := keyring(t, oldKey), keyring(t, oldKey)
	cfg := mockConfig(t, n, "node-a")
	cfg.Keyring = ka
	a := start(t, cfg)
	cfg = mockConfig(t, n, "node-b", seed)
	cfg.Keyring = kb
	b := start(t, cfg)
	ab := []*Membership{a, b}
	eventually(t, 10*time.Second, "a and b converge", converged(ab, "node-a", "node-b"))

	for i, step := range [][][]byte{{oldKey, newKey}, {newKey, oldKey}, {newKey}} {
		for _, k := range []*Keyring{ka, kb} {
			if err := k.Set(step); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		// b's state changes travel to a under the new primary.
		if err := b.SetState(wait5s(t), StateJoining); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, fmt.Sprintf("step %d: a sees b leave its ring", i), converged(ab, "node-a"))
		if err := b.SetState(wait5s(t), StateServing); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, fmt.Sprintf("step %d: a sees b back", i), converged(ab, "node-a", "node-b"))
	}
	if got := ka.Keys(); len(got) != 1 || !bytes.Equal(got[0], newKey) {
		t.Fatalf("keys after rotation: %x", got)
	}
	cfg = mockConfig(t, n, "node-d", seed)
	cfg.Keyring = keyring(t, oldKey)
	mustNotJoin(t, cfg, "a node with only the old key")
	cfg = mockConfig(t, n, "node-c", seed)
	cfg.Keyring = keyring(t, newKey)
	c := start(t, cfg)
	eventually(t, 10*time.Second, "c joins with the new key", converged([]*Membership{a, b, c}, "node-a", "node-b", "node-c"))
}

func TestKeyringRejectsBadKeys(t *testing.T) {
	k := keyring(t, testKey(1))
	for _, tc := range []struct {
		name string
		keys [][]byte
		want string
	}{
		{"none", nil, "no keys"},
		{"short", [][]byte{testKey(1), make([]byte, 15)}, "key 1 is 15 bytes"},
		{"repeated", [][]byte{testKey(1), testKey(2), testKey(1)}, "key 2 repeats key 0"},
	} {
		if err := k.Set(tc.keys); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Set: %v, want %q", tc.name, err, tc.want)
		}
		if _, err := NewKeyring(tc.keys); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewKeyring: %v, want %q", tc.name, err, tc.want)
		}
	}
	if got := k.Keys(); len(got) != 1 || !bytes.Equal(got[0], testKey(1)) {
		t.Fatalf("a refused Set changed the keys: %x", got)
	}
}

func TestParseKeys(t *testing.T) {
	b64 := func(k []byte) string { return base64.StdEncoding.EncodeToString(k) }
	keys, err := ParseKeys([]byte("# rotated 2026-11\n\n" + b64(testKey(2)) + "\n  " + b64(testKey(1)[:16]) + "  \n"))
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], testKey(2)) || !bytes.Equal(keys[1], testKey(1)[:16]) {
		t.Fatalf("ParseKeys: %x, %v", keys, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "no key"},
		{"# only a comment\n", "no key"},
		{b64(testKey(1)) + "\nnot base64!\n", "line 2: not base64"},
		{b64(make([]byte, 20)), "line 1: 20 bytes"},
		{b64(testKey(1)) + "\n" + b64(testKey(1)), "line 2: a key already listed"},
	} {
		if _, err := ParseKeys([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKeys(%q): %v, want %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(base64.StdEncoding.EncodeToString(testKey(1)) + "\n# c\n" + base64.StdEncoding.EncodeToString(testKey(2)[:24])))
	f.Add([]byte("\n\n#\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := ParseKeys(b)
		if err != nil {
			return
		}
		if _, err := NewKeyring(keys); err != nil {
			t.Fatalf("ParseKeys accepted keys NewKeyring refuses: %v", err)
		}
		var out []string
		for _, k := range keys {
			out = append(out, base64.StdEncoding.EncodeToString(k))
		}
		again, err := ParseKeys([]byte(strings.Join(out, "\n")))
		if err != nil || len(again) != len(keys) {
			t.Fatalf("round trip: %v, %d keys, want %d", err, len(again), len(keys))
		}
	})
}
