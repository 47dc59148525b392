package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/freqring/freqring/client"
	"github.com/freqring/freqring/node"
)

// startNode runs a node named n1 with the default rules on a free port of
// 127.0.0.1, until the returned stop is called. It returns once the node
// reports SERVING.
func startNode() (addr string, stop func(), err error) {
	n, err := node.New(node.Config{Name: "n1"})
	if err != nil {
		return "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.Serve(ctx, lis) }()
	stop = func() { cancel(); <-served }
	if err := waitServing(lis.Addr().String()); err != nil {
		stop()
		return "", nil, err
	}
	return lis.Addr().String(), stop, nil
}

// waitServing waits until the gRPC health service at addr reports SERVING.
func waitServing(addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	for {
		r, err := w.Recv()
		if err != nil {
			return err
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// The third identical message to a recipient within 59 seconds is denied by
// the default rule content-59s.
func Example() {
	addr, stop, err := startNode()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	msg := client.Item{Recipient: "+8613800000000", Content: []byte("your code is 1234")}
	for range 3 {
		d, err := c.Check(ctx, msg)
		switch {
		case err != nil:
			fmt.Println(err)
		case d.Degraded:
			fmt.Println("no node answered in time; admitted by the failure policy")
		case d.Admitted:
			fmt.Printf("admitted by %s: content-59s used %d of %d\n", d.Node, d.Rules[2].Used, d.Rules[2].Limit)
		default:
			fmt.Printf("denied by %s, retry after %v\n", d.DeniedBy, d.RetryAfter.Round(time.Second))
		}
	}
	// Output:
	// admitted by n1: content-59s used 1 of 2
	// admitted by n1: content-59s used 2 of 2
	// denied by content-59s, retry after 59s
}

// CheckBatch decides the items it can and lists the bad ones by index.
func ExampleClient_CheckBatch() {
	addr, stop, err := startNode()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, client.Config{Seeds: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	items := []client.Item{
		{Recipient: "+8613800000001"},
		{Recipient: ""},
		{Recipient: "+8613800000002", Domain: "marketing"},
		{Recipient: "+8613800000003", Cost: 20},
	}
	decs, err := c.CheckBatch(ctx, items)
	var bad client.ItemErrors
	if errors.As(err, &bad) {
		for _, e := range bad {
			fmt.Printf("item %d (%s): %v\n", e.Index, items[e.Index].Recipient, e.Code) // e.Message names the field

		}
	} else if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("item 0 admitted:", decs[0].Admitted)
	// Output:
	// item 1 (): InvalidArgument
	// item 2 (+8613800000002): InvalidArgument
	// item 3 (+8613800000003): InvalidArgument
	// item 0 admitted: true
}
