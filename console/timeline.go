package console

import (
	"strconv"
	"strings"
	"time"

	"github.com/freqring/freqring/api/wire"
)

// timelineWidth is the width of a rule's timeline, px; it shows the rule's
// window ending at the explained time.
const timelineWidth = 600

// timeline is one rule of the Recipient page: its explanation, and its
// sends placed on the window.
type timeline struct {
	wire.ExplainRule
	Marks   []mark
	Binding bool // the rule that denies the next message
	Start   time.Time
	States  []stateRow // a counting rule's state, as shown
}

// stateRow is one value of a counting rule's state: times (unix ms) as
// times, the rest as numbers.
type stateRow struct{ Name, Text string }

// mark is one send on a timeline.
type mark struct {
	X       float64 // px from the window's start
	At      time.Time
	Leaves  time.Time // when it leaves the window
	Content uint32
}

// timelines places each sliding-log rule's sends on its window.
func timelines(ex *wire.Explanation) []timeline {
	out := make([]timeline, len(ex.Rules))
	for i, r := range ex.Rules {
		t := timeline{ExplainRule: r, Binding: r.Name == ex.DeniedBy,
			Start: ex.Now.Add(-time.Duration(r.WindowMs) * time.Millisecond)}
		for _, s := range r.Sends {
			x := timelineWidth * float64(s.AtMs-(ex.NowMs-r.WindowMs)) / float64(max(r.WindowMs, 1))
			t.Marks = append(t.Marks, mark{X: min(max(x, 0), timelineWidth), At: s.At,
				Leaves: s.At.Add(time.Duration(r.WindowMs) * time.Millisecond), Content: s.ContentFingerprint})
		}
		for _, v := range r.State {
			text := strconv.FormatFloat(v.Value, 'g', -1, 64)
			if strings.HasSuffix(v.Name, "_unix_ms") {
				text = fmtMs(int64(v.Value))
			}
			t.States = append(t.States, stateRow{v.Name, text})
		}
		out[i] = t
	}
	return out
}
