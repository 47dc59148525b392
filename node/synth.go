package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/freqring/freqring/ring"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/store"
	"github.com/freqring/freqring/wal"
	"github.com/freqring/freqring/window"
)

// This file writes synthetic state: a data directory holding a snapshot of
// N recipients at the seed's steady state, which a node started on it
// loads as it would its own (freqring synth). It is how a node with 100M
// recipients is built in minutes rather than by a day of traffic.

// MaxSynthRecipients is the largest SynthConfig.Recipients.
const MaxSynthRecipients = 1 << 31

// ErrDataDirNotEmpty reports a synth into a directory that holds files.
var ErrDataDirNotEmpty = errors.New("node: data directory not empty")

// SynthConfig configures Synthesize. A zero field takes the default named
// in its comment.
type SynthConfig struct {
	// DataDir is the directory to write; it must be absent or empty.
	DataDir string
	// Recipients is N, in [1, MaxSynthRecipients]: recipients
	// SynthRecipient(0) to SynthRecipient(N-1).
	Recipients int
	// Seed picks the sends; 0 means 1. The same seed, N and Now give the
	// same records, whatever Workers is.
	Seed uint64
	// Rules are the rules the node will serve; nil means the defaults. Every
	// domain with a recipient rule gets a record for every recipient.
	Rules *rules.Set
	// Now is the snapshot's time, unix ms; 0 means the system clock's now.
	// The node that loads it skips records older than their longest window
	// at its own clock.
	Now int64
	// Workers build partitions in parallel; 0 means GOMAXPROCS.
	Workers int
	// Partitions must equal the serving node's Placement.PartitionCount; 0
	// means ring.DefaultPartitionCount (what serve uses).
	Partitions int
}

// SynthStats report what Synthesize wrote.
type SynthStats struct {
	File       string   // the snapshot's path
	Domains    []string // domains that got records
	Recipients int64
	Records    int64         // records written, all domains (below Recipients × domains only on key collisions)
	Bytes      int64         // the snapshot's size
	Index      time.Duration // grouping the recipients by partition
	Took       time.Duration // everything, Index included
}

// SynthRecipient returns the recipient string of synthetic recipient i: "+86"
// followed by the 11 digits of 13,000,000,000 + i, a mainland mobile number.
// It is bench.RecipientName(i), so that `freqring bench --recipients N`
// checks the recipients a synth of N wrote.
func SynthRecipient(i uint64) string { return string(appendSynthRecipient(nil, i)) }

func appendSynthRecipient(dst []byte, i uint64) []byte {
	return strconv.AppendUint(append(dst, "+86"...), 13_000_000_000+i, 10)
}

// SynthSends appends to dst the sends of synthetic recipient i at the
// seed's steady state as of now (unix ms): window.AppendSteadyStateSends
// drawn from a generator seeded with (seed, i), so each recipient's sends
// depend on nothing else. Every domain gets the same sends.
func SynthSends(dst []window.Send, seed, i uint64, now int64) []window.Send {
	var g synthRand
	g.init()
	return g.sends(dst, seed, i, now)
}

// synthRand is a reseedable generator, reused across recipients.
type synthRand struct {
	pcg rand.PCG
	rng *rand.Rand
}

func (g *synthRand) init() { g.rng = rand.New(&g.pcg) }

func (g *synthRand) sends(dst []window.Send, seed, i uint64, now int64) []window.Send {
	g.pcg.Seed(seed, i)
	return window.AppendSteadyStateSends(dst, g.rng, now)
}

func (c *SynthConfig) fill() {
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Rules == nil {
		c.Rules = rules.Default()
	}
	if c.Now == 0 {
		c.Now = time.Now().UnixMilli()
	}
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Partitions == 0 {
		c.Partitions = ring.DefaultPartitionCount
	}
}

func (c *SynthConfig) validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("node: synth: DataDir is empty")
	case c.Recipients < 1 || c.Recipients > MaxSynthRecipients:
		return fmt.Errorf("node: synth: Recipients %d out of range [1, %d]", c.Recipients, MaxSynthRecipients)
	case c.Now < 0 || c.Now >= 1<<44:
		return fmt.Errorf("node: synth: Now %d ms out of range [0, 2^44)", c.Now)
	case c.Workers < 1 || c.Workers > 1024:
		return fmt.Errorf("node: synth: Workers %d out of range [1, 1024]", c.Workers)
	case c.Partitions < 1 || c.Partitions > store.MaxPartitions:
		return fmt.Errorf("node: synth: Partitions %d out of range [1, %d]", c.Partitions, store.MaxPartitions)
	}
	return nil
}

