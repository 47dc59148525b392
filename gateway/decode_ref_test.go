package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// This file keeps the gateway's first decoder, on encoding/json, as a
// reference for FuzzDecodeCheck: what DecodeCheck accepts, it accepts the
// same; what it accepted and DecodeCheck refuses, DecodeCheck refuses for
// one of the reasons it was written for (duplicate keys, keys in another
// case, a cost as a string, strings that are not UTF-8).

// refItem is one item of a POST /v1/check body. Pointers tell an absent
// field from a zero one.
type refItem struct {
	Recipient *string      `json:"recipient"`
	Content   *string      `json:"content,omitempty"`
	Domain    *string      `json:"domain,omitempty"`
	Cost      *json.Number `json:"cost,omitempty"`
	Mode      *string      `json:"mode,omitempty"`
	RequestID *string      `json:"request_id,omitempty"`
}

// refBody is a whole body: one item, or a batch in items.
type refBody struct {
	Items []json.RawMessage `json:"items"`
	refItem
}

// decodeCheckStd decodes a POST /v1/check body into a CheckRequest. batch
// reports whether the body named its items in "items" (answered with
// per-item results) rather than being a single item. An error names the
// field and the value.
func decodeCheckStd(body []byte) (req *pb.CheckRequest, batch bool, err error) {
	var b refBody
	if err := refUnmarshal(body, &b, ""); err != nil {
		return nil, false, err
	}
	if b.Items == nil {
		req = &pb.CheckRequest{}
		if err := refAppendItem(req, &b.refItem, ""); err != nil {
			return nil, false, err
		}
		return req, false, nil
	}
	if f := b.refItem.refFirstField(); f != "" {
		return nil, true, &fieldError{f, "beside items: a batch names each item's fields inside items"}
	}
	if len(b.Items) == 0 {
		return nil, true, &fieldError{"items", "empty: want 1 or more items"}
	}
	req = &pb.CheckRequest{}
	for i, raw := range b.Items {
		prefix := fmt.Sprintf("items[%d].", i)
		var it refItem
		if err := refUnmarshal(raw, &it, prefix); err != nil {
			return nil, true, err
		}
		if err := refAppendItem(req, &it, prefix); err != nil {
			return nil, true, err
		}
	}
	return req, true, nil
}

// refFirstField is the name of the first item field set, or "".
func (it *refItem) refFirstField() string {
	switch {
	case it.Recipient != nil:
		return "recipient"
	case it.Content != nil:
		return "content"
	case it.Domain != nil:
		return "domain"
	case it.Cost != nil:
		return "cost"
	case it.Mode != nil:
		return "mode"
	case it.RequestID != nil:
		return "request_id"
	}
	return ""
}

// refUnmarshal decodes one JSON value into v, refusing unknown fields
// and trailing data, with errors naming the field under prefix.
func refUnmarshal(data []byte, v any, prefix string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			return &fieldError{refBodyField(prefix), "trailing data after the JSON value"}
		}
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return &fieldError{refBodyField(prefix), "empty: want a JSON object"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &fieldError{refBodyField(prefix), "truncated JSON"}
	case errors.As(err, &syn):
		return &fieldError{refBodyField(prefix), fmt.Sprintf("invalid JSON at byte %d: %v", syn.Offset, syn)}
	case errors.As(err, &typ):
		if typ.Field == "" {
			return &fieldError{refBodyField(prefix), fmt.Sprintf("a JSON %s, want an object", typ.Value)}
		}
		field := strings.TrimPrefix(typ.Field, "refItem.") // the embedded item of a body
		return &fieldError{prefix + field, fmt.Sprintf("a JSON %s, want %s", typ.Value, refKind(field))}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if u, err := strconv.Unquote(name); err == nil && u != "" {
			name = u // else keep it quoted: "" names the empty key
		}
		return &fieldError{prefix + name, "unknown field; the fields are items, recipient, content, domain, cost, mode, request_id"}
	}
	if strings.Contains(err.Error(), "invalid number literal") { // a string into cost
		return &fieldError{prefix + "cost", "a string, want a number"}
	}
	return &fieldError{refBodyField(prefix), err.Error()}
}

func refBodyField(prefix string) string {
	if prefix == "" {
		return "body"
	}
	return strings.TrimSuffix(prefix, ".")
}

// refKind says what field f takes.
func refKind(f string) string {
	switch f {
	case "cost":
		return "a number"
	case "items":
		return "an array of objects"
	case "request_id":
		return "a decimal string (JSON numbers lose precision above 2^53)"
	}
	return "a string"
}

// refAppendItem validates it and appends it to req's columns.
func refAppendItem(req *pb.CheckRequest, it *refItem, prefix string) error {
	if it.Recipient == nil || *it.Recipient == "" {
		return &fieldError{prefix + "recipient", "missing or empty: want the recipient"}
	}
	req.Recipients = append(req.Recipients, *it.Recipient)
	domain := ""
	if it.Domain != nil {
		domain = *it.Domain
	}
	req.Domains = append(req.Domains, domain)
	var content []byte
	if it.Content != nil {
		content = []byte(*it.Content)
	}
	req.Contents = append(req.Contents, content)
	cost := int64(1)
	if it.Cost != nil {
		var err error
		cost, err = strconv.ParseInt(string(*it.Cost), 10, 64)
		if err != nil {
			return &fieldError{prefix + "cost", fmt.Sprintf("%s is not an integer", it.Cost.String())}
		}
		if cost < 1 || cost > MaxCost {
			return &fieldError{prefix + "cost", fmt.Sprintf("%d out of range [1, %d]", cost, MaxCost)}
		}
	}
	req.Costs = append(req.Costs, uint32(cost))
	mode := pb.Mode_MODE_CHECK_AND_RECORD
	if it.Mode != nil {
		m, ok := modes[*it.Mode]
		if !ok {
			return &fieldError{prefix + "mode", fmt.Sprintf("%q is not one of check, peek, record, refund", *it.Mode)}
		}
		mode = m
	}
	req.Modes = append(req.Modes, mode)
	var id uint64
	if it.RequestID != nil {
		var err error
		id, err = strconv.ParseUint(*it.RequestID, 10, 64)
		if err != nil || id == 0 {
			return &fieldError{prefix + "request_id", fmt.Sprintf("%q is not a decimal integer in [1, 18446744073709551615]", *it.RequestID)}
		}
	}
	req.RequestIds = append(req.RequestIds, id)
	return nil
}
