package gateway

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// MaxCost is the largest cost of one item, as in the gRPC API.
const MaxCost = 1000

// This file decodes the one shape of body POST /v1/check takes, by hand and
// in one pass, rather than through encoding/json, which
//   - replaces bytes that are not UTF-8, and lone surrogate escapes such as
//     \ud800, with U+FFFD, so that distinct recipients would merge into one
//     (gRPC and the CLI refuse them);
//   - takes a JSON string "5" for a json.Number;
//   - keeps the last of duplicate keys, and matches keys case-insensitively
//     ("Recipient" and "recipient" are the same key, the last one wins).
// Here a key must be one of the names below, exactly and once per object;
// cost is a JSON number; and a recipient, domain or content that is not
// valid UTF-8 fails its item alone, as in gRPC, with a message naming the
// field.

// field is a key of an item or of a body.
type field uint8

const (
	fRecipient field = iota
	fContent
	fDomain
	fCost
	fMode
	fRequestID
	fItems // of a body only
	nFields
)

var fieldNames = [nFields]string{"recipient", "content", "domain", "cost", "mode", "request_id", "items"}

// fieldList is what an unknown field's message lists.
const fieldList = "items, recipient, content, domain, cost, mode, request_id"

// lookupField is the field a key names; ok is false for an unknown key.
func lookupField(key []byte) (f field, ok bool) {
	switch string(key) { // no allocation: the compiler matches the bytes
	case "recipient":
		return fRecipient, true
	case "content":
		return fContent, true
	case "domain":
		return fDomain, true
	case "cost":
		return fCost, true
	case "mode":
		return fMode, true
	case "request_id":
		return fRequestID, true
	case "items":
		return fItems, true
	}
	return 0, false
}

var modes = map[string]pb.Mode{
	"check":  pb.Mode_MODE_CHECK_AND_RECORD,
	"peek":   pb.Mode_MODE_PEEK,
	"record": pb.Mode_MODE_RECORD_ONLY,
	"refund": pb.Mode_MODE_REFUND,
}

// fieldError is bad input: the field (a JSON path such as items[2].cost)
// and what is wrong with its value.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// FailedItem is an item of a batch that fails alone: its index in the
// body's items, and an error naming its field and value.
type FailedItem struct {
	Index int
	Err   error
}

// DecodeCheck decodes a POST /v1/check body into a CheckRequest. batch
// reports whether the body named its items in "items" (answered with
// per-item results) rather than being a single item. An error names the
// field and the value.
//
// An item whose recipient, domain or content is not valid UTF-8 (a byte
// that is not, or a lone surrogate escape such as \ud800) fails alone: it
// is left out of req and listed in failed, in body order, and the others
// are decided; a single item fails with err.
func DecodeCheck(body []byte) (req *pb.CheckRequest, batch bool, failed []FailedItem, err error) {
	d := decoder{b: body}
	req = &pb.CheckRequest{}
	batch, failed, err = d.body(req)
	if err != nil {
		return nil, batch, nil, err
	}
	return req, batch, failed, nil
}

// item is one item as decoded, before validation. Strings point into the
// body or into a fresh copy; has marks the fields given and not null.
type item struct {
	has       [nFields]bool
	recipient string
	content   []byte
	domain    string
	cost      []byte // a JSON number, as written
	mode      pb.Mode
	requestID uint64
	// badMode and badRequestID: the value given is not a mode, or not a
	// request id, which is kept in badModeValue or badIDValue.
	badMode, badRequestID    bool
	badModeValue, badIDValue string
	// badUTF8 is the first of recipient, content and domain that is not
	// valid UTF-8, with the reason; the item then fails alone.
	badUTF8    field
	badUTF8Why string
	hasBadUTF8 bool
}

// decoder reads one body. Syntax errors name "body" and the byte offset,
// counted from 1 as encoding/json does.
type decoder struct {
	b       []byte
	i       int    // the next byte of b
	scratch []byte // unescaped strings; reused
}

func (d *decoder) syntaxErr(what string) error {
	if d.i >= len(d.b) {
		return &fieldError{"body", "truncated JSON"}
	}
	return &fieldError{"body", fmt.Sprintf("invalid JSON at byte %d: invalid character %s %s", d.i+1, quoteChar(d.b[d.i]), what)}
}

// quoteChar shows byte c in a syntax error, as encoding/json does.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	if c >= utf8.RuneSelf {
		s = fmt.Sprintf(`"\x%02x"`, c)
	}
	return "'" + s[1:len(s)-1] + "'"
}

