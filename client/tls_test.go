package client

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/freqring/freqring/internal/testcert"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// TestTLS: Config.TLS reaches a cluster that serves TLS and asks for client
// certificates; a plaintext client does not, and setting TLS beside
// DialOptions is refused.
func TestTLS(t *testing.T) {
	ca := testcert.NewCA(t, "freqring test CA")
	srv, cli := ca.Issue(t, "node"), ca.Issue(t, "client")
	clientTLS := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cli.Cert}}
	lc, err := nodetest.Start(context.Background(), nodetest.Config{Size: 2,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(clientTLS))},
		Node: func(cfg *node.Config) {
			cfg.TLS = &tls.Config{Certificates: []tls.Certificate{srv.Cert}, ClientCAs: ca.Pool(),
				ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
			cfg.PeerMTLS = true
			cfg.Peers = node.GRPCPeers(grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, Config{Seeds: lc.Addrs(), Timeout: patient, TLS: clientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	items := []Item{{Recipient: "+8613800000001"}, {Recipient: "+8613800000002"}, {Recipient: "+8613800000003"}}
	decs, err := c.CheckBatch(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range decs {
		if !d.Admitted || d.Degraded {
			t.Fatalf("item %d: %+v, want admitted by a node", i, d)
		}
	}

	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if c, err := New(short, Config{Seeds: lc.Addrs()}); err == nil {
		c.Close()
		t.Fatal("a plaintext client reached a TLS cluster")
	}
	if _, err := New(ctx, Config{Seeds: lc.Addrs(), TLS: clientTLS, DialOptions: []grpc.DialOption{}}); err == nil {
		t.Fatal("TLS beside DialOptions was accepted")
	}
}
