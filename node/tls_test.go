package node_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/internal/testcert"
	"github.com/freqring/freqring/internal/tlsfiles"
	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/node/nodetest"
)

// serveTLS serves n on 127.0.0.1 until the test ends and waits until it
// serves, asking its health over creds. It returns the address.
func serveTLS(t *testing.T, n *node.Node, creds credentials.TransportCredentials) string {
	t.Helper()
	return serveNode(t, n, grpc.WithTransportCredentials(creds))
}

func dialCreds(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	return dialNode(t, addr, grpc.WithTransportCredentials(creds))
}

// checkOne checks one recipient with a 10s deadline.
func checkOne(conn *grpc.ClientConn, opts ...grpc.CallOption) (*pb.CheckResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pb.NewLimiterClient(conn).Check(ctx, &pb.CheckRequest{Recipients: []string{"+8613800000001"}}, opts...)
}

// presenting is a client config trusting ca that presents leaf whatever CAs
// the server asks for (crypto/tls would otherwise send no certificate that
// the server's CAs did not issue).
func presenting(ca *testcert.CA, leaf testcert.Leaf) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool(), GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &leaf.Cert, nil
	}}
}

// TestTLSListener (issue 12, case 5): a node serving TLS answers a client
// that verifies it against the CA, and refuses a plaintext client, a client
// that trusts another CA, and, under RequireAndVerifyClientCert, a client
// without a certificate.
func TestTLSListener(t *testing.T) {
	ca, other := testcert.NewCA(t, "freqring test CA"), testcert.NewCA(t, "another CA")
	srv, cli := ca.Issue(t, "node-0"), ca.Issue(t, "client")
	for _, auth := range []tls.ClientAuthType{tls.NoClientCert, tls.VerifyClientCertIfGiven, tls.RequireAndVerifyClientCert} {
		t.Run(auth.String(), func(t *testing.T) {
			n, err := node.New(node.Config{SweepInterval: -1, TLS: &tls.Config{
				Certificates: []tls.Certificate{srv.Cert}, ClientCAs: ca.Pool(), ClientAuth: auth, MinVersion: tls.VersionTLS12}})
			if err != nil {
				t.Fatal(err)
			}
			withCert := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cli.Cert}})
			addr := serveTLS(t, n, withCert)

			if resp, err := checkOne(dialCreds(t, addr, withCert)); err != nil || !resp.Admitted[0] {
				t.Fatalf("TLS client with a certificate: %v, %v", resp, err)
			}
			noCert := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})
			_, err = checkOne(dialCreds(t, addr, noCert))
			if auth == tls.RequireAndVerifyClientCert {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("client without a certificate under %v: %v, want UNAVAILABLE (handshake refused)", auth, err)
				}
			} else if err != nil {
				t.Fatalf("client without a certificate under %v: %v", auth, err)
			}
			if _, err := checkOne(dialCreds(t, addr, insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
				t.Fatalf("plaintext client: %v, want UNAVAILABLE", err)
			}
			if _, err := checkOne(dialCreds(t, addr, credentials.NewTLS(&tls.Config{RootCAs: other.Pool()}))); status.Code(err) != codes.Unavailable {
				t.Fatalf("client trusting another CA: %v, want UNAVAILABLE", err)
			}
			if auth >= tls.VerifyClientCertIfGiven {
				creds := credentials.NewTLS(presenting(ca, other.Issue(t, "stranger")))
				if _, err := checkOne(dialCreds(t, addr, creds)); status.Code(err) != codes.Unavailable {
					t.Fatalf("client certificate of another CA under %v: %v, want UNAVAILABLE", auth, err)
				}
			}
		})
	}
}

