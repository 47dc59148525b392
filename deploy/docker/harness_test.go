// Package docker_test runs freqring as a cluster of containers of the
// deploy/Dockerfile image, on a private Docker network, and puts it through
// the ring changes a Kubernetes StatefulSet goes through: a node killed and
// started again from its volume, a node cut off the network and connected
// again, a rolling restart, a node added and removed again (scaled down: a
// graceful stop, after which it stays stopped). For each step it measures
// how long the survivors take to agree on the expected ring, and what a load
// driven from the host saw meanwhile (decisions/s, call and item errors).
//
// It proves the cluster exact through all of it, now that history moves
// with ownership (node/partition.go) and every admitted send is on its
// partition's backup before the reply (node/replica.go):
//
//   - over-admitted nothing: every admitted send of the run is audited with
//     bench.Audit after each step, and a step fails the run when its
//     over-admissions exceed its bound, which is 0 for every step, the
//     network partition included (one shorter than the node's
//     ForgetDeadAfter, 1 minute by default, over-admits nothing either);
//   - forgot nothing: after the last step the load stops and every recipient
//     it used is peeked through the cluster; the node's count for the
//     longest recipient rule must hold every send the load saw admitted
//     (see exact_test.go). Counting more than that is allowed: a send
//     recorded by a call whose reply was lost.
//
// The nodes share cluster keys, as deploy/k8s's do, and right after they
// start, a client without them calls every Peer and Admin call that would
// close partitions, forge sends or lift limits, on every node: each must be
// refused (outsiderRefused).
//
// It also fails when the harness or the cluster breaks: a node that never
// converges, a call that hangs past its deadline, a container that stops by
// itself or exits non-zero on a graceful stop. The step table is printed
// before any of these exactness failures is reported.
//
// It needs a Docker daemon and no registry (the image is FROM scratch). It
// skips when `docker version` fails, when FREQRING_DOCKER_TESTS=0 or under
// -short, and then prints "deploy/docker: Docker harness skipped: <reason>",
// also without -v. It takes about a minute on a 2-core machine, the build
// included:
//
//	go test -run . -v -count=1 ./deploy/docker/ -timeout 15m
//
// FREQRING_DOCKER_REPORT=path writes the step table and the forgotten-send
// audit as JSON.
package docker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/bench"
	"github.com/freqring/freqring/rules"
	"github.com/freqring/freqring/window"
)

const (
	initialNodes   = 3
	loadWorkers    = 4
	freezeFor      = 10 * time.Second // how long the pause step freezes a node
	loadSeed       = 7
	settle         = 2 * time.Second  // load kept on the converged ring before a step ends
	convergeWithin = 60 * time.Second // bound of one step's convergence
	// A node cut off the network is merged back by its rejoin loop
	// (--rejoin-interval, 30 s by default), so reconnecting may take that long.
	reconnectWithin = 90 * time.Second
	runBudget       = 8 * time.Minute // the whole run, cleanup excluded
)

// row is the measurement of one step.
type row struct {
	Step         string         `json:"step"`
	Members      int            `json:"members"`    // nodes in the expected ring
	ConvergeS    float64        `json:"converge_s"` // from the action to every survivor reporting the expected ring
	StepS        float64        `json:"step_s"`     // from the action to the end of the settle period
	Decisions    int64          `json:"decisions"`  // items decided (admitted or denied) during the step
	DecisionsPS  float64        `json:"decisions_per_s"`
	Calls        int64          `json:"calls"`
	CallErrors   int64          `json:"call_errors"`             // Check calls that failed whole
	ItemErrors   int64          `json:"item_errors"`             // items answered with an error
	Admitted     int64          `json:"admitted"`                // admitted sends during the step
	OverAdmit    int            `json:"over_admissions"`         // bench.Audit violations of sends admitted during the step
	Bound        int            `json:"bound"`                   // over-admissions the step may cause; more fails the run
	AdmittedRun  int64          `json:"admitted_run"`            // admitted sends of the run so far
	OverAdmitRun int            `json:"over_admissions_run"`     // bench.Audit violations over the run so far
	OverSendsRun int            `json:"over_admitted_sends_run"` // distinct sends among them
	ByRuleRun    map[string]int `json:"over_admissions_by_rule_run,omitempty"`
	Note         string         `json:"note,omitempty"`
	Errors       []string       `json:"errors,omitempty"` // the most frequent error kinds of the step
}

