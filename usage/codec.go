package usage

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/freqring/freqring/wal"
)

// The saved form of a list of DomainDay (little-endian), as a node writes it
// to its data directory:
//
//	file   := magic "frqusage" | version u8 (2) | frame (wal.AppendFrame) of
//	          type 1 around: count u32 | count × day
//	day    := zone str8 | date i32 | domain str16 | admitted u64 | denied u64 |
//	          rules u8 | rules × rule | sketch (see Sketch.AppendBinary)
//	rule   := name str8 | denied u64 | would_deny u64
//	str8   := len u8 | UTF-8 bytes;  str16 := len u16 | UTF-8 bytes
//
// Version 1, still read, had no frame: count u32 | count × day | crc u32,
// the CRC-32C of every byte before it. Counters are at most math.MaxInt64.
// Version numbers are only added, never reused.
const (
	magic   = "frqusage"
	version = 2
	// maxFile bounds the frame of a saved form.
	maxFile = 1 << 30
	// frameDays is the type of the frame that holds the days.
	frameDays = 1
	// minDayBytes is the smallest encoded day: empty names, no rules, an
	// empty sparse sketch.
	minDayBytes = 1 + 4 + 2 + 8 + 8 + 1 + 4
	// MaxRules bounds the rules of one DomainDay (rules come and go across
	// reloads; a rule set has at most 16).
	MaxRules = 255
)

// Encode appends the saved form of days to dst. It returns an error naming
// the day and field that cannot be encoded (a name too long, a negative
// counter, too many rules).
func Encode(dst []byte, days []DomainDay) ([]byte, error) {
	body := binary.LittleEndian.AppendUint32(nil, uint32(len(days)))
	for i := range days {
		d := &days[i]
		if err := d.check(); err != nil {
			return dst, fmt.Errorf("usage: day %d: %w", i, err)
		}
		body = d.appendBinary(body)
	}
	dst = append(dst, magic...)
	dst = append(dst, version)
	return wal.AppendFrame(dst, frameDays, body), nil
}

// appendBinary appends the saved form of d.
func (d *DomainDay) appendBinary(dst []byte) []byte {
	dst = append(dst, byte(len(d.Zone)))
	dst = append(dst, d.Zone...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(d.Date))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(d.Domain)))
	dst = append(dst, d.Domain...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(d.Admitted))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(d.Denied))
	dst = append(dst, byte(len(d.Rules)))
	for _, r := range d.Rules {
		dst = append(dst, byte(len(r.Rule)))
		dst = append(dst, r.Rule...)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Denied))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.WouldDeny))
	}
	sk := d.Recipients
	if sk == nil {
		sk = new(Sketch)
	}
	return sk.AppendBinary(dst)
}

// check reports a field Encode cannot write.
func (d *DomainDay) check() error {
	switch {
	case len(d.Zone) > math.MaxUint8:
		return fmt.Errorf("zone %q: %d bytes, more than %d", d.Zone[:32], len(d.Zone), math.MaxUint8)
	case len(d.Domain) > math.MaxUint16:
		return fmt.Errorf("domain: %d bytes, more than %d", len(d.Domain), math.MaxUint16)
	case d.Admitted < 0 || d.Denied < 0:
		return fmt.Errorf("domain %q date %v: admitted %d, denied %d: negative", d.Domain, d.Date, d.Admitted, d.Denied)
	case len(d.Rules) > MaxRules:
		return fmt.Errorf("domain %q date %v: %d rules, more than %d", d.Domain, d.Date, len(d.Rules), MaxRules)
	}
	for _, r := range d.Rules {
		if len(r.Rule) > math.MaxUint8 || r.Denied < 0 || r.WouldDeny < 0 {
			return fmt.Errorf("domain %q date %v: rule %q (%d bytes, at most %d): denied %d, would deny %d (not negative)",
				d.Domain, d.Date, r.Rule, len(r.Rule), math.MaxUint8, r.Denied, r.WouldDeny)
		}
	}
	return nil
}

// Decode decodes the saved form Encode writes. Damaged, truncated or
// trailing bytes return ErrCorrupt (wrapped, naming the offset and what is
// wrong); nothing partial is returned.
func Decode(b []byte) ([]DomainDay, error) {
	if len(b) < len(magic)+1 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(b))
	}
	if string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: magic %q, want %q", ErrCorrupt, b[:len(magic)], magic)
	}
	start := len(magic) + 1 // the count
	switch v := b[len(magic)]; v {
	case 1:
		if len(b) < start+4+4 {
			return nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(b))
		}
		body := b[:len(b)-4]
		if got, want := crc32.Checksum(body, wal.Castagnoli), binary.LittleEndian.Uint32(b[len(b)-4:]); got != want {
			return nil, fmt.Errorf("%w: crc %08x, want %08x", ErrCorrupt, got, want)
		}
		return decodeDays(body, start)
	case version:
		typ, _, n, err := wal.ReadFrame(b, start, maxFile)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: offset %d: %v", ErrCorrupt, start, err)
		case typ != frameDays:
			return nil, fmt.Errorf("%w: offset %d: a frame of type %d, want %d", ErrCorrupt, start, typ, frameDays)
		case start+n != len(b):
			return nil, fmt.Errorf("%w: %d bytes after the frame", ErrCorrupt, len(b)-start-n)
		}
		return decodeDays(b, start+wal.FrameHeaderLen)
	default:
		return nil, fmt.Errorf("%w: version %d, this build reads 1 and %d", ErrCorrupt, v, version)
	}
}