// TestPeerMTLS (issue 12, case 5): a cluster whose peers authenticate with
// client certificates forwards between its nodes, and a caller without a
// verified client certificate cannot call the Peer service, while it may
// still call Check.
func TestPeerMTLS(t *testing.T) {
	ca := testcert.NewCA(t, "freqring test CA")
	nodeCert, clientCA := ca.Issue(t, "node", "freqring-peers"), testcert.NewCA(t, "clients CA")
	serverTLS := &tls.Config{Certificates: []tls.Certificate{nodeCert.Cert}, ClientCAs: ca.Pool(),
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	peerCreds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{nodeCert.Cert}})
	c, err := nodetest.Start(context.Background(), nodetest.Config{Size: 2,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(peerCreds)},
		Node: func(cfg *node.Config) {
			cfg.SweepInterval = -1
			cfg.TLS, cfg.PeerMTLS, cfg.PeerName = serverTLS, true, "freqring-peers"
			cfg.Peers = node.GRPCPeers(grpc.WithTransportCredentials(peerCreds))
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	ms := c.Members()
	a, b := ms[0], ms[1]

	// Recipients b owns, sent to a, are forwarded over mTLS.
	var req pb.CheckRequest
	r := a.Node.Ring()
	for i := 0; len(req.Recipients) < 10; i++ {
		rcp := fmt.Sprintf("+86138%08d", i)
		if r.OwnerString(rcp).Name == b.Name {
			req.Recipients = append(req.Recipients, rcp)
		}
	}
	noCert := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewLimiterClient(dialCreds(t, a.Addr, noCert)).Check(ctx, &req)
	if err != nil || len(resp.Errors) > 0 {
		t.Fatalf("Check through a of items b owns: %v, %v", err, resp.GetErrors())
	}
	if got := b.Node.Stats().ForwardedIn; got != int64(len(req.Recipients)) {
		t.Fatalf("b decided %d forwarded items, want %d", got, len(req.Recipients))
	}

	// The Peer service wants a verified client certificate; a client
	// certificate of another CA fails the handshake itself.
	peerCalls := func(conn *grpc.ClientConn) map[string]error {
		pc := pb.NewPeerClient(conn)
		out := map[string]error{}
		_, out["Forward"] = pc.Forward(ctx, &req)
		_, out["Acquire"] = pc.Acquire(ctx, &pb.AcquireRequest{Node: a.Name, RingEpoch: r.Epoch(), Partitions: []uint32{0}})
		_, out["Release"] = pc.Release(ctx, &pb.ReleaseRequest{Node: a.Name})
		_, out["Replicate"] = pc.Replicate(ctx, &pb.ReplicateRequest{Node: a.Name, RingEpoch: r.Epoch()})
		_, out["Fill"] = pc.Fill(ctx, &pb.FillRequest{Node: a.Name, RingEpoch: r.Epoch()})
		_, out["Handback"] = pc.Handback(ctx, &pb.HandbackRequest{Node: a.Name, RingEpoch: r.Epoch()})
		// A stream's refusal comes at its first Recv.
		out["ReplicateStream"] = func() error {
			st, err := pc.ReplicateStream(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&pb.ReplicateRequest{Node: a.Name, RingEpoch: r.Epoch(), CallId: 1}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = st.Recv()
			return err
		}()
		return out
	}
	before := b.Node.Stats()
	for method, err := range peerCalls(dialCreds(t, b.Addr, noCert)) {
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s without a client certificate: %v, want UNAUTHENTICATED", method, err)
		}
	}
	for method, err := range peerCalls(dialCreds(t, b.Addr, credentials.NewTLS(presenting(ca, clientCA.Issue(t, "stranger"))))) {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s with a certificate of another CA: %v, want UNAVAILABLE", method, err)
		}
	}
	// A client certificate of the nodes' CA without the peers' name.
	for method, err := range peerCalls(dialCreds(t, b.Addr, credentials.NewTLS(presenting(ca, ca.Issue(t, "a client"))))) {
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "not a peer's") {
			t.Errorf("%s with a client certificate without the peer name: %v, want UNAUTHENTICATED", method, err)
		}
	}
	if after := b.Node.Stats(); after.ForwardedIn != before.ForwardedIn || after.Checks != before.Checks {
		t.Fatalf("refused peer calls changed b: %+v -> %+v", before, after)
	}
	// A peer's certificate passes the interceptor (and reaches the handler,
	// which answers for itself).
	if _, err := pb.NewPeerClient(dialCreds(t, b.Addr, peerCreds)).Forward(ctx, &req); err != nil {
		t.Fatalf("Forward with the node certificate: %v", err)
	}

	// Admin wants a verified client certificate too, any the CA signed.
	set := &pb.OverrideSetRequest{Override: &pb.Override{Name: "vip", Domain: "default", Prefixes: []string{"+1"}, Exempt: true}}
	if _, err := pb.NewAdminClient(dialCreds(t, b.Addr, noCert)).SetOverride(ctx, set); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("SetOverride without a client certificate: %v, want UNAUTHENTICATED", err)
	}
	if l, _ := b.Node.ListOverrides(ctx, nil); len(l.Overrides) != 0 {
		t.Fatalf("a refused SetOverride changed b: %v", l.Overrides)
	}
	if _, err := pb.NewAdminClient(dialCreds(t, b.Addr, credentials.NewTLS(presenting(ca, ca.Issue(t, "an operator"))))).SetOverride(ctx, set); err != nil {
		t.Fatalf("SetOverride with an operator's certificate of the CA: %v", err)
	}
}

