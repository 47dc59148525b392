package node

import (
	"cmp"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/rules"
)

// heldFsyncs is an Observer that, once armed, holds every WAL fsync of its
// node until released.
type heldFsyncs struct {
	recordingObserver
	armed atomic.Bool
	hit   chan struct{} // a value when an fsync waits
	open  chan struct{} // closed by release
	once  sync.Once
}

func (h *heldFsyncs) release() { h.once.Do(func() { close(h.open) }) }

func (h *heldFsyncs) Fsync(d time.Duration) {
	if h.armed.Load() {
		select {
		case h.hit <- struct{}{}:
		default:
		}
		<-h.open
	}
	h.recordingObserver.Fsync(d)
}

// TestDurabilityOfADomain: with its WAL's fsyncs held back, a node alone
// answers a check of a domain of durability async at once (the sync loop
// fsyncs it later), and one of fsync, replicated (there is no backup to
// hold the send) or of a domain that names none (the default, replicated)
// only once the fsync is done.
func TestDurabilityOfADomain(t *testing.T) {
	for _, tc := range []struct {
		durability string // the domain's; "" is the node's default
		waits      bool
	}{{"fsync", true}, {"", true}, {"replicated", true}, {"async", false}} {
		t.Run(cmp.Or(tc.durability, "default"), func(t *testing.T) {
			clk := &testClock{}
			clk.set(t0)
			cfg := durableConfig(t, t.TempDir(), clk)
			cfg.Rules = durabilityRules(t, tc.durability)
			obs := &heldFsyncs{hit: make(chan struct{}, 1), open: make(chan struct{})}
			cfg.Observer = obs
			n := openNode(t, cfg)
			defer n.Close()
			defer obs.release() // before Close
			obs.armed.Store(true)
			done := make(chan error, 1)
			go func() {
				resp, err := n.Check(context.Background(), &pb.CheckRequest{Recipients: []string{"a"}, Domains: []string{"d"}})
				if err == nil && (len(resp.Errors) > 0 || !resp.Admitted[0]) {
					t.Errorf("check: %v", resp)
				}
				done <- err
			}()
			if tc.waits {
				<-obs.hit
				select {
				case err := <-done:
					t.Fatalf("answered (%v) while the WAL's fsync was held back", err)
				case <-time.After(300 * time.Millisecond): // a wrong answer comes at once; a right one never
				}
				obs.release()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no answer in 10 s: the check waits for an fsync held back")
			}
		})
	}
}

// durabilityRules returns a rules set of one domain, d, of the durability
// named ("": none named).
func durabilityRules(t *testing.T, durability string) *rules.Set {
	t.Helper()
	yaml := "domains:\n- name: d\n  rules:\n  - {name: r, scope: recipient, limit: 5, window: 1m}\n"
	if durability != "" {
		yaml = strings.Replace(yaml, "- name: d\n", "- name: d\n  durability: "+durability+"\n", 1)
	}
	rs, err := rules.Parse("t", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