func (d *decoder) skipSpace() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// kind names the JSON value starting at the next byte, for a type error;
// "" if no value starts there.
func (d *decoder) kind() string {
	if d.i >= len(d.b) {
		return ""
	}
	switch c := d.b[d.i]; {
	case c == '"':
		return "string"
	case c == '{':
		return "object"
	case c == '[':
		return "array"
	case c == 't' || c == 'f':
		return "bool"
	case c == 'n':
		return "null"
	case c == '-' || c >= '0' && c <= '9':
		return "number"
	}
	return ""
}

// typeErr refuses the value at the next byte for name, which wants want;
// a syntax error if no value starts there.
func (d *decoder) typeErr(name, want string) error {
	k := d.kind()
	if k == "" {
		return d.syntaxErr("looking for beginning of value")
	}
	return &fieldError{name, fmt.Sprintf("a JSON %s, want %s", k, want)}
}

// null consumes a null literal if one is next.
func (d *decoder) null() (bool, error) {
	if d.i >= len(d.b) || d.b[d.i] != 'n' {
		return false, nil
	}
	for _, c := range []byte("null") {
		if d.i >= len(d.b) || d.b[d.i] != c {
			return false, d.syntaxErr("in literal null (expecting '" + string(c) + "')")
		}
		d.i++
	}
	return true, nil
}

// body decodes the whole body: one object, then only white space.
func (d *decoder) body(req *pb.CheckRequest) (batch bool, failed []FailedItem, err error) {
	d.skipSpace()
	if d.i >= len(d.b) {
		return false, nil, &fieldError{"body", "empty: want a JSON object"}
	}
	if d.b[d.i] != '{' {
		return false, nil, d.typeErr("body", "an object")
	}
	var top item
	var seen [nFields]bool
	itemsGiven := false // items, not null
	err = d.object(func(key []byte) error {
		f, ok := lookupField(key)
		if !ok {
			return unknownField(path{-1}, key)
		}
		if seen[f] {
			return &fieldError{fieldNames[f], "duplicate key: each field may appear once"}
		}
		seen[f] = true
		if f != fItems {
			if err := d.value(&top, f, path{-1}); err != nil {
				return err
			}
			if top.has[f] && itemsGiven {
				return besideItems(f)
			}
			return nil
		}
		if null, err := d.null(); null || err != nil {
			return err
		}
		if d.i >= len(d.b) || d.b[d.i] != '[' {
			return d.typeErr("items", "an array of objects")
		}
		if f := top.first(); f >= 0 {
			return besideItems(field(f))
		}
		itemsGiven = true
		n := 0
		err := d.array(func() error {
			at := path{n}
			var it item
			if d.b[d.i] != '{' {
				return d.typeErr(at.item(), "an object")
			}
			if err := d.item(&it, at); err != nil {
				return err
			}
			fe, err := appendItem(req, &it, at)
			if err != nil {
				return err
			}
			if fe != nil {
				failed = append(failed, FailedItem{n, fe})
			}
			n++
			return nil
		})
		if err == nil && n == 0 {
			err = &fieldError{"items", "empty: want 1 or more items"}
		}
		return err
	})
	if err != nil {
		return itemsGiven, nil, err
	}
	d.skipSpace()
	if d.i < len(d.b) {
		return itemsGiven, nil, &fieldError{"body", "trailing data after the JSON value"}
	}
	if itemsGiven {
		return true, failed, nil
	}
	fe, err := appendItem(req, &top, path{-1})
	if err == nil && fe != nil {
		err = fe
	}
	return false, nil, err
}

func besideItems(f field) error {
	return &fieldError{fieldNames[f], "beside items: a batch names each item's fields inside items"}
}

// first is the first item field given, or -1.
func (it *item) first() int {
	for f := range fItems {
		if it.has[f] {
			return int(f)
		}
	}
	return -1
}

// path names the fields of one item: of the body's single item (i < 0),
// or of items[i]. Names are built only for errors.
type path struct{ i int }

// item is the item's own name: items[i], or body.
func (p path) item() string {
	if p.i < 0 {
		return "body"
	}
	return "items[" + strconv.Itoa(p.i) + "]"
}

// field is the name of the item's field f: items[i].f, or f.
func (p path) field(f string) string {
	if p.i < 0 {
		return f
	}
	return p.item() + "." + f
}

// unknownField refuses key; a key that differs from a field only in case
// names it.
func unknownField(at path, key []byte) error {
	name := string(key)
	if !isPlainKey(name) {
		name = strconv.Quote(name)
	}
	msg := "unknown field; the fields are " + fieldList
	for _, f := range fieldNames {
		if strings.EqualFold(f, string(key)) {
			msg = fmt.Sprintf("unknown field (did you mean %q? keys are case-sensitive)", f)
		}
	}
	return &fieldError{at.field(name), msg}
}