// harness is one run: its Docker objects, its nodes, its load.
type harness struct {
	t       *testing.T
	ctx     context.Context
	e       *env
	nodes   map[string]*container // by node name
	conns   map[string]*grpc.ClientConn
	running map[string]bool // containers that must be running
	paused  map[string]bool // running containers paused on purpose (docker pause)
	load    *load
	rules   map[string][]window.Rule
	rows    []row
	exact   *exactness // the forgotten-send audit after the last step
}

func TestCluster(t *testing.T) {
	switch {
	case os.Getenv("FREQRING_DOCKER_TESTS") == "0":
		loudSkip(t, "FREQRING_DOCKER_TESTS=0")
	case testing.Short():
		loudSkip(t, "-short")
	}
	if why := dockerAnswers(); why != "" {
		loudSkip(t, why)
	}

	deadline := time.Now().Add(runBudget)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
		deadline = d.Add(-time.Minute) // leave the cleanup time to run
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()

	e := newEnv(t)
	e.buildImage(ctx)
	e.createNetwork(ctx)
	h := &harness{t: t, ctx: ctx, e: e, nodes: map[string]*container{}, conns: map[string]*grpc.ClientConn{},
		running: map[string]bool{}, paused: map[string]bool{}, load: newLoad(loadSeed),
		rules: map[string][]window.Rule{"default": rules.Default().Domain("default").Rules()}}
	t.Cleanup(func() {
		for _, c := range h.conns {
			c.Close()
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range keys(h.nodes) {
				t.Logf("last lines of %s:\n%s", name, h.e.logs(h.nodes[name], 40))
			}
		}
	})

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer func() { stopLoad(); h.load.wait() }()
	h.load.start(loadCtx, loadWorkers, loadSeed)

	all := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("freqring-%d", i))
		}
		return out
	}
	three := all(initialNodes)

	h.step(fmt.Sprintf("start %d nodes", initialNodes), three, convergeWithin, func() string {
		for i := range initialNodes {
			h.add(i)
		}
		return ""
	}, "")

	h.outsiderRefused(three)

	h.step("kill -9 freqring-1", []string{"freqring-0", "freqring-2"}, convergeWithin, func() string {
		h.docker("kill", "--signal", "KILL", h.nodes["freqring-1"].cname)
		h.running["freqring-1"] = false
		return ""
	}, "")
	h.step("start freqring-1 again (same IP and volume)", three, convergeWithin, func() string {
		h.docker("start", h.nodes["freqring-1"].cname)
		h.running["freqring-1"] = true
		return ""
	}, "freqring-1")

	// A partition shorter than the nodes' ForgetDeadAfter (1 minute by
	// default): freqring-2, alone, stops deciding, so the bound of both
	// steps is 0 like every other's.
	c2 := h.nodes["freqring-2"]
	var cut time.Time
	h.step("disconnect freqring-2", []string{"freqring-0", "freqring-1"}, convergeWithin, func() string {
		h.docker("network", "disconnect", h.e.network, c2.cname)
		cut = time.Now()
		return ""
	}, "")
	h.step("reconnect freqring-2", three, reconnectWithin, func() string {
		h.docker("network", "connect", "--ip", c2.ip, "--alias", "freqring-peers", h.e.network, c2.cname)
		lasted := time.Since(cut)
		if lasted >= forgetDeadAfter {
			t.Errorf("harness: the partition of freqring-2 lasted %v, not shorter than the nodes' ForgetDeadAfter (%v): its bound of 0 does not apply", lasted.Round(100*time.Millisecond), forgetDeadAfter)
		}
		return fmt.Sprintf("partition lasted %.1fs", lasted.Seconds())
	}, "")

	// A freeze (docker pause: the cgroup freezer, as SIGSTOP) of 10 s, far
	// past failure detection, while the load goes on sending to the frozen
	// node too: its queued calls are read when it thaws.
	c0 := h.nodes["freqring-0"]
	var paused time.Time
	h.step("pause freqring-0", []string{"freqring-1", "freqring-2"}, convergeWithin, func() string {
		h.docker("pause", c0.cname)
		h.paused["freqring-0"] = true
		paused = time.Now()
		return ""
	}, "")
	h.load.setTargets(append(*h.load.targets.Load(), target{name: "freqring-0", cli: pb.NewLimiterClient(h.conns["freqring-0"])}))
	h.step("unpause freqring-0", three, reconnectWithin, func() string {
		time.Sleep(time.Until(paused.Add(freezeFor)))
		h.docker("unpause", c0.cname)
		h.paused["freqring-0"] = false
		return fmt.Sprintf("paused %.1fs", time.Since(paused).Seconds())
	}, "")

	// A rolling restart as the StatefulSet controller does it: highest
	// ordinal first, each pod back and converged before the next.
	for _, name := range slices.Backward(three) {
		h.step("rolling restart "+name, three, convergeWithin, func() string {
			return h.restart(name)
		}, name)
	}

	h.step("add freqring-3", all(4), convergeWithin, func() string {
		h.add(3)
		return ""
	}, "")
	// Scaled down again: SIGTERM, the node hands its partitions over, leaves
	// and exits 0; it stays stopped.
	h.step("remove freqring-3", three, convergeWithin, func() string {
		took := h.stopGracefully("freqring-3")
		return fmt.Sprintf("graceful stop %.1fs, exit 0, stays stopped", took.Seconds())
	}, "")

	stopLoad()
	h.load.wait()
	h.exact = h.auditForgotten()
	h.summary()
	if n := h.load.ctr.hung.Load(); n > 0 {
		t.Errorf("%d load calls returned more than %v after their %v deadline", n, hangSlack, callTimeout)
	}
	h.judge()
}

