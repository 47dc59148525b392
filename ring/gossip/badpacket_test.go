package gossip

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBadPacketsRateLimited is issue 12's case 10 for gossip: 5,900 lines
// about undecodable packets in 0.8 s log one line, and the next one 10 s
// later says how many were left out; all are counted.
func TestBadPacketsRateLimited(t *testing.T) {
	var sb strings.Builder
	now := time.Unix(1_800_000_000, 0)
	w := &logWriter{log: slog.New(slog.NewTextHandler(&sb, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return cmpTime(a) },
	})), now: func() time.Time { return now }}
	for i := range 5900 {
		now = now.Add(800 * time.Millisecond / 5900)
		msg := []string{"[ERR] memberlist: msg type (%d) not supported 127.0.0.1:5 (packet)\n",
			"[ERR] memberlist: Failed to decode ping request: EOF from=127.0.0.1:5\n"}[i%2]
		w.Write([]byte(msg))
	}
	w.Write([]byte("[WARN] memberlist: Got ping for unexpected node 'x' from=127.0.0.1:5\n")) // another kind: logged
	now = now.Add(logEvery)
	w.Write([]byte("[WARN] memberlist: Got invalid checksum for UDP packet: 1, 2\n"))
	want := `level=WARN msg="msg type (%d) not supported 127.0.0.1:5 (packet)" component=memberlist
level=WARN msg="Got ping for unexpected node 'x' from=127.0.0.1:5" component=memberlist
level=WARN msg="Got invalid checksum for UDP packet: 1, 2" component=memberlist not_logged=5899
`
	if sb.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", sb.String(), want)
	}
	if got := w.badPackets.Load(); got != 5901 {
		t.Fatalf("%d bad packets counted, want 5901", got)
	}
	if w, n := w.warnings.Load(), w.notLogged.Load(); w != 5902 || n != 5899 {
		t.Fatalf("%d warnings, %d not logged; want 5902, 5899", w, n)
	}
}

// TestWarningsRateLimitedByKind: every memberlist warning is rate-limited
// by its kind, not only those about bad packets: 5,000 lines of one kind
// (their node names differ) in 5 s, and one more 1 ms short of 10 s after
// the first, log one line, and the next one, 10 s after it, says how many
// were left out; a line of another kind in between
// is logged; kinds past maxLogKinds share one. All are counted.
func TestWarningsRateLimitedByKind(t *testing.T) {
	var sb strings.Builder
	now := time.Unix(1_800_000_000, 0)
	w := &logWriter{log: slog.New(slog.NewTextHandler(&sb, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return cmpTime(a) },
	})), now: func() time.Time { return now }}
	first := now.Add(time.Millisecond) // the first line's time
	for i := range 5000 {
		now = now.Add(time.Millisecond)
		w.Write(fmt.Appendf(nil, "[WARN] memberlist: Got ping for unexpected node 'n%d' from=127.0.0.1:5\n", i))
		if i%1000 == 0 {
			w.Write([]byte("[ERR] memberlist: Failed to send ping: write: connection refused\n"))
			w.Write([]byte("[DEBUG] memberlist: Stream connection from=127.0.0.1:5\n")) // not a warning: never limited
		}
	}
	now = first.Add(logEvery - time.Millisecond)
	w.Write([]byte("[WARN] memberlist: Got ping for unexpected node 'early' from=127.0.0.1:5\n")) // left out
	now = first.Add(logEvery)
	w.Write([]byte("[WARN] memberlist: Got ping for unexpected node 'last' from=127.0.0.1:5\n"))
	want := `level=WARN msg="Got ping for unexpected node 'n0' from=127.0.0.1:5" component=memberlist
level=WARN msg="Failed to send ping: write: connection refused" component=memberlist
level=WARN msg="Got ping for unexpected node 'last' from=127.0.0.1:5" component=memberlist not_logged=5000
`
	if sb.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", sb.String(), want)
	}
	if w, n, b := w.warnings.Load(), w.notLogged.Load(), w.badPackets.Load(); w != 5007 || n != 5004 || b != 0 {
		t.Fatalf("%d warnings, %d not logged, %d bad packets; want 5007, 5004, 0", w, n, b)
	}

	// A peer that varies its text makes at most maxLogKinds kinds, then one.
	sb.Reset()
	for i := range 2 * maxLogKinds {
		w.Write(fmt.Appendf(nil, "[WARN] memberlist: Kind %c%c of text\n", 'a'+i/26, 'a'+i%26))
	}
	if got := strings.Count(sb.String(), "\n"); got != maxLogKinds-2+1 { // two kinds are known already
		t.Fatalf("%d lines for %d kinds, want %d:\n%s", got, 2*maxLogKinds, maxLogKinds-1, sb.String())
	}
}

// TestCraftedPacketsRateLimited sends 5,000 copies of a crafted packet that
// decodes (a ping for a member of another name, as anyone who reaches the
// gossip port of a plaintext cluster can) to a member over the in-memory
// network: all are counted as warnings, and the member logs at most one line
// of their kind every 10 s.
func TestCraftedPacketsRateLimited(t *testing.T) {
	n := newMockNet(t, "node-a", "evil")
	var sb syncBuilder
	cfg := mockConfig(t, n, "node-a")
	cfg.Logger = slog.New(slog.NewTextHandler(&sb, nil))
	begin := time.Now()
	a := start(t, cfg)
	// pingMsg (0), then msgpack {"SeqNo": 1, "Node": "x"}.
	ping := append([]byte{0, 0x82, 0xa5}, "SeqNo\x01\xa4Node\xa1x"...)
	for range 5000 {
		if _, err := n.byName["evil"].WriteTo(ping, a.GossipAddr()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "5,000 warnings counted", func() error {
		if s := a.Stats(); s.Warnings < 5000 || s.WarningsNotLogged < 5000-1-int64(time.Since(begin)/logEvery) {
			return errorf("%+v", s)
		}
		return nil
	})
	lines := strings.Count(sb.String(), "Got ping for unexpected node")
	if most := 1 + int(time.Since(begin)/logEvery); lines == 0 || lines > most {
		t.Fatalf("%d lines about the crafted pings, want 1 to %d:\n%s", lines, most, sb.String())
	}
}

// TestBadPacketsCounted sends random bytes to a member's gossip port: they
// are counted, and the member stays well.
func TestBadPacketsCounted(t *testing.T) {
	var sb syncBuilder
	m := start(t, testConfig(slog.New(slog.NewTextHandler(&sb, nil)), "node-a"))
	conn, err := net.Dial("udp", m.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		b := make([]byte, 1+rng.IntN(200))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		conn.Write(b)
	}
	eventually(t, 10*time.Second, "bad packets counted", func() error {
		if m.Stats().BadPackets == 0 {
			return errorf("none counted; log:\n%s", sb.String())
		}
		return nil
	})
	if m.Ring().Len() != 1 {
		t.Fatalf("ring of %d members", m.Ring().Len())
	}
}

// syncBuilder is a strings.Builder safe for concurrent writes.
type syncBuilder struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *syncBuilder) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *syncBuilder) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}