// isPlainKey reports whether key reads well unquoted in a field path.
func isPlainKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// item decodes one object of items into it.
func (d *decoder) item(it *item, at path) error {
	var seen [nFields]bool
	return d.object(func(key []byte) error {
		f, ok := lookupField(key)
		if !ok || f == fItems {
			return unknownField(at, key)
		}
		if seen[f] {
			return &fieldError{at.field(fieldNames[f]), "duplicate key: each field may appear once"}
		}
		seen[f] = true
		return d.value(it, f, at)
	})
}

// object decodes the object at the next byte ('{'), calling member with
// each key, positioned at the start of its value, which member consumes.
func (d *decoder) object(member func(key []byte) error) error {
	d.i++ // '{'
	d.skipSpace()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return nil
	}
	for {
		if d.i >= len(d.b) || d.b[d.i] != '"' {
			return d.syntaxErr("looking for beginning of object key string")
		}
		key, _, err := d.str()
		if err != nil {
			return err
		}
		d.skipSpace()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return d.syntaxErr("after object key")
		}
		d.i++
		d.skipSpace()
		if err := member(key); err != nil {
			return err
		}
		if done, err := d.next('}', "after object key:value pair"); done || err != nil {
			return err
		}
	}
}

// array decodes the array at the next byte ('['), calling elem positioned
// at the start of each element, which elem consumes.
func (d *decoder) array(elem func() error) error {
	d.i++ // '['
	d.skipSpace()
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return nil
	}
	for {
		if d.i >= len(d.b) {
			return d.syntaxErr("")
		}
		if err := elem(); err != nil {
			return err
		}
		if done, err := d.next(']', "after array element"); done || err != nil {
			return err
		}
	}
}

// next consumes what follows a member or element: a ',' and the space after
// it, or end, the object's or array's closing byte (done). Anything else is
// a syntax error after what.
func (d *decoder) next(end byte, what string) (done bool, err error) {
	d.skipSpace()
	if d.i >= len(d.b) {
		return false, d.syntaxErr("")
	}
	switch d.b[d.i] {
	case ',':
		d.i++
		d.skipSpace()
		return false, nil
	case end:
		d.i++
		return true, nil
	default:
		return false, d.syntaxErr(what)
	}
}

// value decodes field f's value into it; null leaves f unset.
func (d *decoder) value(it *item, f field, at path) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	if f == fCost {
		if d.kind() != "number" {
			return d.typeErr(at.field("cost"), "a number")
		}
		n, err := d.number()
		if err != nil {
			return err
		}
		it.cost, it.has[f] = n, true
		return nil
	}
	if d.kind() != "string" {
		if f == fRequestID {
			return d.typeErr(at.field("request_id"), "a decimal string (JSON numbers lose precision above 2^53)")
		}
		return d.typeErr(at.field(fieldNames[f]), "a string")
	}
	s, bad, err := d.str()
	if err != nil {
		return err
	}
	it.has[f] = true
	switch f {
	case fRecipient:
		it.recipient = string(s)
	case fContent:
		it.content = append([]byte(nil), s...)
	case fDomain:
		it.domain = string(s)
	case fMode:
		m, ok := modes[string(s)]
		if !ok {
			it.badMode, it.badModeValue = true, string(s)
		}
		it.mode = m
	case fRequestID:
		id, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil || id == 0 {
			it.badRequestID, it.badIDValue = true, string(s)
		}
		it.requestID = id
	}
	if bad != "" && !it.hasBadUTF8 && (f == fRecipient || f == fContent || f == fDomain) {
		it.hasBadUTF8, it.badUTF8, it.badUTF8Why = true, f, bad
	}
	return nil
}

// str decodes the string at the next byte ('"'). The bytes returned point
// into the body or into d.scratch, valid until the next call. bad is ""
// when they are valid UTF-8, else why not: a byte that is not UTF-8 (kept
// as it came) or a lone surrogate escape (kept as its 3-byte WTF-8 form, so
// that two lone surrogates stay distinct).
func (d *decoder) str() (s []byte, bad string, err error) {
	d.i++ // '"'
	start := d.i
	for d.i < len(d.b) { // the fast path: printable ASCII, no escapes
		c := d.b[d.i]
		if c == '"' {
			d.i++
			return d.b[start : d.i-1], "", nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		d.i++
	}
	buf := append(d.scratch[:0], d.b[start:d.i]...)
	defer func() { d.scratch = buf[:0] }()
	for {
		if d.i >= len(d.b) {
			return nil, "", d.syntaxErr("")
		}
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return buf, bad, nil
		case c < 0x20:
			return nil, "", d.syntaxErr("in string literal")
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && n == 1 && bad == "" {
				bad = fmt.Sprintf("byte 0x%02x at offset %d", c, len(buf))
			}
			buf = append(buf, d.b[d.i:d.i+n]...)
			d.i += n
		case c != '\\':
			buf = append(buf, c)
			d.i++
		default:
			d.i++
			if d.i >= len(d.b) {
				return nil, "", d.syntaxErr("")
			}
			e := d.b[d.i]
			d.i++
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, err := d.hex4()
				if err != nil {
					return nil, "", err
				}
				if utf16.IsSurrogate(r) {
					if r < 0xdc00 && d.i+6 <= len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
						save := d.i
						d.i += 2
						r2, err := d.hex4()
						if err != nil {
							return nil, "", err
						}
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							buf = utf8.AppendRune(buf, dec)
							continue
						}
						d.i = save // r2 is read on its own next
					}
					if bad == "" {
						bad = fmt.Sprintf("lone surrogate \\u%04x at offset %d", r, len(buf))
					}
					buf = append(buf, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
					continue
				}
				buf = utf8.AppendRune(buf, r)
			default:
				d.i--
				return nil, "", d.syntaxErr("in string escape code")
			}
		}
	}
}

