package node_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

// BenchmarkReload256Domains measures a reload of a rules file of 256
// domains (rules.MaxDomains) of 4 rules each, on a node holding no records:
// file parses and validates the file, then reloads it (what a file change or
// SIGHUP costs); swap is Reload alone. Each iteration alternates between
// two files that differ in one limit, so that none is a no-op.
func BenchmarkReload256Domains(b *testing.B) {
	file := func(limit int) []byte {
		var sb strings.Builder
		sb.WriteString("domains:\n")
		for d := range rules.MaxDomains {
			fmt.Fprintf(&sb, "  - name: tenant-%03d\n    rules:\n", d)
			fmt.Fprintf(&sb, "      - {name: r-1m, scope: recipient, limit: %d, window: 1m}\n", limit)
			sb.WriteString("      - {name: r-24h, scope: recipient, limit: 50, window: 24h}\n")
			sb.WriteString("      - {name: c-59s, scope: recipient+content, limit: 2, window: 59s}\n")
			sb.WriteString("      - {name: c-59m, scope: recipient+content, limit: 5, window: 59m}\n")
		}
		return []byte(sb.String())
	}
	files := [][]byte{file(15), file(16)}
	rs0, err := rules.Parse("a.yaml", files[0])
	if err != nil {
		b.Fatal(err)
	}
	n, err := node.New(node.Config{Rules: rs0, SweepInterval: -1, Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	if err := n.Open(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	rs1, err := rules.Parse("b.yaml", files[1])
	if err != nil {
		b.Fatal(err)
	}
	b.Run("file", func(b *testing.B) {
		b.SetBytes(int64(len(files[0])))
		i := 1
		for b.Loop() {
			rs, err := rules.Parse("rules.yaml", files[i%2])
			if err != nil {
				b.Fatal(err)
			}
			if err := n.Reload(context.Background(), rs); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("swap", func(b *testing.B) {
		sets := []*rules.Set{rs0, rs1}
		i := 1
		for b.Loop() {
			if err := n.Reload(context.Background(), sets[i%2]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
