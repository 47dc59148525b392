package gossip

import (
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBadPacketsRateLimited is issue 12's case 10 for gossip: 5,900 lines
// about undecodable packets in 0.8 s log one line, and the next one a second
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
	w.Write([]byte("[WARN] memberlist: Got ping for unexpected node 'x' from=127.0.0.1:5\n")) // not a bad packet: logged
	now = now.Add(time.Second)
	w.Write([]byte("[WARN] memberlist: Got invalid checksum for UDP packet: 1, 2\n"))
	want := `level=WARN msg="msg type (%d) not supported 127.0.0.1:5 (packet)" component=memberlist
level=WARN msg="Got ping for unexpected node 'x' from=127.0.0.1:5" component=memberlist
level=WARN msg="Got invalid checksum for UDP packet: 1, 2" component=memberlist bad_packets_not_logged=5899
`
	if sb.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", sb.String(), want)
	}
	if got := w.badPackets.Load(); got != 5901 {
		t.Fatalf("%d bad packets counted, want 5901", got)
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
