package gossip

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// logEvery is the shortest time between two logged lines of one kind of
// memberlist warning.
const logEvery = 10 * time.Second

// maxLogKinds bounds the kinds of warning a logWriter keeps apart; lines of
// further kinds share one (a kind can hold text a peer chose).
const maxLogKinds = 64

// Kinds of warning line that are not their own text.
const (
	kindBadPacket = "bad packet" // every line about input that does not decode
	kindOther     = "other"      // a kind past maxLogKinds
)

// logWriter turns memberlist's log lines ("[LEVEL] memberlist: text\n", one
// per Write) into slog records: [ERR] and [WARN] at Warn, everything else at
// Debug. memberlist logs routine trouble (a failed probe of a dying peer) as
// [ERR], so nothing it says is an Error of ours.
//
// memberlist logs a line for each packet it refuses, so that anyone who can
// reach the gossip port (of a plaintext cluster, with any packet that
// decodes) could fill the log. Every [ERR] and [WARN] line is counted in
// warnings, and at most one line of a kind is logged every logEvery, with
// the number of lines of that kind left out since its last one
// (not_logged), which are counted in notLogged. A line's kind is its text
// up to the first character that is not an ASCII letter or a space ("Got
// ping for unexpected node 'x' from=..." is "Got ping for unexpected
// node"); lines about a packet or stream that does not decode (random bytes
// sent to the gossip port, a member with another key) are one kind, and are
// counted in badPackets too. Safe for concurrent use.
type logWriter struct {
	log   *slog.Logger
	now   func() time.Time // nil means time.Now
	every time.Duration    // 0 means logEvery

	badPackets atomic.Int64
	warnings   atomic.Int64
	notLogged  atomic.Int64

	mu    sync.Mutex          // guards kinds
	kinds map[string]*logKind // at most maxLogKinds+1 (kindOther)
}

// logKind is the state of one kind of warning line.
type logKind struct {
	last      time.Time // when a line of the kind was last logged
	notLogged int64     // lines of the kind left out since
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

// kindOf is the kind of the warning text msg: its leading ASCII letters and
// spaces, at most 48 bytes of them.
func kindOf(msg []byte) string {
	n := 0
	for n < len(msg) && n < 48 {
		c := msg[n]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == ' ') {
			break
		}
		n++
	}
	return string(bytes.TrimSpace(msg[:n]))
}

func (w *logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimRight(p, "\n")
	warn := bytes.HasPrefix(line, []byte("[ERR]")) || bytes.HasPrefix(line, []byte("[WARN]"))
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
		w.warnings.Add(1)
	}
	msg := line
	if i := bytes.IndexByte(msg, ']'); i >= 0 && msg[0] == '[' {
		msg = bytes.TrimSpace(msg[i+1:])
	}
	msg = bytes.TrimPrefix(msg, []byte("memberlist: "))
	var attrs []any
	bad := isBadPacket(line)
	if bad {
		w.badPackets.Add(1)
	}
	if warn || bad {
		kind := kindBadPacket
		if !bad {
			kind = kindOf(msg)
		}
		left, ok := w.admit(kind)
		if !ok {
			if warn {
				w.notLogged.Add(1)
			}
			return len(p), nil
		}
		if left > 0 {
			attrs = append(attrs, "not_logged", left)
		}
	}
	if !w.log.Enabled(context.Background(), level) {
		return len(p), nil
	}
	w.log.Log(context.Background(), level, string(msg), append([]any{"component", "memberlist"}, attrs...)...)
	return len(p), nil
}

// admit reports whether a line of kind may be logged now, and if so how
// many lines of the kind were left out since the last one logged.
func (w *logWriter) admit(kind string) (left int64, ok bool) {
	now, every := time.Now, w.every
	if w.now != nil {
		now = w.now
	}
	if every == 0 {
		every = logEvery
	}
	t := now()
	w.mu.Lock()
	defer w.mu.Unlock()
	k := w.kinds[kind]
	if k == nil {
		if w.kinds == nil {
			w.kinds = make(map[string]*logKind)
		}
		if len(w.kinds) >= maxLogKinds {
			kind = kindOther
		}
		if k = w.kinds[kind]; k == nil {
			k = &logKind{}
			w.kinds[kind] = k
		}
	}
	if !k.last.IsZero() && t.Sub(k.last) < every {
		k.notLogged++
		return 0, false
	}
	k.last = t
	left, k.notLogged = k.notLogged, 0
	return left, true
}
