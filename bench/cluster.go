package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/ring/gossip"
)

// LocalCluster is a freqring cluster the bench started in its own process,
// on 127.0.0.1 ports.
type LocalCluster struct {
	Addrs  []string // gRPC addresses
	nodes  []*node.Node
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   []error
}

// StartCluster starts size memory-only nodes serving rules (nil: the
// defaults), joined by gossip on 127.0.0.1, and waits until every node sees
// all of them.
func StartCluster(ctx context.Context, size int, rules *node.RuleSet, logger *slog.Logger) (*LocalCluster, error) {
	if size < 1 || size > 50 {
		return nil, fmt.Errorf("bench: cluster size %d out of range [1, 50]", size)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &LocalCluster{cancel: cancel, errs: make([]error, size)}
	var seed string
	for i := range size {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.Stop()
			return nil, err
		}
		gl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.Stop()
			return nil, err
		}
		gport := gl.Addr().(*net.TCPAddr).Port
		gl.Close()
		gc := &gossip.Config{BindAddr: "127.0.0.1", BindPort: gport}
		if seed != "" {
			gc.Join = []string{seed}
		} else {
			seed = fmt.Sprintf("127.0.0.1:%d", gport)
		}
		n, err := node.New(node.Config{Rules: rules, Name: fmt.Sprintf("bench-%d", i), Cluster: gc, Logger: logger})
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, lis.Addr().String())
		c.wg.Go(func() { c.errs[i] = n.Serve(runCtx, lis) })
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		for r := n.Ring(); r == nil || r.Len() != size; r = n.Ring() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				c.Stop()
				return nil, fmt.Errorf("bench: the local cluster did not form a ring of %d in 30 s", size)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c, nil
}

// Stop stops every node and waits for them.
func (c *LocalCluster) Stop() error {
	c.cancel()
	c.wg.Wait()
	return errors.Join(c.errs...)
}