// outsiderRefused calls, as a client that reaches the gRPC port of each of
// names but holds no cluster key or admin token, every Peer and Admin call
// that would let it close partitions, forge sends or lift limits: every one
// must be refused with UNAUTHENTICATED. The load goes on meanwhile; its
// audit at the end shows the cluster kept deciding exactly.
func (h *harness) outsiderRefused(names []string) {
	t := h.t
	for _, name := range names {
		conn := h.conns[name]
		ctx, cancel := context.WithTimeout(h.ctx, callTimeout)
		ring, err := pb.NewLimiterClient(conn).Ring(ctx, &pb.RingRequest{})
		cancel()
		if err != nil {
			t.Fatalf("%s: Ring: %v", name, err)
		}
		peer, admin := pb.NewPeerClient(conn), pb.NewAdminClient(conn)
		parts := []uint32{0, 1, 2, 3}
		calls := map[string]func(context.Context) error{
			"Acquire naming itself": func(ctx context.Context) error {
				_, err := peer.Acquire(ctx, &pb.AcquireRequest{Node: name, RingEpoch: ring.Epoch, Partitions: parts})
				return err
			},
			"Release": func(ctx context.Context) error {
				_, err := peer.Release(ctx, &pb.ReleaseRequest{Node: name, RingEpoch: ring.Epoch, Partitions: parts})
				return err
			},
			"Replicate": func(ctx context.Context) error {
				_, err := peer.Replicate(ctx, &pb.ReplicateRequest{Node: name, RingEpoch: ring.Epoch})
				return err
			},
			"Fill": func(ctx context.Context) error {
				_, err := peer.Fill(ctx, &pb.FillRequest{Node: name, RingEpoch: ring.Epoch})
				return err
			},
			"Handback": func(ctx context.Context) error {
				_, err := peer.Handback(ctx, &pb.HandbackRequest{Node: name, RingEpoch: ring.Epoch, Partitions: parts})
				return err
			},
			"SetOverride exempting everyone": func(ctx context.Context) error {
				_, err := admin.SetOverride(ctx, &pb.OverrideSetRequest{Override: &pb.Override{Name: "all", Domain: "default", Prefixes: []string{"+"}, Exempt: true}})
				return err
			},
			"DeleteOverride": func(ctx context.Context) error {
				_, err := admin.DeleteOverride(ctx, &pb.OverrideDeleteRequest{Name: "vip"})
				return err
			},
		}
		for what, call := range calls {
			ctx, cancel := context.WithTimeout(h.ctx, callTimeout)
			err := call(ctx)
			cancel()
			if status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s: an outsider's %s: %v, want UNAUTHENTICATED", name, what, err)
			}
		}
	}
	t.Logf("outsider: every Peer and Admin call refused (UNAUTHENTICATED) on %v", names)
}

