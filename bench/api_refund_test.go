package bench

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/freqring/freqring/client"
)

// TestSettleRefunds checks the refund bookkeeping the oracle relies on: a
// send counts unless its refund was taken back for certain (Refunded, or
// Duplicate: an earlier attempt of the same refund took it back), a degraded
// refund is sent again with the same request id, and one never settled fails
// its call and is left out of the replay.
func TestSettleRefunds(t *testing.T) {
	type answer struct {
		dec  client.Decision
		fail bool
	}
	refunded := answer{dec: client.Decision{Refunded: true}}
	dup := answer{dec: client.Decision{Duplicate: true}}
	degraded := answer{dec: client.Decision{Degraded: true, Admitted: true}}
	kept := answer{dec: client.Decision{}}
	refused := answer{fail: true}
	for _, tc := range []struct {
		name     string
		answers  []answer // the answers to the successive attempts
		recorded bool     // whether the send still counts afterwards
		failed   bool     // whether the call fails
	}{
		{"refunded", []answer{refunded}, false, false},
		{"duplicate", []answer{dup}, false, false},
		{"not taken back", []answer{kept}, true, false},
		{"refused", []answer{refused}, true, true},
		{"degraded then duplicate", []answer{degraded, dup}, false, false},
		{"degraded then refunded", []answer{degraded, degraded, refunded}, false, false},
		{"never settled", []answer{degraded, degraded, degraded, degraded, degraded}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k := range 2 { // the ip key, then the user key
				out := []CallResult{{IPRecorded: true, UserRecorded: true}, {IPRecorded: true, UserRecorded: true}}
				item := client.Item{Recipient: "r", Mode: client.Refund, RequestID: 77}
				calls := 0
				decide := func(_ context.Context, items []client.Item) ([]client.Decision, []error, error) {
					if len(items) != 1 || items[0].RequestID != 77 {
						t.Fatalf("attempt %d sent %+v, want the refund again with its request id", calls, items)
					}
					if calls >= len(tc.answers) {
						t.Fatalf("attempt %d: the refund was settled already", calls)
					}
					a := tc.answers[calls]
					calls++
					if a.fail {
						return []client.Decision{{}}, []error{&client.ItemError{Code: codes.NotFound, Message: "nothing refunded"}}, nil
					}
					return []client.Decision{a.dec}, []error{nil}, nil
				}
				if err := settleRefunds(context.Background(), decide, []client.Item{item}, []int{2 + k}, out); err != nil {
					t.Fatal(err)
				}
				if calls != len(tc.answers) {
					t.Fatalf("%d attempts, want %d", calls, len(tc.answers))
				}
				got := []bool{out[1].IPRecorded, out[1].UserRecorded}
				if got[k] != tc.recorded || !got[1-k] || !out[0].IPRecorded || !out[0].UserRecorded {
					t.Fatalf("key %d: recorded %v (call 0: %+v), want key %d %v and the rest untouched", k, got, out[0], k, tc.recorded)
				}
				if (out[1].Err != nil) != tc.failed || out[0].Err != nil {
					t.Fatalf("key %d: call errors %v, %v; want the refunded call failed = %v", k, out[0].Err, out[1].Err, tc.failed)
				}
			}
		})
	}
}
