package gateway

import (
	"encoding/json"
	"errors"
	"strconv"
	"testing"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// FuzzDecodeCheck: DecodeCheck never panics; what it refuses it refuses with
// a fieldError naming a field; what it accepts has one entry per item in
// every column, costs in [1, MaxCost], known modes, and decodes the same
// again from its own re-encoding.
func FuzzDecodeCheck(f *testing.F) {
	for _, s := range []string{
		`{"recipient":"a"}`,
		`{"recipient":"a","content":"hi","domain":"fast","cost":3,"mode":"peek","request_id":"18446744073709551615"}`,
		`{"items":[{"recipient":"a"},{"recipient":"b","mode":"refund","request_id":"7"}]}`,
		`{"items":[]}`, `{"items":[{"recipient":"a","cost":0}]}`, `{"recipient":"a","cost":1.5}`, `{"recipient":1}`,
		`{"recipient":"a"} x`, `[]`, `null`, `{"items":null,"recipient":"a"}`, `{"recipient":"a","cost":"2"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, batch, err := DecodeCheck(body)
		if err != nil {
			var fe *fieldError
			if !errors.As(err, &fe) || fe.field == "" {
				t.Fatalf("error %v is not a fieldError naming a field", err)
			}
			return
		}
		n := len(req.Recipients)
		if n == 0 || (!batch && n != 1) || len(req.Domains) != n || len(req.Contents) != n || len(req.Costs) != n || len(req.Modes) != n || len(req.RequestIds) != n {
			t.Fatalf("columns of %d items (batch %v): %v", n, batch, req)
		}
		items := make([]map[string]any, n)
		for i := range n {
			if req.Recipients[i] == "" || req.Costs[i] < 1 || req.Costs[i] > MaxCost {
				t.Fatalf("item %d: %v", i, req)
			}
			mode := ""
			for name, m := range modes {
				if m == req.Modes[i] {
					mode = name
				}
			}
			if mode == "" {
				t.Fatalf("item %d: mode %v", i, req.Modes[i])
			}
			it := map[string]any{"recipient": req.Recipients[i], "domain": req.Domains[i], "content": string(req.Contents[i]),
				"cost": req.Costs[i], "mode": mode}
			if req.RequestIds[i] != 0 {
				it["request_id"] = strconv.FormatUint(req.RequestIds[i], 10)
			}
			items[i] = it
		}
		var again []byte
		if batch {
			again, _ = json.Marshal(map[string]any{"items": items})
		} else {
			again, _ = json.Marshal(items[0])
		}
		req2, batch2, err := DecodeCheck(again)
		if err != nil || batch2 != batch || !equalRequests(req, req2) {
			t.Fatalf("re-encoded %s: %v %v, want %v", again, req2, err, req)
		}
	})
}

func equalRequests(a, b *pb.CheckRequest) bool {
	if len(a.Recipients) != len(b.Recipients) {
		return false
	}
	for i := range a.Recipients {
		if a.Recipients[i] != b.Recipients[i] || a.Domains[i] != b.Domains[i] || string(a.Contents[i]) != string(b.Contents[i]) ||
			a.Costs[i] != b.Costs[i] || a.Modes[i] != b.Modes[i] || a.RequestIds[i] != b.RequestIds[i] {
			return false
		}
	}
	return true
}
