package gateway

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkDecodeCheck measures DecodeCheck against decodeCheckStd, the
// encoding/json decoder it replaced, on one item and on a batch of 100.
//
//	go test -run '^$' -bench BenchmarkDecodeCheck ./gateway
func BenchmarkDecodeCheck(b *testing.B) {
	single := []byte(`{"recipient":"+8613800000000","content":"Your code is 1234","domain":"default","cost":1,"request_id":"18446744073709551615"}`)
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"recipient":"+86138000` + strconv.Itoa(10000+i) + `","content":"Your code is 1234","mode":"check"}`)
	}
	sb.WriteString(`]}`)
	batch := []byte(sb.String())
	for _, body := range []struct {
		name string
		b    []byte
	}{{"single", single}, {"batch100", batch}} {
		b.Run(body.name+"/handwritten", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body.b)))
			for b.Loop() {
				if _, _, _, err := DecodeCheck(body.b); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(body.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body.b)))
			for b.Loop() {
				if _, _, err := decodeCheckStd(body.b); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