// forgetDeadAfter is the nodes' ForgetDeadAfter: serve has no flag for it,
// so it is node.Config's default.
const forgetDeadAfter = time.Minute

// loudSkip skips with the reason in the test log, and keeps it for TestMain,
// which prints it in one line that a plain `go test ./...` shows too.
func loudSkip(t *testing.T, why string) {
	t.Helper()
	msg := "SKIPPING the multi-container tests of deploy/docker (" + why + ")"
	if !strings.Contains(why, "FREQRING_DOCKER_TESTS") && why != "-short" {
		msg += ": they need a Docker daemon answering `docker version`; FREQRING_DOCKER_TESTS=0 skips them on purpose"
		why += "; FREQRING_DOCKER_TESTS=0 skips on purpose"
	}
	skipReason = why
	t.Skip(msg)
}

// docker runs a docker command of a step; a failure ends the test.
func (h *harness) docker(args ...string) string {
	h.t.Helper()
	out, err := docker(h.ctx, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// add starts node i and dials it.
func (h *harness) add(i int) {
	c := h.e.runNode(h.ctx, i)
	conn, err := dial(c.grpcAddr())
	if err != nil {
		h.t.Fatal(err)
	}
	h.nodes[c.name], h.conns[c.name], h.running[c.name] = c, conn, true
}

// restart stops a node gracefully and starts it again. It is `docker
// restart` with the exit code checked in between.
func (h *harness) restart(name string) string {
	stopped := h.stopGracefully(name)
	h.docker("start", h.nodes[name].cname)
	h.running[name] = true
	return fmt.Sprintf("graceful stop %.1fs, exit 0", stopped.Seconds())
}

// stopGracefully stops a node with SIGTERM (it hands its partitions over,
// leaves the ring, drains and writes a snapshot), checks that it exited 0,
// and returns how long the stop took. The node is then intentionally
// stopped: checkContainers no longer expects it to run.
func (h *harness) stopGracefully(name string) time.Duration {
	c := h.nodes[name]
	h.untarget(name) // as a client following the ring would, once the node leaves it
	start := time.Now()
	h.running[name] = false
	h.docker("stop", "--time", fmt.Sprint(stopGrace), c.cname)
	stopped := time.Since(start)
	status, code, err := h.e.state(h.ctx, c)
	if err != nil {
		h.t.Fatal(err)
	}
	if status != "exited" || code != 0 {
		h.t.Fatalf("%s is %s with exit code %d after SIGTERM, want exited 0:\n%s", name, status, code, h.e.logs(c, 40))
	}
	return stopped
}

// untarget stops the load sending to a node.
func (h *harness) untarget(name string) {
	ts := slices.DeleteFunc(slices.Clone(*h.load.targets.Load()), func(tg target) bool { return tg.name == name })
	h.load.setTargets(ts)
}

// recovery returns what the node logged of its last recovery: WAL sends
// replayed, snapshot records loaded, time taken.
func (h *harness) recovery(name string) string {
	lines := strings.Split(h.e.logs(h.nodes[name], 200), "\n")
	for _, l := range slices.Backward(lines) {
		if !strings.Contains(l, "msg=recovered") {
			continue
		}
		var out []string
		for _, f := range strings.Fields(l) {
			for _, k := range []string{"snapshot_records=", "wal_sends=", "took="} {
				if strings.HasPrefix(f, k) {
					out = append(out, f)
				}
			}
		}
		return "recovered " + strings.Join(out, " ")
	}
	return "no recovery logged"
}

// step runs action, waits until the nodes in want report a ring of exactly
// them, keeps the load on them for the settle period, and records a row.
// The load stops sending to nodes outside want before the action and sends
// to all of want once they have converged.
//
// If recovers names a node, the row's note tells what it recovered from its
// volume when it started.
func (h *harness) step(name string, want []string, within time.Duration, action func() string, recovers string) {
	t := h.t
	t.Helper()
	var keep []target
	for _, tg := range *h.load.targets.Load() {
		if slices.Contains(want, tg.name) {
			keep = append(keep, tg)
		}
	}
	h.load.setTargets(keep)
	h.load.takeErrors()

	before := h.load.ctr.snapshot()
	start := time.Now()
	note := action()
	var wantRing []string
	conns := map[string]*grpc.ClientConn{}
	for _, n := range want {
		wantRing = append(wantRing, n+"@"+h.nodes[n].grpcAddr())
		conns[n] = h.conns[n]
	}
	slices.Sort(wantRing)
	conv, err := waitRing(h.ctx, start, conns, wantRing, within)
	if err != nil {
		t.Fatalf("step %q: %v", name, err)
	}
	if recovers != "" {
		if note != "" {
			note += "; "
		}
		note += recovers + " " + h.recovery(recovers)
	}
	var ts []target
	for _, n := range want {
		ts = append(ts, target{name: n, cli: pb.NewLimiterClient(h.conns[n])})
	}
	h.load.setTargets(ts)
	select {
	case <-time.After(settle):
	case <-h.ctx.Done():
		t.Fatalf("step %q: run budget exhausted", name)
	}
	d := h.load.ctr.snapshot().sub(before)
	took := time.Since(start)
	h.checkContainers(name)

	sends := h.load.admittedSends()
	v, err := bench.Audit(h.rules, sends)
	if err != nil {
		t.Fatal(err)
	}
	overBefore := 0
	if len(h.rows) > 0 {
		overBefore = h.rows[len(h.rows)-1].OverAdmitRun
	}
	byRule := map[string]int{}
	over := map[int64]map[string]bool{} // distinct sends by time and recipient
	distinct := 0
	for _, x := range v {
		byRule[x.Rule]++
		if over[x.Send.At] == nil {
			over[x.Send.At] = map[string]bool{}
		}
		k := fmt.Sprintf("%s/%d", x.Send.Recipient, x.Send.Content)
		if !over[x.Send.At][k] {
			over[x.Send.At][k] = true
			distinct++
		}
	}
	errs := h.load.takeErrors()
	if len(errs) > 4 {
		errs = errs[:4]
	}
	r := row{
		Step: name, Members: len(want), ConvergeS: round(conv.Seconds()), StepS: round(took.Seconds()),
		Decisions: d.decisions, DecisionsPS: float64(int64(float64(d.decisions) / took.Seconds())),
		Calls: d.calls, CallErrors: d.callErrs, ItemErrors: d.itemErrs,
		Admitted: d.admitted, OverAdmit: len(v) - overBefore, Bound: 0,
		AdmittedRun: int64(len(sends)), OverAdmitRun: len(v), OverSendsRun: distinct, ByRuleRun: byRule, Note: note, Errors: errs,
	}
	h.rows = append(h.rows, r)
	t.Logf("step %q: converged in %.2fs; %.0f decisions/s, %d calls (%d failed), %d item errors; admitted %d (run %d), over-admissions %d, bound %d (run %d %v)%s",
		name, r.ConvergeS, r.DecisionsPS, r.Calls, r.CallErrors, r.ItemErrors, r.Admitted, r.AdmittedRun, r.OverAdmit, r.Bound, r.OverAdmitRun, byRule, noteSuffix(note))
	for _, e := range errs {
		t.Logf("    %s", e)
	}
}

func noteSuffix(n string) string {
	if n == "" {
		return ""
	}
	return "; " + n
}

func round(s float64) float64 { return float64(int64(s*100+0.5)) / 100 }

// checkContainers fails the test if a container that should run does not.
func (h *harness) checkContainers(step string) {
	for _, name := range keys(h.running) {
		if !h.running[name] {
			continue
		}
		status, code, err := h.e.state(h.ctx, h.nodes[name])
		if err != nil {
			h.t.Fatal(err)
		}
		if status != "running" && !(status == "paused" && h.paused[name]) {
			h.t.Fatalf("after step %q: %s is %s (exit code %d):\n%s", step, name, status, code, h.e.logs(h.nodes[name], 40))
		}
	}
}

// summary logs the step table and writes it as JSON to
// $FREQRING_DOCKER_REPORT if set.
func (h *harness) summary() {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\tring\tconverge s\tstep s\tdecisions/s\tcalls\tcall errors\titem errors\tadmitted\tover-admitted\tbound\tadmitted (run)\tover-admitted (run)\t")
	for _, r := range h.rows {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", r.Step, r.Members, r.ConvergeS, r.StepS, r.DecisionsPS,
			r.Calls, r.CallErrors, r.ItemErrors, r.Admitted, r.OverAdmit, r.Bound, r.AdmittedRun, r.OverAdmitRun)
	}
	tw.Flush()
	if x := h.exact; x != nil {
		fmt.Fprintf(&b, "\nafter the last step, %d recipients peeked (%d not), rule %s (limit %d, window %v): admitted %d, counted %d; forgotten %d (%d recipients), counted beyond the admitted %d (%d recipients, %.3f%%); most admitted to one recipient %d; items given up unanswered after %v of retries %d\n",
			x.Peeked, x.Unpeeked, x.Rule, x.Limit, x.Window, x.Admitted, x.Counted, x.Forgotten, x.ForgottenRecipients, x.Beyond, x.BeyondRecipients,
			100*float64(x.Beyond)/float64(max(x.Admitted, 1)), x.MostAdmitted, giveUp, h.load.ctr.unknown.Load())
	}
	h.t.Logf("summary (a step over-admitting beyond its bound, or a forgotten send, fails the run):\n%s", b.String())

	path := os.Getenv("FREQRING_DOCKER_REPORT")
	if path == "" {
		return
	}
	ver, _ := docker(h.ctx, "version", "--format", "{{.Server.Version}}")
	rep := struct {
		When          time.Time  `json:"when"`
		DockerVersion string     `json:"docker_server_version"`
		BatchSize     int        `json:"batch_size"`
		Recipients    int        `json:"recipients"`
		Drift         int        `json:"recipient_drift_per_s"`
		Workers       int        `json:"load_workers"`
		CallTimeoutS  float64    `json:"call_timeout_s"`
		SettleS       float64    `json:"settle_s"`
		HungCalls     int64      `json:"hung_calls"`
		Steps         []row      `json:"steps"`
		Exactness     *exactness `json:"forgotten_audit,omitempty"`
	}{time.Now().UTC(), ver, batchSize, recipients, recipientDrift, loadWorkers, callTimeout.Seconds(), settle.Seconds(), h.load.ctr.hung.Load(), h.rows, h.exact}
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		h.t.Errorf("FREQRING_DOCKER_REPORT: %v", err)
	}
}
