package wire

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
)

// Detail returns an item error's message without the "FIELD[INDEX]: " (or
// "FIELD: ") that names its field first, for a front end that names the
// field (e.Field, and the item's index) its own way; the message as it is
// when it names no field.
func Detail(e *pb.ItemError) string {
	if e.Field == "" {
		return e.Message
	}
	rest, ok := strings.CutPrefix(e.Message, e.Field)
	if !ok {
		return e.Message
	}
	if strings.HasPrefix(rest, "[") {
		if k := strings.IndexByte(rest, ']'); k >= 0 {
			rest = rest[k+1:]
		}
	}
	if d, ok := strings.CutPrefix(rest, ": "); ok {
		return d
	}
	return e.Message
}

// Violation returns the field and description of the first field violation
// of a google.rpc.BadRequest in st's details, the column of a malformed
// batch; "" when it has none.
func Violation(st *status.Status) (field, desc string) {
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 {
			return br.FieldViolations[0].Field, br.FieldViolations[0].Description
		}
	}
	return "", ""
}
