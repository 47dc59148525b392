package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/freqring/freqring/internal/testcert"
	"github.com/freqring/freqring/node/nodetest"
	"github.com/freqring/freqring/ring/gossip"
)

// TestServeTLS (issue 12, case 5): serve with the TLS flags answers check
// and status given the same flags, and refuses them in plaintext or
// without a client certificate under --tls-client-auth require.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "freqring test CA")
	caFile := filepath.Join(dir, "ca.crt")
	testcert.WriteFile(t, caFile, ca.PEM)
	srvCert, srvKey := ca.Issue(t, "node").Write(t, dir, "node")
	cliLeaf := ca.Issue(t, "client")
	cliCert, cliKey := cliLeaf.Write(t, dir, "client")

	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		code, _, errOut := runCmd(ctx, "serve", "--listen", addr, "--admin-listen", "off", "--log-level", "warn",
			"--tls-cert", srvCert, "--tls-key", srvKey, "--tls-ca", caFile, "--tls-client-auth", "require")
		if code != 0 {
			t.Log(errOut)
		}
		done <- code
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cliLeaf.Cert}})
	if err := nodetest.WaitServingWith(wctx, addr, grpc.WithTransportCredentials(creds)); err != nil {
		t.Fatal(err)
	}

	tlsArgs := []string{"--addr", addr, "--tls-ca", caFile, "--tls-cert", cliCert, "--tls-key", cliKey}
	if code, out, errOut := runCmd(context.Background(), append([]string{"check"}, append(tlsArgs, "+8613800000000")...)...); code != 0 || !strings.Contains(out, "ADMITTED") {
		t.Fatalf("check over TLS: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(context.Background(), append([]string{"status"}, tlsArgs...)...); code != 0 || !strings.Contains(out, "ring epoch") {
		t.Fatalf("status over TLS: exit %d\n%s%s", code, out, errOut)
	}
	for name, args := range map[string][]string{
		"plaintext":      {"--addr", addr},
		"no client cert": {"--addr", addr, "--tls-ca", caFile},
		"system roots":   {"--addr", addr, "--tls"},
		"wrong name":     append(append([]string{}, tlsArgs...), "--tls-server-name", "other.example"),
	} {
		if code, out, _ := runCmd(context.Background(), append([]string{"check", "--timeout", "1s", "--fail", "closed", "--json"}, append(args, "+8613800000001")...)...); code == 0 && !strings.Contains(out, `"degraded":true`) {
			t.Errorf("check, %s: exit %d, decided by a node:\n%s", name, code, out)
		}
	}
}

