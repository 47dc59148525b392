package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/ring"
)

func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7070", "gRPC address of any node")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of each call")
	wait := fs.Duration("wait", 0, "first wait up to this long for the node at --addr to report SERVING on gRPC health (a starting node is NOT_SERVING while it recovers); 0 does not wait")
	tf := addTLSFlags(fs, false)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: freqring status [flags]\n\nShows the ring as one node sees it, and each member's state, partitions, records and counters.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	dial, err := tf.dialOptions(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	if *wait > 0 {
		if err := waitServing(ctx, *addr, dial, *wait); err != nil {
			return err
		}
	}
	rr, err := withLimiter(ctx, *addr, dial, *timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.RingResponse, error) {
		return c.Ring(ctx, &pb.RingRequest{})
	})
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	members := make([]ring.Member, len(rr.Members))
	for i, m := range rr.Members {
		members[i] = ring.Member{Name: m.Name, Addr: m.Addr}
	}
	p := rr.Placement
	r, err := ring.New(members, ring.Config{PartitionCount: int(p.GetPartitionCount()), ReplicationFactor: int(p.GetReplicationFactor()), Load: p.GetLoad()})
	if err != nil {
		return err
	}
	if r.Epoch() != rr.Epoch {
		fmt.Fprintf(stdout, "warning: this build places keys differently from %s (epoch %016x here, %016x there)\n", rr.Node, r.Epoch(), rr.Epoch)
	}
	fmt.Fprintf(stdout, "ring epoch %016x as seen by %s: %d members, %d partitions (virtual nodes %d, load %.2f)\n\n",
		rr.Epoch, rr.Node, len(rr.Members), p.GetPartitionCount(), p.GetReplicationFactor(), p.GetLoad())
	counts := r.Counts()
	inRing := map[string]bool{}
	for _, m := range rr.Members {
		inRing[m.Name] = true
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDR\tSTATE\tIN RING\tPARTITIONS\tOPEN\tBACKED\tMOVING\tRECORDS\tCHECKS\tADMITTED\tDENIED\tFWD OUT\tFWD IN\tREPLICATION\tSTORE\tCLOCK\tEPOCH")
	for _, m := range rr.Known {
		row := fmt.Sprintf("%s\t%s\t%s\t%v\t%d", m.Name, m.Addr, m.State, inRing[m.Name], counts[m.Name])
		st, err := withLimiter(ctx, m.Addr, dial, *timeout, func(ctx context.Context, c pb.LimiterClient) (*pb.StatusResponse, error) {
			return c.Status(ctx, &pb.StatusRequest{})
		})
		if err != nil {
			fmt.Fprintf(tw, "%s\t(unreachable: %v)\n", row, err)
			continue
		}
		var records int64
		for _, d := range st.Domains {
			records += d.Records
		}
		epoch := "same"
		if st.RingEpoch != rr.Epoch {
			epoch = fmt.Sprintf("%016x", st.RingEpoch)
		}
		repl := fmt.Sprintf("%s %d sent %d failed %d lag", st.Replication, st.ReplicatedSends, st.ReplicationFailures, st.ReplicationLag)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", row, st.PartitionsOwned-st.PartitionsMoving, st.PartitionsBacked,
			st.PartitionsMoving, records, st.Checks, st.Admitted, st.Denied, st.ForwardedOut, st.ForwardedIn, repl, storeColumn(st), clockColumn(st), epoch)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range rr.Known {
		if m.Excluded != "" {
			fmt.Fprintf(stdout, "%s (%s) is left out of the ring and owns no partitions: it %s\n", m.Name, m.Version, m.Excluded)
		}
	}
	return nil
}

// clockColumn is the CLOCK column: the node's clock minus the majority's,
// and SKEWED while that is beyond its --max-clock-skew.
func clockColumn(st *pb.StatusResponse) string {
	c := fmt.Sprintf("%+dms", st.ClockOffsetMs)
	if st.ClockSkewed {
		c += " SKEWED"
	}
	return c
}

// withLimiter dials addr with dial and makes one Limiter call with a
// deadline.
func withLimiter[T any](ctx context.Context, addr string, dial []grpc.DialOption, timeout time.Duration, call func(context.Context, pb.LimiterClient) (T, error)) (T, error) {
	return withConn(ctx, addr, dial, timeout, pb.NewLimiterClient, call)
}

// withConn dials addr with dial, makes a client of one service with
// newClient, and makes one call with a deadline.
func withConn[C, T any](ctx context.Context, addr string, dial []grpc.DialOption, timeout time.Duration,
	newClient func(grpc.ClientConnInterface) C, call func(context.Context, C) (T, error)) (T, error) {
	var zero T
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return call(ctx, newClient(conn))
}

// waitServing watches the gRPC health of the node at addr until it reports
// SERVING, for at most d. Until the node listens, the call waits for the
// connection (gRPC's reconnect backoff, from 1s).
func waitServing(ctx context.Context, addr string, dial []grpc.DialOption, d time.Duration) error {
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	for err == nil {
		var resp *healthpb.HealthCheckResponse
		if resp, err = stream.Recv(); err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
	return fmt.Errorf("%s: not SERVING within --wait %v: %w", addr, d, err)
}

// storeColumn shows a member's store: the heap it holds, of its limit if it
// has one, and the items refused at that limit.
func storeColumn(st *pb.StatusResponse) string {
	if st.StoreLimitBytes == 0 {
		return mib(st.StoreBytes)
	}
	return fmt.Sprintf("%s of %s, %d refused", mib(st.StoreBytes), mib(st.StoreLimitBytes), st.MemoryRefusals)
}

// mib shows a byte count in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