// Synthesize writes into cfg.DataDir, which must be absent or empty, a
// snapshot in the node's own format (format 4, one image per partition, made
// by package store as a node's are) holding cfg.Recipients recipients at the
// seed's steady state (window.SteadyStateSends: 30 sends over the last 24
// hours, 3 contents in the last hour) in every domain of cfg.Rules that has
// a recipient rule, and no WAL: a node started on the directory loads it and
// serves. A non-empty directory is refused with an error wrapping
// ErrDataDirNotEmpty that names it, and nothing is written.
//
// Workers build partitions in parallel, each partition's records into a
// store of its own (window.Domain.Build, then store.MergeRecord), and the
// snapshot is written partition by partition as they are ready: besides an
// index of 4 bytes per recipient (which recipients fall in which
// partition), memory holds a few partitions at a time, never the whole
// state. The directory is locked as a node locks it while this runs.
func Synthesize(ctx context.Context, cfg SynthConfig) (SynthStats, error) {
	start := time.Now()
	var ss SynthStats
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return ss, err
	}
	domains, names, err := synthDomains(cfg.Rules)
	if err != nil {
		return ss, err
	}
	ss.Domains = names
	dir := cfg.DataDir
	lock, err := lockEmptyDir(dir)
	if err != nil {
		return ss, err
	}
	defer lock.unlock()

	idx, offs := synthIndex(cfg.Recipients, cfg.Partitions, cfg.Workers)
	ss.Index = time.Since(start)
	from := wal.Position{} // replay the whole WAL, which is empty
	st, err := newSynthPipeline(cfg, domains, idx, offs).write(ctx, dir, from)
	if err != nil {
		os.Remove(filepath.Join(dir, LockFile)) // leave the directory as found: empty
		return ss, fmt.Errorf("node: synth: %w", err)
	}
	ss.File = filepath.Join(dir, snapName(from.Seq))
	ss.Recipients, ss.Records, ss.Bytes = int64(cfg.Recipients), st.Records, st.Bytes
	ss.Took = time.Since(start)
	return ss, nil
}

// synthDomains returns the domains of rs that have a recipient rule, and
// their names; an error if none has.
func synthDomains(rs *rules.Set) ([]*window.Domain, []string, error) {
	var domains []*window.Domain
	var names []string
	for _, name := range rs.Names() {
		d := rs.Domain(name)
		for _, r := range d.Rules() {
			if r.Scope == window.ScopeRecipient {
				domains = append(domains, d)
				names = append(names, name)
				break
			}
		}
	}
	if len(domains) == 0 {
		return nil, nil, fmt.Errorf("node: synth: rules %s have no domain with a recipient rule", rs.Source())
	}
	return domains, names, nil
}

// lockEmptyDir creates dir if absent and locks it as a node does, refusing
// (ErrDataDirNotEmpty) a directory that holds anything, before or after the
// lock is taken.
func lockEmptyDir(dir string) (*dirLock, error) {
	if err := checkEmptyDir(dir, false); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if err := checkEmptyDir(dir, true); err != nil { // another synth got here first
		lock.unlock()
		return nil, err
	}
	return lock, nil
}

// synthPipeline builds partition images on cfg.Workers goroutines and hands
// them to the snapshot writer in partition order. At most 2×Workers images
// are built and not yet written at a time.
type synthPipeline struct {
	cfg     SynthConfig
	domains []*window.Domain
	idx     []uint32 // recipients grouped by partition (synthIndex)
	offs    []int

	next   atomic.Int64      // the next partition a worker takes
	stop   chan struct{}     // closed when the writer is done, or failed
	tokens chan struct{}     // one per image built and not yet written
	ready  []chan synthImage // by partition: its image, once built
	bufs   sync.Pool         // *[]byte: images go from a worker to the writer, and back
	wg     sync.WaitGroup
}

// synthImage is one partition's image, its record count, or why it failed.
type synthImage struct {
	img *[]byte
	n   int64
	err error
}

func newSynthPipeline(cfg SynthConfig, domains []*window.Domain, idx []uint32, offs []int) *synthPipeline {
	sp := &synthPipeline{
		cfg: cfg, domains: domains, idx: idx, offs: offs,
		stop:   make(chan struct{}),
		tokens: make(chan struct{}, 2*cfg.Workers),
		ready:  make([]chan synthImage, cfg.Partitions),
	}
	for p := range sp.ready {
		sp.ready[p] = make(chan synthImage, 1)
	}
	return sp
}

// write starts the workers and writes the snapshot into dir as their images
// arrive; the workers have stopped when it returns.
func (sp *synthPipeline) write(ctx context.Context, dir string, from wal.Position) (snapshotStats, error) {
	for range sp.cfg.Workers {
		sp.wg.Go(func() { sp.work(ctx) })
	}
	defer func() {
		close(sp.stop)
		sp.wg.Wait()
	}()
	return writeSnapshotFile(dir, from, sp.cfg.Now, sp.cfg.Partitions, 0, func(dst []byte, p int) ([]byte, int64, error) {
		return sp.take(ctx, dst, p)
	})
}

// work builds partitions, in the order it takes their numbers, until none
// is left or the writer stops.
func (sp *synthPipeline) work(ctx context.Context) {
	b := newSynthBuilder(sp.cfg, sp.domains)
	for {
		// A token before a partition number: the partition the writer waits
		// for always has one.
		select {
		case sp.tokens <- struct{}{}:
		case <-sp.stop:
			return
		}
		select {
		case <-sp.stop: // the write failed: take no more partitions
			return
		default:
		}
		p := int(sp.next.Add(1) - 1)
		if p >= sp.cfg.Partitions {
			return
		}
		var r synthImage
		if r.err = ctx.Err(); r.err == nil {
			buf, _ := sp.bufs.Get().(*[]byte)
			if buf == nil {
				buf = new([]byte)
			}
			*buf, r.n, r.err = b.partition((*buf)[:0], p, sp.idx[sp.offs[p]:sp.offs[p+1]])
			r.img = buf
		}
		sp.ready[p] <- r
	}
}

