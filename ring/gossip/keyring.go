package gossip

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/hashicorp/memberlist"
)

// Keyring holds the keys that encrypt and authenticate gossip (memberlist's
// AES-GCM keyring): the first key is the primary, which encrypts what this
// node sends; every key decrypts what it receives. A Membership with a
// Keyring drops every packet and stream that no key opens, plaintext ones
// included. It is safe for concurrent use; Set changes the keys of a running
// Membership.
//
// Rotation, one step at a time on every node before the next: add the new
// key as a secondary (old, new), make it the primary (new, old), remove the
// old (new). At each step every node still opens what every other sends.
type Keyring struct {
	mu sync.Mutex // serialises Set
	kr *memberlist.Keyring
}

// Key lengths memberlist accepts: AES-128, AES-192, AES-256.
var keyLens = []int{16, 24, 32}

// NewKeyring returns a keyring of keys, primary first; see Set for what
// keys may be.
func NewKeyring(keys [][]byte) (*Keyring, error) {
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("gossip: keyring: %w", err)
	}
	return &Keyring{kr: kr}, nil
}

// checkKeys returns an error naming the first bad key of keys.
func checkKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("gossip: keyring: no keys")
	}
	for i, k := range keys {
		ok := false
		for _, l := range keyLens {
			ok = ok || len(k) == l
		}
		if !ok {
			return fmt.Errorf("gossip: keyring: key %d is %d bytes, want 16, 24 or 32", i, len(k))
		}
		for j := range i {
			if bytes.Equal(keys[j], k) {
				return fmt.Errorf("gossip: keyring: key %d repeats key %d", i, j)
			}
		}
	}
	return nil
}

// Set makes keys the keyring's keys, keys[0] the primary: it adds the new
// ones, switches the primary, then removes those not in keys. keys must be
// 1 or more distinct keys of 16, 24 or 32 bytes; otherwise Set changes
// nothing and says which key is bad.
func (k *Keyring) Set(keys [][]byte) error {
	if err := checkKeys(keys); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		if err := k.kr.AddKey(key); err != nil {
			return fmt.Errorf("gossip: keyring: %w", err)
		}
	}
	if err := k.kr.UseKey(keys[0]); err != nil {
		return fmt.Errorf("gossip: keyring: %w", err)
	}
	for _, old := range k.kr.GetKeys() {
		if !containsKey(keys, old) {
			if err := k.kr.RemoveKey(old); err != nil {
				return fmt.Errorf("gossip: keyring: %w", err)
			}
		}
	}
	return nil
}

func containsKey(keys [][]byte, k []byte) bool {
	for _, x := range keys {
		if bytes.Equal(x, k) {
			return true
		}
	}
	return false
}

// Keys returns the keys, primary first.
func (k *Keyring) Keys() [][]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.kr.GetPrimaryKey()
	out := [][]byte{p}
	for _, x := range k.kr.GetKeys() {
		if !bytes.Equal(x, p) {
			out = append(out, x)
		}
	}
	return out
}

// ParseKeys parses a gossip keys file: one key a line in standard base64
// (16, 24 or 32 bytes: `head -c 32 /dev/urandom | base64`), the primary
// first; blank lines and lines starting with # are skipped. Errors name the
// line.
func ParseKeys(b []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("gossip: keys line %d: not base64: %w", i+1, err)
		}
		if err := checkKeys([][]byte{k}); err != nil {
			return nil, fmt.Errorf("gossip: keys line %d: %d bytes, want 16, 24 or 32", i+1, len(k))
		}
		if containsKey(keys, k) {
			return nil, fmt.Errorf("gossip: keys line %d: a key already listed", i+1)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("gossip: keys: no key in the file")
	}
	return keys, nil
}