// TestPeerMTLSNeedsClientCerts: PeerMTLS without a TLS config that asks for
// client certificates is a config error, not a Peer service nobody can call.
func TestPeerMTLSNeedsClientCerts(t *testing.T) {
	for _, cfg := range []node.Config{{PeerMTLS: true}, {PeerMTLS: true, TLS: &tls.Config{ClientAuth: tls.RequestClientCert}}} {
		if _, err := node.New(cfg); err == nil {
			t.Fatalf("New(PeerMTLS, TLS %v) succeeded", cfg.TLS)
		}
	}
}

// TestRotatedCertificateServed: a node serving a tlsfiles.Reloader's
// config serves a certificate written over its files once the reloader's
// check is due, without a restart, and keeps the old one while the new
// files do not load.
func TestRotatedCertificateServed(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "freqring test CA")
	certFile, keyFile := ca.Issue(t, "first").Write(t, dir, "node")
	caFile := filepath.Join(dir, "ca.crt")
	testcert.WriteFile(t, caFile, ca.PEM)
	now := time.Unix(1_790_000_000, 0)
	r, err := tlsfiles.New(tlsfiles.Files{Cert: certFile, Key: keyFile, CA: caFile}, tlsfiles.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := r.ServerConfig(tls.NoClientCert)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{SweepInterval: -1, TLS: serverTLS})
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})
	addr := serveTLS(t, n, creds)
	served := func() string {
		t.Helper()
		var p peer.Peer
		if _, err := checkOne(dialCreds(t, addr, creds), grpc.Peer(&p)); err != nil { // a new connection: a new handshake
			t.Fatal(err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("serves %q, want first", got)
	}
	ca.Issue(t, "second").Write(t, dir, "node")
	if got := served(); got != "first" {
		t.Fatalf("before the check is due: serves %q, want first", got)
	}
	now = now.Add(time.Second)
	if got := served(); got != "second" {
		t.Fatalf("after the files changed: serves %q, want second", got)
	}
	testcert.WriteFile(t, certFile, []byte("half a certificate"))
	now = now.Add(time.Second)
	if got := served(); got != "second" {
		t.Fatalf("after a bad file: serves %q, want second (kept)", got)
	}
	if ok, failed := r.Reloads(); ok != 1 || failed != 1 {
		t.Fatalf("reloads %d ok, %d failed; want 1 and 1", ok, failed)
	}
}
