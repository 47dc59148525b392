package docker_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Bounds of single docker commands.
const (
	dockerTimeout = 60 * time.Second // any command but build and stop
	buildTimeout  = 10 * time.Minute // go build (a cold cache, on 2 busy cores: 5 min was not enough) and docker build
	stopGrace     = 30               // seconds docker stop waits before SIGKILL
)

// docker runs the docker CLI and returns its trimmed stdout. The error
// carries the command line and stderr.
func docker(ctx context.Context, args ...string) (string, error) {
	return dockerTimed(ctx, dockerTimeout, args...)
}

func dockerTimed(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0") // no buildx here; see deploy/build-image.sh
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), timeout)
		}
		return stdout.String(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// dockerAnswers reports why no Docker daemon can be used, or "".
func dockerAnswers() string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "no docker command on PATH"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return fmt.Sprintf("the Docker daemon does not answer: %v", err)
	}
	return ""
}

// env names the Docker objects of one test run, all labelled with its id so
// that cleanup finds them even after a failure.
type env struct {
	t       *testing.T
	id      string // run id, in every object's name
	label   string // freqring-test=<id>
	image   string // freqring:test-<id>
	network string
	subnet  *net.IPNet
	// keys is a directory holding the cluster's keys file, keys, mounted
	// read-only into every container (as deploy/k8s mounts its Secret).
	keys string
}

func newEnv(t *testing.T) *env {
	id := fmt.Sprintf("%d-%04x", os.Getpid(), rand.Uint32()&0xffff)
	e := &env{t: t, id: id, label: "freqring-test=" + id, image: "freqring:test-" + id, network: "freqring-test-" + id}
	e.keys = t.TempDir()
	key := make([]byte, 32)
	crand.Read(key)
	if err := os.WriteFile(filepath.Join(e.keys, "keys"), []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.keys, 0o755); err != nil { // the containers' user reads it
		t.Fatal(err)
	}
	t.Logf("docker objects of this run carry label %s; if a run is killed before its cleanup, remove them with\n"+
		"  docker rm -f $(docker ps -aq --filter label=%s); docker network rm %s; docker volume rm $(docker volume ls -q --filter label=%s); docker rmi %s",
		e.label, e.label, e.network, e.label, e.image)
	t.Cleanup(e.cleanup)
	return e
}

// cleanup removes every container, the network, the volumes and the image
// of the run. It runs even when the test failed, with a fresh context.
func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if ids, err := docker(ctx, "ps", "-aq", "--filter", "label="+e.label); err == nil && ids != "" {
		if _, err := docker(ctx, append([]string{"rm", "-f", "-v"}, strings.Fields(ids)...)...); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	}
	if e.subnet != nil {
		if _, err := docker(ctx, "network", "rm", e.network); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	}
	if vols, err := docker(ctx, "volume", "ls", "-q", "--filter", "label="+e.label); err == nil && vols != "" {
		if _, err := docker(ctx, append([]string{"volume", "rm", "-f"}, strings.Fields(vols)...)...); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	}
	_, _ = docker(ctx, "rmi", e.image)
}

// buildImage compiles the static binary as deploy/build-image.sh does and
// builds deploy/Dockerfile around it, in a context directory of this run
// (so that runs do not share deploy/build).
func (e *env) buildImage(ctx context.Context) {
	t := e.t
	start := time.Now()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bctx := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bctx, "build", "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(gctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(bctx, "build", "freqring"), "./cmd/freqring")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/freqring: %v\n%s", err, out)
	}
	if _, err := dockerTimed(ctx, buildTimeout, "build", "-q", "-t", e.image, "--label", e.label, "-f", filepath.Join(root, "deploy", "Dockerfile"), bctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %v", e.image, time.Since(start).Round(100*time.Millisecond))
}

