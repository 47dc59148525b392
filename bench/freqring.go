package bench

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/client"
)

// FreqringTarget checks through the ring-aware client: each item goes to its
// owner, a batch of items as one request per owner (CheckBatch, each on a
// pooled CheckStream), a batch of one as a single Check (which the client
// coalesces with other callers' and sends on a CheckStream per owner); with
// client.Config.UnaryChecks both go as unary Checks.
type FreqringTarget struct {
	c      *client.Client
	dial   []grpc.DialOption // of the Status calls: the client's credentials
	domain string
	hashes []uint64
}

// NewFreqringTarget connects a client to the cluster behind seeds.
func NewFreqringTarget(ctx context.Context, seeds []string, domain string, templates int, cfg client.Config) (*FreqringTarget, error) {
	cfg.Seeds = seeds
	c, err := client.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t := &FreqringTarget{c: c, domain: domain, dial: cfg.DialOptions}
	if t.dial == nil {
		creds := insecure.NewCredentials()
		if cfg.TLS != nil {
			creds = credentials.NewTLS(cfg.TLS)
		}
		t.dial = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	}
	for i := range templates {
		t.hashes = append(t.hashes, TemplateHash(uint16(i)))
	}
	return t, nil
}

// Name implements Target.
func (t *FreqringTarget) Name() string { return "freqring" }

// Client returns the target's client, for its counters.
func (t *FreqringTarget) Client() *client.Client { return t.c }

// Check implements Target.
func (t *FreqringTarget) Check(ctx context.Context, items []Item, out []Result) error {
	cis := make([]client.Item, len(items))
	for i, it := range items {
		cis[i] = client.Item{Domain: t.domain, Recipient: RecipientName(it.Recipient), ContentHash: t.hashes[it.Template]}
	}
	if len(items) == 1 {
		d, err := t.c.Check(ctx, cis[0])
		out[0] = result(d, err)
		if errors.Is(err, client.ErrClosed) {
			return err
		}
		return nil
	}
	decs, err := t.c.CheckBatch(ctx, cis)
	var bad client.ItemErrors
	if err != nil && !errors.As(err, &bad) {
		return err
	}
	for i := range items {
		out[i] = result(decs[i], nil)
	}
	for _, e := range bad {
		out[e.Index] = Result{Err: e}
	}
	return nil
}

func result(d client.Decision, err error) Result {
	if err != nil {
		return Result{Err: err}
	}
	return Result{Admitted: d.Admitted, At: d.DecidedAt.UnixMilli(), Degraded: d.Degraded}
}

// Memory implements Target: the store heap (index and slabs) of every
// member, backups included, and the recipients they decide for, from their
// Status.
func (t *FreqringTarget) Memory(ctx context.Context) (int64, int64, error) {
	var bytes, records int64
	for _, m := range t.c.Ring().Members() {
		conn, err := grpc.NewClient(m.Addr, t.dial...)
		if err != nil {
			return 0, 0, err
		}
		st, err := pb.NewLimiterClient(conn).Status(ctx, &pb.StatusRequest{})
		conn.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("bench: status of %s: %w", m.Name, err)
		}
		var all int64
		for _, d := range st.Domains {
			bytes += d.HeapBytes
			all += d.Records
		}
		if st.OwnedRecords > 0 || st.PartitionsOwned > 0 {
			records += st.OwnedRecords // backups are not recipients of their own
		} else {
			records += all // a node that does not report it
		}
	}
	return bytes, records, nil
}

// Close implements Target.
func (t *FreqringTarget) Close() error { return t.c.Close() }