// take waits for partition p's image and appends it to dst.
func (sp *synthPipeline) take(ctx context.Context, dst []byte, p int) ([]byte, int64, error) {
	var r synthImage
	select {
	case r = <-sp.ready[p]:
	case <-ctx.Done():
		return dst, 0, ctx.Err()
	}
	<-sp.tokens
	if r.err != nil {
		return dst, 0, r.err
	}
	dst = append(dst, *r.img...)
	sp.bufs.Put(r.img)
	return dst, r.n, nil
}

// checkEmptyDir returns an error wrapping ErrDataDirNotEmpty, naming dir and
// a file in it, if dir holds anything (but its lock file, with lockHeld).
func checkEmptyDir(dir string, lockHeld bool) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if lockHeld && e.Name() == LockFile {
			continue
		}
		return fmt.Errorf("%w: %s holds %s and %d more entries; synth writes only into an empty directory", ErrDataDirNotEmpty, dir, e.Name(), len(ents)-1)
	}
	return nil
}

// synthIndex returns the recipients 0..n-1 grouped by partition:
// idx[offs[p]:offs[p+1]] are those of partition p, ascending. Two parallel
// passes (count, then place) hash every recipient twice rather than keep
// its partition.
func synthIndex(n, parts, workers int) (idx []uint32, offs []int) {
	workers = min(workers, n)
	counts := make([][]int, workers)
	span := func(w int) (int, int) { return w * n / workers, (w + 1) * n / workers }
	each := func(fn func(w int)) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { fn(w) })
		}
		wg.Wait()
	}
	each(func(w int) {
		c := make([]int, parts)
		var buf []byte
		lo, hi := span(w)
		for i := lo; i < hi; i++ {
			buf = appendSynthRecipient(buf[:0], uint64(i))
			key, _ := KeyOf(unsafe.String(unsafe.SliceData(buf), len(buf)))
			c[key%uint64(parts)]++
		}
		counts[w] = c
	})
	// Worker w's recipients of partition p start at offs[p] plus the
	// counts of the workers before it, so each partition stays ascending.
	offs = make([]int, parts+1)
	at := make([][]int, workers)
	for w := range workers {
		at[w] = make([]int, parts)
	}
	sum := 0
	for p := range parts {
		offs[p] = sum
		for w := range workers {
			at[w][p] = sum
			sum += counts[w][p]
		}
	}
	offs[parts] = sum
	idx = make([]uint32, n)
	each(func(w int) {
		pos := at[w]
		var buf []byte
		lo, hi := span(w)
		for i := lo; i < hi; i++ {
			buf = appendSynthRecipient(buf[:0], uint64(i))
			key, _ := KeyOf(unsafe.String(unsafe.SliceData(buf), len(buf)))
			p := key % uint64(parts)
			idx[pos[p]] = uint32(i)
			pos[p]++
		}
	})
	return idx, offs
}

// synthBuilder builds partition images; one per worker, not safe for
// concurrent use.
type synthBuilder struct {
	cfg   SynthConfig
	st    *store.Store
	refs  []store.Ref
	g     synthRand
	s     window.Scratch
	sends []window.Send
	name  []byte
}

func newSynthBuilder(cfg SynthConfig, domains []*window.Domain) *synthBuilder {
	st, err := store.New(store.Config{Partitions: cfg.Partitions})
	if err != nil {
		panic("BUG: synth: " + err.Error()) // cfg was validated
	}
	b := &synthBuilder{cfg: cfg, st: st}
	for _, d := range domains {
		b.refs = append(b.refs, st.Bind(d))
	}
	b.g.init()
	return b
}

// partition appends to dst the image of partition p holding recipients
// recips, and returns it with its record count.
func (b *synthBuilder) partition(dst []byte, p int, recips []uint32) ([]byte, int64, error) {
	defer b.st.Drop(p)
	for _, i := range recips {
		b.name = appendSynthRecipient(b.name[:0], uint64(i))
		key, tag := KeyOf(unsafe.String(unsafe.SliceData(b.name), len(b.name)))
		b.sends = b.g.sends(b.sends[:0], b.cfg.Seed, uint64(i), b.cfg.Now)
		for _, ref := range b.refs {
			rec, err := ref.Rules().Build(&b.s, tag, b.sends)
			if err != nil {
				return nil, 0, fmt.Errorf("recipient %s: %w", b.name, err)
			}
			if rec == nil {
				continue
			}
			if _, err := b.st.MergeRecord(p, ref, key, rec, b.cfg.Now); err != nil {
				return nil, 0, fmt.Errorf("recipient %s: %w", b.name, err)
			}
		}
	}
	dst, n := b.st.AppendImage(dst, p)
	return dst, n, nil
}