// createNetwork creates the run's bridge network on a random /24 of 10/8
// that neither a host interface nor another Docker network uses. It is
// internal: containers reach nothing but each other, and the host reaches
// them through the bridge.
func (e *env) createNetwork(ctx context.Context) {
	t := e.t
	used := usedNets(ctx, t)
	var lastErr error
	for range 8 {
		_, sn, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", rand.IntN(256), rand.IntN(256)))
		if overlaps(sn, used) {
			continue
		}
		gw := ip(sn, 1)
		_, err := docker(ctx, "network", "create", "--driver", "bridge", "--internal", "--label", e.label,
			"--subnet", sn.String(), "--gateway", gw.String(), e.network)
		if err == nil {
			e.subnet = sn
			t.Logf("network %s: %s (internal bridge)", e.network, sn)
			return
		}
		lastErr = err
	}
	t.Fatalf("no free subnet for the test network: %v", lastErr)
}

// usedNets lists the networks of the host's interfaces and of every Docker
// network.
func usedNets(ctx context.Context, t *testing.T) []*net.IPNet {
	var out []*net.IPNet
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n)
		}
	}
	ids, err := docker(ctx, "network", "ls", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if ids == "" {
		return out
	}
	subnets, err := docker(ctx, append([]string{"network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"}, strings.Fields(ids)...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range strings.Fields(subnets) {
		if _, n, err := net.ParseCIDR(s); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func overlaps(a *net.IPNet, used []*net.IPNet) bool {
	for _, b := range used {
		if a.Contains(b.IP) || b.Contains(a.IP) {
			return true
		}
	}
	return false
}

// ip returns host number h of the IPv4 network n.
func ip(n *net.IPNet, h byte) net.IP {
	out := slices.Clone(n.IP.To4())
	out[3] = h
	return out
}

// nodeIP returns the fixed address of node i: .10, .11, ...
func (e *env) nodeIP(i int) string { return ip(e.subnet, byte(10+i)).String() }

// container is one freqring node: a container, its fixed address and its
// named volume, so that it can be killed and started again as itself.
type container struct {
	name   string // the node name, like a StatefulSet pod: freqring-0
	cname  string // the container name, unique per run
	ip     string
	volume string
}

func (c *container) grpcAddr() string { return net.JoinHostPort(c.ip, "7070") }

// runNode starts node i: named freqring-i, at its fixed address, joining
// the alias freqring-peers that every node carries (as a headless Service's
// DNS name resolves to every pod), with its WAL on a named volume.
func (e *env) runNode(ctx context.Context, i int) *container {
	t := e.t
	c := &container{
		name:   fmt.Sprintf("freqring-%d", i),
		cname:  fmt.Sprintf("freqring-%d.%s", i, e.id),
		ip:     e.nodeIP(i),
		volume: fmt.Sprintf("freqring-data-%d.%s", i, e.id),
	}
	if _, err := docker(ctx, "volume", "create", "--label", e.label, c.volume); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "-d", "--name", c.cname, "--hostname", c.name, "--label", e.label,
		"--network", e.network, "--ip", c.ip, "--network-alias", "freqring-peers",
		"--volume", c.volume + ":/data", "--volume", e.keys + ":/etc/freqring/cluster:ro",
		// As the StatefulSet's securityContext: read-only root, no privileges.
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		e.image,
		"serve", "--listen", "0.0.0.0:7070", "--data-dir", "/data",
		"--name", c.name, "--advertise", c.grpcAddr(),
		"--gossip", "0.0.0.0:7946", "--gossip-advertise", net.JoinHostPort(c.ip, "7946"),
		"--join", "freqring-peers:7946", "--cluster-keys", "/etc/freqring/cluster/keys",
	}
	if _, err := docker(ctx, args...); err != nil {
		t.Fatal(err)
	}
	return c
}

// state returns the container's docker state: status ("running",
// "exited", ...) and exit code.
func (e *env) state(ctx context.Context, c *container) (status string, exitCode int, err error) {
	out, err := docker(ctx, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", c.cname)
	if err != nil {
		return "", 0, err
	}
	if _, err := fmt.Sscan(out, &status, &exitCode); err != nil {
		return "", 0, fmt.Errorf("docker inspect %s: %q: %v", c.cname, out, err)
	}
	return status, exitCode, nil
}

// logs returns the last lines of the container's output.
func (e *env) logs(c *container, lines int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "logs", "--tail", fmt.Sprint(lines), c.cname)
	out, err := cmd.CombinedOutput()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("%s\n(docker logs: %v)", out, err)
	}
	return string(out)
}
