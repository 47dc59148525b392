package node

import (
	"encoding/json"
	"slices"
	"testing"
)

// FuzzDecodeMembers: decodeMembers never panics, and what it accepts
// encodes back to a file it decodes to the same names.
func FuzzDecodeMembers(f *testing.F) {
	f.Add([]byte(`{"format":1,"members":["node-0","node-1"]}`))
	f.Add([]byte(`{"format":1,"members":[]}`))
	f.Add([]byte(`{"format":2,"members":["a"]}`))
	f.Add([]byte(`{"format":1,"members":["a","a"]}`))
	f.Add([]byte(`{"format":1,"members":[""]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		names, err := decodeMembers(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(membersJSON{Format: 1, Members: names})
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeMembers(again)
		if err != nil || !slices.Equal(got, names) {
			t.Fatalf("%q decoded to %q, re-encoded to %q (%v)", b, names, got, err)
		}
	})
}
