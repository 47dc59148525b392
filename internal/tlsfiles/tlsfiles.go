// Package tlsfiles reads a TLS certificate, its key and a CA bundle from PEM
// files and serves them through *tls.Config values that pick up new files
// without a restart: every handshake checks, at most once per
// CheckInterval, whether a file's modification time or size changed, and
// if so reads the files again. A new set that does not load (a half-written
// file, a key that does not match) is logged and the previous one is kept
// until the files change again.
//
// cmd/freqring uses it; package node only sees the *tls.Config values.
package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// Files names the PEM files of one side of a connection.
type Files struct {
	Cert string // certificate chain, leaf first; "" means none (a client without a certificate)
	Key  string // private key of Cert; set exactly when Cert is
	CA   string // CA bundle that verifies the other side; "" means the system roots (client) or none (server)
}

// Options tune a Reloader. A zero field takes the default named in its
// comment.
type Options struct {
	CheckInterval time.Duration    // least time between checks of the files; 0 means 1s
	Now           func() time.Time // the clock of those checks; nil means time.Now
	Logger        *slog.Logger     // reloads at Info, failed reloads at Error; nil means discard
}

// FileError is a file that could not be read or parsed.
type FileError struct {
	Which string // "cert", "key" or "ca": the field of Files
	Path  string
	Err   error
}

func (e *FileError) Error() string {
	return fmt.Sprintf("tlsfiles: %s file %s: %v", e.Which, e.Path, e.Err)
}
func (e *FileError) Unwrap() error { return e.Err }

// Reloader holds the current certificate and CA pool read from Files. It is
// safe for concurrent use.
type Reloader struct {
	files Files
	opt   Options
	log   *slog.Logger

	mu      sync.Mutex // guards checked, stamps, cert and pool
	checked time.Time  // last check of the files
	stamps  [3]stamp   // cert, key, ca as last read (or last tried)
	cert    *tls.Certificate
	pool    *x509.CertPool

	reloads, failures atomic.Int64
}

// stamp is what tells that a file changed.
type stamp struct {
	mod  time.Time
	size int64
}

// New reads the files once; any error names the file (a *FileError).
func New(f Files, o Options) (*Reloader, error) {
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("tlsfiles: cert %q and key %q: give both or neither", f.Cert, f.Key)
	}
	if o.CheckInterval == 0 {
		o.CheckInterval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{files: f, opt: o, log: o.Logger}
	stamps := r.stat()
	cert, pool, err := r.load()
	if err != nil {
		return nil, err
	}
	r.stamps, r.cert, r.pool, r.checked = stamps, cert, pool, o.Now()
	return r, nil
}

// Files returns the files r reads.
func (r *Reloader) Files() Files { return r.files }

// Reloads returns how many times new files were loaded, and how many times
// changed files failed to load.
func (r *Reloader) Reloads() (ok, failed int64) { return r.reloads.Load(), r.failures.Load() }

// stat returns the stamps of the files (zero for a missing or unnamed one).
func (r *Reloader) stat() [3]stamp {
	var s [3]stamp
	for i, p := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			s[i] = stamp{fi.ModTime(), fi.Size()}
		}
	}
	return s
}

// load reads every file.
func (r *Reloader) load() (*tls.Certificate, *x509.CertPool, error) {
	var cert *tls.Certificate
	if r.files.Cert != "" {
		certPEM, err := os.ReadFile(r.files.Cert)
		if err != nil {
			return nil, nil, &FileError{"cert", r.files.Cert, err}
		}
		keyPEM, err := os.ReadFile(r.files.Key)
		if err != nil {
			return nil, nil, &FileError{"key", r.files.Key, err}
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, &FileError{"cert", r.files.Cert, fmt.Errorf("with key file %s: %w", r.files.Key, err)}
		}
		cert = &c
	}
	var pool *x509.CertPool
	if r.files.CA != "" {
		b, err := os.ReadFile(r.files.CA)
		if err != nil {
			return nil, nil, &FileError{"ca", r.files.CA, err}
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, nil, &FileError{"ca", r.files.CA, errors.New("no PEM certificate in it")}
		}
	}
	return cert, pool, nil
}

// Current returns the certificate (nil without Files.Cert) and CA pool (nil
// without Files.CA) in force, first reading the files again if a check is
// due and they changed.
func (r *Reloader) Current() (*tls.Certificate, *x509.CertPool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opt.Now()
	if now.Sub(r.checked) < r.opt.CheckInterval {
		return r.cert, r.pool
	}
	r.checked = now
	stamps := r.stat()
	if stamps == r.stamps {
		return r.cert, r.pool
	}
	r.stamps = stamps // a bad set is tried again only once a file changes again
	cert, pool, err := r.load()
	if err != nil {
		r.failures.Add(1)
		r.log.Error("tls: new files did not load; keeping the previous ones", "err", err)
		return r.cert, r.pool
	}
	r.cert, r.pool = cert, pool
	r.reloads.Add(1)
	r.log.Info("tls: reloaded", "cert", r.files.Cert, "ca", r.files.CA)
	return r.cert, r.pool
}

// ServerConfig returns the configuration of a TLS listener: Files.Cert is
// its certificate, and Files.CA verifies client certificates as auth asks.
// Every handshake takes the files in force (GetConfigForClient). It fails
// without Files.Cert, or when auth verifies client certificates and there
// is no Files.CA.
func (r *Reloader) ServerConfig(auth tls.ClientAuthType) (*tls.Config, error) {
	if r.files.Cert == "" {
		return nil, errors.New("tlsfiles: a server needs a cert and key file")
	}
	if auth >= tls.VerifyClientCertIfGiven && r.files.CA == "" {
		return nil, fmt.Errorf("tlsfiles: client auth %v needs a CA file", auth)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: auth}
	c := base.Clone()
	c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool := r.Current()
		cc := base.Clone()
		cc.Certificates = []tls.Certificate{*cert}
		cc.ClientCAs = pool
		return cc, nil
	}
	return c, nil
}

// ClientCredentials returns gRPC transport credentials for a TLS client:
// Files.CA (or the system roots without it) verifies the server, whose
// certificate must carry serverName ("" means the host dialled), and
// Files.Cert, if any, is the client certificate. Each handshake takes the
// files in force: a tls.Config cannot change its RootCAs once made, so the
// credentials make one per connection.
func (r *Reloader) ClientCredentials(serverName string) credentials.TransportCredentials {
	return &clientCreds{r: r, serverName: serverName}
}

// ClientConfig returns the TLS configuration of one client handshake with
// the files in force (see ClientCredentials).
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	cert, pool := r.Current()
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: pool}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

type clientCreds struct {
	r          *Reloader
	serverName string
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.serverName != "" {
		authority = c.serverName // grpc's TLS credentials verify the authority's host
	}
	return credentials.NewTLS(c.r.ClientConfig(c.serverName)).ClientHandshake(ctx, authority, conn)
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsfiles: client credentials cannot serve")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.NewTLS(&tls.Config{ServerName: c.serverName}).Info()
}

func (c *clientCreds) Clone() credentials.TransportCredentials { cc := *c; return &cc }

// OverrideServerName sets the name the server's certificate must carry.
//
// Deprecated: as in package credentials; set it in ClientCredentials.
func (c *clientCreds) OverrideServerName(name string) error { c.serverName = name; return nil }
