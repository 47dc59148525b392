package gossip

import (
	"bytes"
	"context"
	"log/slog"
)

// logWriter turns memberlist's log lines ("[LEVEL] memberlist: text\n", one
// per Write) into slog records: [ERR] and [WARN] at Warn, everything else at
// Debug. memberlist logs routine trouble (a failed probe of a dying peer) as
// [ERR], so nothing it says is an Error of ours.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	level := slog.LevelDebug
	line := bytes.TrimRight(p, "\n")
	if bytes.HasPrefix(line, []byte("[ERR]")) || bytes.HasPrefix(line, []byte("[WARN]")) {
		level = slog.LevelWarn
	}
	if !w.log.Enabled(context.Background(), level) {
		return len(p), nil
	}
	if i := bytes.IndexByte(line, ']'); i >= 0 && line[0] == '[' {
		line = bytes.TrimSpace(line[i+1:])
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.log.Log(context.Background(), level, string(line), "component", "memberlist")
	return len(p), nil
}