// hex4 reads the four hex digits of a \u escape.
func (d *decoder) hex4() (rune, error) {
	var r rune
	for range 4 {
		if d.i >= len(d.b) {
			return 0, d.syntaxErr("")
		}
		c := d.b[d.i]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, d.syntaxErr("in \\u hexadecimal character escape")
		}
		r = r<<4 | rune(c)
		d.i++
	}
	return r, nil
}

// number reads a JSON number (RFC 8259) and returns it as written.
func (d *decoder) number() ([]byte, error) {
	start := d.i
	if d.b[d.i] == '-' {
		d.i++
	}
	digits := func() error {
		if d.i >= len(d.b) || d.b[d.i] < '0' || d.b[d.i] > '9' {
			return d.syntaxErr("in numeric literal")
		}
		for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
			d.i++
		}
		return nil
	}
	if d.i < len(d.b) && d.b[d.i] == '0' {
		d.i++
	} else if err := digits(); err != nil {
		return nil, err
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if err := digits(); err != nil {
			return nil, err
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if err := digits(); err != nil {
			return nil, err
		}
	}
	return d.b[start:d.i], nil
}

// cut shows a value in an error, cut to 40 bytes.
func cut(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q... (%d bytes)", s[:40], len(s))
	}
	return strconv.Quote(s)
}

// appendItem validates it and appends it to req's columns. err is bad
// input that fails the whole request; failed, an item that fails alone (a
// recipient, content or domain that is not valid UTF-8), which is not
// appended.
func appendItem(req *pb.CheckRequest, it *item, at path) (failed, err error) {
	if !it.has[fRecipient] || it.recipient == "" {
		return nil, &fieldError{at.field("recipient"), "missing or empty: want the recipient"}
	}
	cost := int64(1)
	if it.has[fCost] {
		lit := string(it.cost)
		if strings.ContainsAny(lit, ".eE") {
			return nil, &fieldError{at.field("cost"), fmt.Sprintf("%s is not an integer", cutNumber(lit))}
		}
		var perr error
		cost, perr = strconv.ParseInt(lit, 10, 64)
		if perr != nil || cost < 1 || cost > MaxCost {
			return nil, &fieldError{at.field("cost"), fmt.Sprintf("%s out of range [1, %d]", cutNumber(lit), MaxCost)}
		}
	}
	if it.badMode {
		return nil, &fieldError{at.field("mode"), fmt.Sprintf("%s is not one of check, peek, record, refund", cut(it.badModeValue))}
	}
	if it.badRequestID {
		return nil, &fieldError{at.field("request_id"), fmt.Sprintf("%s is not a decimal integer in [1, 18446744073709551615]", cut(it.badIDValue))}
	}
	if it.hasBadUTF8 {
		var v string
		switch it.badUTF8 {
		case fRecipient:
			v = it.recipient
		case fContent:
			v = string(it.content)
		case fDomain:
			v = it.domain
		}
		return &fieldError{at.field(fieldNames[it.badUTF8]), fmt.Sprintf("%s is not valid UTF-8 (%s)", cut(v), it.badUTF8Why)}, nil
	}
	req.Recipients = append(req.Recipients, it.recipient)
	req.Domains = append(req.Domains, it.domain)
	req.Contents = append(req.Contents, it.content)
	req.Costs = append(req.Costs, uint32(cost))
	req.Modes = append(req.Modes, it.mode) // 0, MODE_CHECK_AND_RECORD, when not given
	req.RequestIds = append(req.RequestIds, it.requestID)
	return nil, nil
}

// cutNumber shows a number literal in an error, cut to 40 bytes.
func cutNumber(lit string) string {
	if len(lit) > 40 {
		return fmt.Sprintf("%s... (%d digits)", lit[:40], len(lit))
	}
	return lit
}
