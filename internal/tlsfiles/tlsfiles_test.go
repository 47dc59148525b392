package tlsfiles

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/freqring/freqring/internal/testcert"
)

func TestNewNamesTheBadFile(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "ca")
	cert, key := ca.Issue(t, "a").Write(t, dir, "a")
	_, otherKey := ca.Issue(t, "b").Write(t, dir, "b")
	caFile, junk := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "junk")
	testcert.WriteFile(t, caFile, ca.PEM)
	testcert.WriteFile(t, junk, []byte("not PEM"))
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name  string
		f     Files
		which string
		path  string
	}{
		{"missing cert", Files{Cert: missing, Key: key}, "cert", missing},
		{"missing key", Files{Cert: cert, Key: missing}, "key", missing},
		{"key of another cert", Files{Cert: cert, Key: otherKey}, "cert", cert},
		{"junk cert", Files{Cert: junk, Key: key}, "cert", junk},
		{"missing CA", Files{CA: missing}, "ca", missing},
		{"junk CA", Files{CA: junk}, "ca", junk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.f, Options{})
			var fe *FileError
			if !errors.As(err, &fe) || fe.Which != tc.which || fe.Path != tc.path || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("New: %v, want a FileError naming %s %s", err, tc.which, tc.path)
			}
		})
	}
	if _, err := New(Files{Cert: cert}, Options{}); err == nil || !strings.Contains(err.Error(), cert) {
		t.Fatalf("cert without key: %v", err)
	}
	r, err := New(Files{Cert: cert, Key: key}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ServerConfig(tls.RequireAndVerifyClientCert); err == nil {
		t.Fatal("ServerConfig verifying client certificates without a CA succeeded")
	}
	if _, err := (&Reloader{}).ServerConfig(tls.NoClientCert); err == nil {
		t.Fatal("ServerConfig without a certificate succeeded")
	}
}

// handshake runs one TLS handshake of r's client credentials, expecting
// serverName, against a server presenting leaf, over loopback TCP (a
// net.Pipe has no buffer: both sides writing at once deadlock).
func handshake(t *testing.T, r *Reloader, serverName string, leaf testcert.Leaf) (string, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := lis.Accept()
		if err != nil {
			return
		}
		tls.Server(s, &tls.Config{Certificates: []tls.Certificate{leaf.Cert}, NextProtos: []string{"h2"}}).Handshake()
		s.Close()
	}()
	defer func() { <-done }()
	c, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, info, err := r.ClientCredentials(serverName).ClientHandshake(ctx, "localhost:7070", c)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return info.(credentials.TLSInfo).State.PeerCertificates[0].Subject.CommonName, nil
}

// TestClientCredentialsReloadTheCA: a client's CA bundle written anew is
// used from the next handshake once a check is due.
func TestClientCredentialsReloadTheCA(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := testcert.NewCA(t, "old"), testcert.NewCA(t, "new")
	caFile := filepath.Join(dir, "ca.crt")
	testcert.WriteFile(t, caFile, oldCA.PEM)
	now := time.Unix(1_790_000_000, 0)
	r, err := New(Files{CA: caFile}, Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	oldLeaf, newLeaf := oldCA.Issue(t, "old-server"), newCA.Issue(t, "new-server")
	if got, err := handshake(t, r, "", oldLeaf); err != nil || got != "old-server" {
		t.Fatalf("old CA, old server: %q, %v", got, err)
	}
	if _, err := handshake(t, r, "", newLeaf); err == nil {
		t.Fatal("old CA accepted a server of the new CA")
	}
	testcert.WriteFile(t, caFile, append(append([]byte{}, oldCA.PEM...), newCA.PEM...))
	now = now.Add(999 * time.Millisecond)
	if _, err := handshake(t, r, "", newLeaf); err == nil {
		t.Fatal("the CA file was read again before CheckInterval")
	}
	now = now.Add(time.Millisecond)
	for _, l := range []testcert.Leaf{oldLeaf, newLeaf} {
		if _, err := handshake(t, r, "", l); err != nil {
			t.Fatalf("bundle of both CAs: %v", err)
		}
	}
	// The name the server's certificate must carry is checked.
	if _, err := handshake(t, r, "other.example", newLeaf); err == nil {
		t.Fatal("a server certificate without the server name passed")
	}
	if _, err := handshake(t, r, "127.0.0.1", newLeaf); err != nil {
		t.Fatalf("server name 127.0.0.1: %v", err)
	}
}
