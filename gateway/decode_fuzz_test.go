package gateway

import (
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// FuzzDecodeCheck: DecodeCheck never panics; what it refuses it refuses with
// a fieldError naming a field; what it accepts is JSON, has one entry per
// item in every column, valid UTF-8 in recipients, domains and contents,
// costs in [1, MaxCost], known modes, and decodes the same again from its
// own re-encoding. An item that fails alone names its index and field.
//
// It also checks DecodeCheck against decodeCheckStd, the encoding/json
// decoder it replaced: what DecodeCheck accepts whole, that accepted the
// same; what that accepted and DecodeCheck refuses or fails, DecodeCheck
// refuses for a reason it was written for.
func FuzzDecodeCheck(f *testing.F) {
	for _, s := range []string{
		`{"recipient":"a"}`,
		`{"recipient":"a","content":"hi","domain":"fast","cost":3,"mode":"peek","request_id":"18446744073709551615"}`,
		`{"items":[{"recipient":"a"},{"recipient":"b","mode":"refund","request_id":"7"}]}`,
		`{"items":[]}`, `{"items":[{"recipient":"a","cost":0}]}`, `{"recipient":"a","cost":1.5}`, `{"recipient":1}`,
		`{"recipient":"a"} x`, `[]`, `null`, `{"items":null,"recipient":"a"}`, `{"recipient":"a","cost":"2"}`,
		// invalid UTF-8, raw and as lone surrogate escapes, in each string field
		"{\"recipient\":\"a\xff\"}", `{"recipient":"a\ud800"}`, `{"recipient":"\udc00\ud800"}`, `{"recipient":"\ud83d\ude00"}`,
		"{\"items\":[{\"recipient\":\"a\"},{\"recipient\":\"\xc3\"},{\"recipient\":\"b\",\"domain\":\"\xed\xa0\x80\"}]}",
		"{\"recipient\":\"a\",\"content\":\"\xfe\"}", "{\"recipient\":\"a\",\"mode\":\"\xff\"}", "{\"recipient\":\"a\",\"\xff\":1}",
		// duplicate keys, and keys in another case
		`{"recipient":"a","recipient":"b"}`, `{"items":[{"recipient":"a","cost":1,"cost":2}]}`, `{"items":[],"items":[]}`,
		`{"recipient":null,"recipient":"a"}`, `{"Recipient":"a"}`, `{"recipient":"a","RECIPIENT":"b"}`,
		// numbers as strings, and numbers at the edges
		`{"recipient":"a","cost":"5"}`, `{"recipient":"a","cost":1e2}`, `{"recipient":"a","cost":-0}`, `{"recipient":"a","cost":99999999999999999999}`,
		`{"recipient":"a","request_id":"+5"}`, `{"recipient":"a","request_id":5}`,
		// escapes
		`{"recip\u0069ent":"\"\\\/\b\f\n\r\t\u00e9"}`, `{"recipient":"\x"}`, `{"recipient":"\u12"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, batch, failed, err := DecodeCheck(body)
		ref, refBatch, refErr := decodeCheckStd(body)
		if err != nil {
			var fe *fieldError
			if !errors.As(err, &fe) || fe.field == "" {
				t.Fatalf("error %v is not a fieldError naming a field", err)
			}
			if refErr == nil && !newRefusal(err.Error()) {
				t.Fatalf("refused %q with %v; encoding/json took it", body, err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted %q, which is not JSON", body)
		}
		n := len(req.Recipients)
		if (n == 0 && len(failed) == 0) || (!batch && (n != 1 || len(failed) != 0)) || len(req.Domains) != n || len(req.Contents) != n || len(req.Costs) != n || len(req.Modes) != n || len(req.RequestIds) != n {
			t.Fatalf("columns of %d items (batch %v, %d failed): %v", n, batch, len(failed), req)
		}
		for k, fi := range failed {
			var fe *fieldError
			if !errors.As(fi.Err, &fe) || !regexp.MustCompile(`^items\[`+strconv.Itoa(fi.Index)+`\]\.(recipient|domain|content)$`).MatchString(fe.field) ||
				!strings.Contains(fe.msg, "not valid UTF-8") || (k > 0 && failed[k-1].Index >= fi.Index) || fi.Index >= n+len(failed) {
				t.Fatalf("failed item %d: %v", fi.Index, fi.Err)
			}
		}
		if len(failed) == 0 && (refErr != nil || refBatch != batch || !equalRequests(req, ref)) {
			t.Fatalf("%q: %v (batch %v), encoding/json %v %v (batch %v)", body, req, batch, ref, refErr, refBatch)
		}
		if n == 0 {
			return
		}
		items := make([]map[string]any, n)
		for i := range n {
			if req.Recipients[i] == "" || req.Costs[i] < 1 || req.Costs[i] > MaxCost ||
				!utf8.ValidString(req.Recipients[i]) || !utf8.ValidString(req.Domains[i]) || !utf8.Valid(req.Contents[i]) {
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
		req2, batch2, failed2, err := DecodeCheck(again)
		if err != nil || batch2 != batch || len(failed2) != 0 || !equalRequests(req, req2) {
			t.Fatalf("re-encoded %s: %v %v, want %v", again, req2, err, req)
		}
	})
}

// newRefusal reports whether msg refuses what encoding/json took and
// DecodeCheck may not: a duplicate key, a key in another case, a cost as a
// string, a string that is not UTF-8.
func newRefusal(msg string) bool {
	for _, s := range []string{"duplicate key", "keys are case-sensitive", "a JSON string, want a number", "not valid UTF-8"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
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
