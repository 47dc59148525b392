package wire

import (
	"time"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// Explanation is the JSON form of an ExplainResponse that GET /v1/explain,
// "freqring explain --json" and the console share: the message's fields
// by their proto names, with each unix-ms time also as an RFC 3339 time
// (UTC) and each rule's state as an ordered list.
type Explanation struct {
	Recipient          string        `json:"recipient"`
	Domain             string        `json:"domain"`
	Node               string        `json:"node"`
	Now                time.Time     `json:"now"`
	NowMs              int64         `json:"now_ms"`
	Admitted           bool          `json:"admitted"`
	DeniedBy           string        `json:"denied_by,omitempty"`
	NextAdmitted       *time.Time    `json:"next_admitted"` // null: never
	NextAdmittedMs     int64         `json:"next_admitted_ms"`
	Override           string        `json:"override,omitempty"`
	Exempt             bool          `json:"exempt,omitempty"`
	ContentFingerprint uint32        `json:"content_fingerprint,omitempty"`
	Rules              []ExplainRule `json:"rules"`
}

// ExplainRule is one rule of an Explanation.
type ExplainRule struct {
	Name         string         `json:"name"`
	Scope        string         `json:"scope"`
	Algorithm    string         `json:"algorithm"`
	Limit        uint32         `json:"limit"`
	Window       string         `json:"window"`
	WindowMs     int64          `json:"window_ms"`
	Shadow       bool           `json:"shadow,omitempty"`
	Judged       bool           `json:"judged"`
	Used         uint32         `json:"used"`
	Remaining    uint32         `json:"remaining"`
	RetryAfterMs int64          `json:"retry_after_ms"`
	Sends        []ExplainSend  `json:"sends,omitempty"`
	State        []ExplainValue `json:"state,omitempty"`
}

// ExplainSend is one send a sliding-log rule counts.
type ExplainSend struct {
	At                 time.Time `json:"at"`
	AtMs               int64     `json:"at_ms"`
	ContentFingerprint uint32    `json:"content_fingerprint,omitempty"`
}

// ExplainValue is one named value of a counting rule's state.
type ExplainValue struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// ExplanationOf returns the JSON form of r.
func ExplanationOf(r *pb.ExplainResponse) *Explanation {
	e := &Explanation{
		Recipient: r.Recipient, Domain: r.Domain, Node: r.Node, Now: unixMs(r.NowMs), NowMs: r.NowMs,
		Admitted: r.Admitted, DeniedBy: r.DeniedBy, NextAdmittedMs: r.NextAdmittedMs,
		Override: r.Override, Exempt: r.Exempt, ContentFingerprint: r.ContentFingerprint,
		Rules: make([]ExplainRule, 0, len(r.Rules)),
	}
	if r.NextAdmittedMs != 0 {
		t := unixMs(r.NextAdmittedMs)
		e.NextAdmitted = &t
	}
	for _, ru := range r.Rules {
		er := ExplainRule{
			Name: ru.Name, Scope: ru.Scope, Algorithm: ru.Algorithm, Limit: ru.Limit,
			Window: (time.Duration(ru.WindowMs) * time.Millisecond).String(), WindowMs: ru.WindowMs,
			Shadow: ru.Shadow, Judged: ru.Judged, Used: ru.Used, Remaining: ru.Remaining, RetryAfterMs: ru.RetryAfterMs,
		}
		for _, s := range ru.Sends {
			er.Sends = append(er.Sends, ExplainSend{At: unixMs(s.AtMs), AtMs: s.AtMs, ContentFingerprint: s.ContentFingerprint})
		}
		for _, v := range ru.State {
			er.State = append(er.State, ExplainValue{Name: v.Name, Value: v.Value})
		}
		e.Rules = append(e.Rules, er)
	}
	return e
}

func unixMs(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