// TestSecurityFlagErrors: a bad TLS or gossip keys flag stops the command
// before it serves or dials, naming the flag and the file.
func TestSecurityFlagErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testcert.NewCA(t, "ca")
	cert, key := ca.Issue(t, "n").Write(t, dir, "n")
	_, otherKey := ca.Issue(t, "m").Write(t, dir, "m")
	missing := filepath.Join(dir, "missing.pem")
	keysFile := filepath.Join(dir, "gossip.keys")
	testcert.WriteFile(t, keysFile, []byte(base64.StdEncoding.EncodeToString(make([]byte, 32))+"\nshort\n"))
	listen := []string{"--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{append([]string{"serve", "--tls-cert", missing, "--tls-key", key}, listen...), 1, "--tls-cert " + missing},
		{append([]string{"serve", "--tls-cert", cert, "--tls-key", missing}, listen...), 1, "--tls-key " + missing},
		{append([]string{"serve", "--tls-cert", cert, "--tls-key", otherKey}, listen...), 1, "--tls-cert " + cert},
		{append([]string{"serve", "--tls-cert", cert, "--tls-key", key, "--tls-ca", missing, "--join", "127.0.0.1:1"}, listen...), 1, "--tls-ca " + missing},
		{append([]string{"serve", "--tls-key", key}, listen...), 2, "need --tls-cert"},
		{append([]string{"serve", "--tls-cert", cert, "--tls-key", key, "--join", "127.0.0.1:1"}, listen...), 2, "--tls-ca is required"},
		{append([]string{"serve", "--tls-cert", cert, "--tls-key", key, "--tls-client-auth", "maybe"}, listen...), 2, `--tls-client-auth "maybe"`},
		{append([]string{"serve", "--gossip-keys", keysFile}, listen...), 2, "--gossip-keys needs --gossip or --join"},
		{append([]string{"serve", "--gossip-keys", keysFile, "--gossip", "127.0.0.1:0"}, listen...), 1, "--gossip-keys " + keysFile + ": gossip: keys line 2"},
		{append([]string{"serve", "--cluster-keys", keysFile, "--gossip", "127.0.0.1:0"}, listen...), 1, "--cluster-keys " + keysFile + ": gossip: keys line 2"},
		{append([]string{"serve", "--cluster-keys", keysFile, "--gossip-keys", missing, "--gossip", "127.0.0.1:0"}, listen...), 2, "give one"},
		// A cluster member that would take Peer calls from anyone.
		{append([]string{"serve", "--gossip", "127.0.0.1:0"}, listen...), 2, "a cluster member needs peer authentication: cluster keys (--cluster-keys FILE"},
		{append([]string{"serve", "--join", "127.0.0.1:1", "--admin-token-file", missing}, listen...), 1, "--admin-token-file " + missing},
		{append([]string{"serve", "--admin-token-file", keysFile}, listen...), 1, "line 2: a token of 5 bytes; use at least 16"},
		{[]string{"override", "list", "--token-file", missing}, 2, "--token-file " + missing},
		{[]string{"check", "--tls-ca", missing, "r"}, 1, "--tls-ca " + missing},
		{[]string{"status", "--tls-cert", cert}, 2, "give both or neither"},
	} {
		code, _, errOut := runCmd(context.Background(), tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, %s; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestWatchGossipKeys: a keys file written anew is applied to the keyring
// (rotation without a restart); one that does not parse changes nothing.
func TestWatchGossipKeys(t *testing.T) {
	b64 := func(b byte) string {
		return base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(rune('a'+b)), 32)))
	}
	path := filepath.Join(t.TempDir(), "gossip.keys")
	testcert.WriteFile(t, path, []byte(b64(1)+"\n"))
	keys, err := gossipKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := gossip.NewKeyring(keys)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var logs syncBuffer
	wg.Go(func() { watchGossipKeys(ctx, path, kr, 5*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil))) })
	defer wg.Wait()
	defer cancel()
	waitKeys := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got []string
			for _, k := range kr.Keys() {
				got = append(got, base64.StdEncoding.EncodeToString(k))
			}
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("keys %v, want %v", got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	testcert.WriteFile(t, path, []byte(b64(2)+"\n"+b64(1)+"\n"))
	waitKeys(b64(2), b64(1))
	testcert.WriteFile(t, path, []byte("not a key\n"))
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "gossip keys not changed"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a bad keys file was not reported: %s", logs.String())
		}
	}
	waitKeys(b64(2), b64(1))
	if !strings.Contains(logs.String(), path) {
		t.Fatalf("the report does not name the file: %s", logs.String())
	}
	testcert.WriteFile(t, path, []byte(b64(2)+"\n"))
	waitKeys(b64(2))
}

// syncBuffer collects log lines; it is safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// writeClusterKeys writes a cluster keys file of one random key and returns
// its path.
func writeClusterKeys(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32)
	rand.Read(key)
	path := filepath.Join(t.TempDir(), "cluster.keys")
	testcert.WriteFile(t, path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"))
	return path
}

// writeTokenFile writes an admin token file of one random token and
// returns its path.
func writeTokenFile(t *testing.T) string {
	t.Helper()
	tok := make([]byte, 24)
	rand.Read(tok)
	path := filepath.Join(t.TempDir(), "admin.token")
	testcert.WriteFile(t, path, []byte("# the operators' token\n"+base64.StdEncoding.EncodeToString(tok)+"\n"))
	return path
}