// decodeDays decodes the count and days that b holds from offset start to
// its end; offsets in errors are b's.
func decodeDays(b []byte, start int) ([]DomainDay, error) {
	if len(b) < start+4 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, len(b))
	}
	cnt := int(binary.LittleEndian.Uint32(b[start:]))
	if cnt > (len(b)-start-4)/minDayBytes {
		return nil, fmt.Errorf("%w: %d days cannot fit in %d bytes", ErrCorrupt, cnt, len(b)-start-4)
	}
	r := reader{b: b, off: start + 4}
	days := make([]DomainDay, 0, cnt)
	for range cnt {
		d, err := r.day()
		if err != nil {
			return nil, err
		}
		days = append(days, d)
	}
	if r.off != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the last day", ErrCorrupt, len(b)-r.off)
	}
	return days, nil
}

// day reads one day.
func (r *reader) day() (DomainDay, error) {
	var d DomainDay
	d.Zone = r.str(1, "zone")
	d.Date = Date(int32(r.u32("date")))
	d.Domain = r.str(2, "domain")
	d.Admitted = r.count("admitted")
	d.Denied = r.count("denied")
	nr := int(r.u8("rules"))
	for range nr {
		var rc RuleCount
		rc.Rule = r.str(1, "rule name")
		rc.Denied = r.count("rule denied")
		rc.WouldDeny = r.count("rule would deny")
		d.Rules = append(d.Rules, rc)
	}
	if r.err != nil {
		return d, r.err
	}
	sk, n, err := DecodeSketch(r.b[r.off:])
	if err != nil {
		return d, fmt.Errorf("offset %d: %w", r.off, err)
	}
	r.off += n
	d.Recipients = sk
	return d, nil
}

// reader reads fields in order; the first failure sticks in err.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n int, field string) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b)-r.off < n {
		r.err = fmt.Errorf("%w: offset %d: %s needs %d bytes, %d left", ErrCorrupt, r.off, field, n, len(r.b)-r.off)
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) u8(field string) uint8 {
	if p := r.take(1, field); p != nil {
		return p[0]
	}
	return 0
}

func (r *reader) u32(field string) uint32 {
	if p := r.take(4, field); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) count(field string) int64 {
	p := r.take(8, field)
	if p == nil {
		return 0
	}
	v := binary.LittleEndian.Uint64(p)
	if v > math.MaxInt64 {
		r.err = fmt.Errorf("%w: offset %d: %s %d out of range", ErrCorrupt, r.off-8, field, v)
		return 0
	}
	return int64(v)
}

// str reads a string of a lenBytes-byte length.
func (r *reader) str(lenBytes int, field string) string {
	p := r.take(lenBytes, field+" length")
	if p == nil {
		return ""
	}
	n := int(p[0])
	if lenBytes == 2 {
		n = int(binary.LittleEndian.Uint16(p))
	}
	s := r.take(n, field)
	if s == nil {
		return ""
	}
	if !utf8.Valid(s) {
		r.err = fmt.Errorf("%w: offset %d: %s %q is not valid UTF-8", ErrCorrupt, r.off-n, field, s)
		return ""
	}
	return string(s)
}

// Merge returns the days of a and b combined: days of the same zone, date
// and domain have their counters summed and their sketches merged (the
// union of their recipients). The result is ordered by zone, date and
// domain, shares no sketch with a or b, and is what a cluster's nodes
// reported as one.
func Merge(a, b []DomainDay) []DomainDay {
	out := make([]DomainDay, 0, len(a)+len(b))
	idx := map[[2]string]map[Date]int{}
	for _, src := range [][]DomainDay{a, b} {
		for i := range src {
			s := &src[i]
			k := [2]string{s.Zone, s.Domain}
			if idx[k] == nil {
				idx[k] = map[Date]int{}
			}
			j, ok := idx[k][s.Date]
			if !ok {
				j = len(out)
				idx[k][s.Date] = j
				out = append(out, DomainDay{Zone: s.Zone, Date: s.Date, Domain: s.Domain, Recipients: new(Sketch)})
			}
			o := &out[j]
			o.Admitted += s.Admitted
			o.Denied += s.Denied
			for _, r := range s.Rules {
				k := slices.IndexFunc(o.Rules, func(x RuleCount) bool { return x.Rule == r.Rule })
				if k < 0 {
					o.Rules = append(o.Rules, RuleCount{Rule: r.Rule})
					k = len(o.Rules) - 1
				}
				o.Rules[k].Denied += r.Denied
				o.Rules[k].WouldDeny += r.WouldDeny
			}
			if s.Recipients != nil {
				o.Recipients.Merge(s.Recipients)
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Rules, func(x, y RuleCount) int { return cmp.Compare(x.Rule, y.Rule) })
	}
	slices.SortFunc(out, func(x, y DomainDay) int {
		return cmp.Or(cmp.Compare(x.Zone, y.Zone), cmp.Compare(x.Date, y.Date), cmp.Compare(x.Domain, y.Domain))
	})
	return out
}
