package bench

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Workload is the traffic a bench sends: the seed's message platform, in
// which every check names a recipient drawn from a large population and one
// of a few message templates. It is deterministic for a given Seed.
type Workload struct {
	Recipients int     // population size; 0 means 1,000,000
	Zipf       float64 // skew of recipient popularity: 0 means uniform, otherwise Zipf's s (> 1)
	Templates  int     // distinct message contents; 0 means 20
	Domain     string  // rule domain; "" means "default"
	Seed       uint64  // 0 means 1
	Offset     uint32  // index of the first recipient, to give runs disjoint populations
}

func (w *Workload) fill() {
	if w.Recipients == 0 {
		w.Recipients = 1_000_000
	}
	if w.Templates == 0 {
		w.Templates = 20
	}
	if w.Domain == "" {
		w.Domain = "default"
	}
	if w.Seed == 0 {
		w.Seed = 1
	}
}

func (w *Workload) validate() error {
	switch {
	case w.Recipients < 1 || w.Recipients > 1<<31:
		return fmt.Errorf("bench: Recipients %d out of range [1, %d]", w.Recipients, 1<<31)
	case w.Zipf != 0 && w.Zipf <= 1:
		return fmt.Errorf("bench: Zipf %g: want 0 (uniform) or s > 1", w.Zipf)
	case w.Templates < 1 || w.Templates > 1<<16:
		return fmt.Errorf("bench: Templates %d out of range [1, 65536]", w.Templates)
	}
	return nil
}

// Item is one check the bench sends: a recipient (by index into the
// population) and a template.
type Item struct {
	Recipient uint32
	Template  uint16
}

// RecipientName is the recipient string of index i: a mainland mobile number.
func RecipientName(i uint32) string { return "+86" + strconv.FormatUint(13_000_000_000+uint64(i), 10) }

// TemplateText is the message content of template t.
func TemplateText(t uint16) string {
	return fmt.Sprintf("[freqring] template %d: your verification code is valid for 5 minutes.", t)
}

// TemplateHash is the 64-bit content hash of template t, as the node
// computes it (xxhash64 of the content bytes).
func TemplateHash(t uint16) uint64 { return max(xxhash.Sum64String(TemplateText(t)), 1) }

// generator draws items of a workload. Not safe for concurrent use: each
// worker has its own, seeded from the workload's seed and its number.
type generator struct {
	w    Workload
	rng  *rand.Rand
	zipf *rand.Zipf
}

func (w *Workload) generator(worker int) *generator {
	g := &generator{w: *w, rng: rand.New(rand.NewPCG(w.Seed, uint64(worker)+1))}
	if w.Zipf > 1 {
		g.zipf = rand.NewZipf(g.rng, w.Zipf, 1, uint64(w.Recipients-1))
	}
	return g
}

func (g *generator) next() Item {
	var r uint32
	if g.zipf != nil {
		// Zipf ranks from 0: scatter them so that popular recipients are
		// not neighbours in the key space.
		r = uint32((g.zipf.Uint64()*0x9e3779b1 + 7) % uint64(g.w.Recipients))
	} else {
		r = uint32(g.rng.IntN(g.w.Recipients))
	}
	return Item{Recipient: r + g.w.Offset, Template: uint16(g.rng.IntN(g.w.Templates))}
}
