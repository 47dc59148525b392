package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// logWriter turns memberlist's log lines ("[LEVEL] memberlist: text\n", one
// per Write) into slog records: [ERR] and [WARN] at Warn, everything else at
// Debug. memberlist logs routine trouble (a failed probe of a dying peer) as
// [ERR], so nothing it says is an Error of ours.
//
// Lines about a packet or stream that does not decode (random bytes sent to
// the gossip port, a member with another key) are counted in badPackets, and
// at most one of them a second is logged, with the number left out since the
// last one. Safe for concurrent use.
type logWriter struct {
	log *slog.Logger
	now func() time.Time // nil means time.Now

	badPackets atomic.Int64
	mu         sync.Mutex // guards lastBad and suppressed
	lastBad    time.Time
	suppressed int64
}

// badPacketLines are the parts of memberlist's lines (v0.7.0) about input
// that does not decode.
var badPacketLines = [][]byte{
	[]byte("Failed to decode"), []byte("not supported"), []byte("missing message type byte"),
	[]byte("Received invalid msgType"), []byte("Message type ("), []byte("UDP packet too short"),
	[]byte("invalid checksum"), []byte("Decrypt packet failed"), []byte("Failed to decompress"),
	[]byte("unacceptable label"), []byte("unexpected double"), []byte("failed to receive"),
	[]byte("Failed to read remote state"), []byte("No installed keys could decrypt"),
}

func isBadPacket(line []byte) bool {
	for _, s := range badPacketLines {
		if bytes.Contains(line, s) {
			return true
		}
	}
	return false
}

func (w *logWriter) Write(p []byte) (int, error) {
	level := slog.LevelDebug
	line := bytes.TrimRight(p, "\n")
	if bytes.HasPrefix(line, []byte("[ERR]")) || bytes.HasPrefix(line, []byte("[WARN]")) {
		level = slog.LevelWarn
	}
	var attrs []any
	if isBadPacket(line) {
		w.badPackets.Add(1)
		now := time.Now
		if w.now != nil {
			now = w.now
		}
		t := now()
		w.mu.Lock()
		if !w.lastBad.IsZero() && t.Sub(w.lastBad) < time.Second {
			w.suppressed++
			w.mu.Unlock()
			return len(p), nil
		}
		w.lastBad = t
		if w.suppressed > 0 {
			attrs = append(attrs, "bad_packets_not_logged", w.suppressed)
			w.suppressed = 0
		}
		w.mu.Unlock()
	}
	if !w.log.Enabled(context.Background(), level) {
		return len(p), nil
	}
	if i := bytes.IndexByte(line, ']'); i >= 0 && line[0] == '[' {
		line = bytes.TrimSpace(line[i+1:])
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.log.Log(context.Background(), level, string(line), append([]any{"component", "memberlist"}, attrs...)...)
	return len(p), nil
}
