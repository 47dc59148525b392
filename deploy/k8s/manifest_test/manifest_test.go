package manifest_test

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/freqring/freqring/node"
	"github.com/freqring/freqring/rules"
)

// TestSourcesDecodeStrictly decodes every resource file of the kustomization
// on its own, so that an unknown or misspelt field fails with its file name.
func TestSourcesDecodeStrictly(t *testing.T) {
	k := loadKustomization(t)
	for _, f := range k.Resources {
		t.Run(f, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(k8sDir, f))
			if err != nil {
				t.Fatal(err)
			}
			docs := splitYAMLDocs(b)
			if len(docs) == 0 {
				t.Fatalf("%s holds no object", f)
			}
			for i, d := range docs {
				if err := decodeStrict(&objects{}, fmt.Sprintf("%s document %d", f, i+1), d); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestKustomizationListsEveryFile: every YAML file of deploy/k8s is a
// resource or a generator input of the kustomization, and everything it
// lists exists; a file left out would silently not be applied.
func TestKustomizationListsEveryFile(t *testing.T) {
	k := loadKustomization(t)
	listed := map[string]string{} // file -> how it is listed
	for _, f := range k.Resources {
		listed[f] = "resource"
	}
	for _, g := range k.ConfigMapGenerator {
		for _, f := range generatorFiles(g) {
			listed[f] = "configMapGenerator " + g.Name
		}
	}
	for _, f := range yamlFiles(t) {
		if f == "kustomization.yaml" {
			continue
		}
		if listed[f] == "" {
			t.Errorf("deploy/k8s/%s is neither in resources nor in a configMapGenerator of kustomization.yaml", f)
		}
	}
	for f, how := range listed {
		if _, err := os.Stat(filepath.Join(k8sDir, f)); err != nil {
			t.Errorf("kustomization.yaml lists %s (%s): %v", f, how, err)
		}
	}
}

// deployment is the built kustomization, with the parts the checks share.
type deployment struct {
	objs      *objects
	sts       *appsv1.StatefulSet
	ctr       *corev1.Container // the freqring container
	podLabels labels.Set
	headless  *corev1.Service // the StatefulSet's serviceName
	client    []*corev1.Service
	flags     map[string]string // serve flags with $(VAR) expanded
	env       map[string]string // expansion values of the container's env
	grpcPort  int32             // containerPort named grpc
	gossip    int32             // containerPort named gossip-tcp
}

// Stand-in values of the downward API for expanding $(VAR) in args.
var downward = map[string]string{
	"metadata.name":      "freqring-7",
	"metadata.namespace": "test-ns",
	"status.podIP":       "10.1.2.3",
}

func load(t *testing.T) *deployment { return loadDir(t, k8sDir) }

// loadDir is load of the kustomization in dir.
func loadDir(t *testing.T, dir string) *deployment {
	t.Helper()
	d := &deployment{objs: buildDir(t, dir)}
	if n := len(d.objs.statefulSets); n != 1 {
		t.Fatalf("%d StatefulSets, want 1", n)
	}
	d.sts = d.objs.statefulSets[0]
	spec := &d.sts.Spec.Template.Spec
	if n := len(spec.Containers); n != 1 {
		t.Fatalf("StatefulSet %s: %d containers, want 1", d.sts.Name, n)
	}
	d.ctr = &spec.Containers[0]
	d.podLabels = labels.Set(d.sts.Spec.Template.Labels)
	for _, s := range d.objs.services {
		if s.Name == d.sts.Spec.ServiceName {
			d.headless = s
		} else {
			d.client = append(d.client, s)
		}
	}
	if d.headless == nil {
		t.Fatalf("StatefulSet serviceName %q names no Service of the kustomization", d.sts.Spec.ServiceName)
	}
	for _, p := range d.ctr.Ports {
		switch p.Name {
		case "grpc":
			d.grpcPort = p.ContainerPort
		case "gossip-tcp":
			d.gossip = p.ContainerPort
		}
	}
	if d.grpcPort == 0 || d.gossip == 0 {
		t.Fatalf("container %s: want ports named grpc and gossip-tcp, have %+v", d.ctr.Name, d.ctr.Ports)
	}

	d.env = map[string]string{}
	for _, e := range d.ctr.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v, ok := downward[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("env %s: field %s is not one this test knows", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			d.env[e.Name] = v
		case e.ValueFrom == nil:
			d.env[e.Name] = e.Value
		}
	}
	if len(d.ctr.Command) != 0 {
		t.Fatalf("container %s sets command %q; the image's ENTRYPOINT /freqring is expected", d.ctr.Name, d.ctr.Command)
	}
	args := make([]string, len(d.ctr.Args))
	for i, a := range d.ctr.Args {
		var err error
		if args[i], err = expand(a, d.env); err != nil {
			t.Fatalf("container %s args[%d] %q: %v", d.ctr.Name, i, a, err)
		}
	}
	var err error
	if d.flags, err = parseServeArgs(args, serveFlags(t)); err != nil {
		t.Fatalf("container %s args: %v", d.ctr.Name, err)
	}
	return d
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) as the kubelet does in args, with the values of
// env. Unlike the kubelet, which leaves an undefined reference as it is, it
// fails: the node would get a literal "$(POD_IP)".
func expand(s string, env map[string]string) (string, error) {
	var err error
	out := varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		name := m[2 : len(m)-1]
		v, ok := env[name]
		if !ok {
			err = fmt.Errorf("$(%s) is not an env var of the container", name)
		}
		return v
	})
	return out, err
}

// hostPort splits a flag's host:port value.
func hostPort(t *testing.T, flag, v string) (string, int32) {
	t.Helper()
	h, p, err := net.SplitHostPort(v)
	if err != nil {
		t.Fatalf("--%s=%s: %v", flag, v, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatalf("--%s=%s: port: %v", flag, v, err)
	}
	return h, int32(n)
}

// targetPort resolves a Service port's targetPort against the container.
func (d *deployment) targetPort(t *testing.T, svc *corev1.Service, sp corev1.ServicePort) int32 {
	t.Helper()
	tp := sp.TargetPort
	switch {
	case tp.Type == intstr.Int && tp.IntVal == 0:
		return sp.Port // Kubernetes: targetPort defaults to port
	case tp.Type == intstr.Int:
		return tp.IntVal
	}
	for _, cp := range d.ctr.Ports {
		if cp.Name == tp.StrVal {
			if proto(cp.Protocol) != proto(sp.Protocol) {
				t.Errorf("Service %s port %s (%s) targets container port %s, which is %s", svc.Name, sp.Name, proto(sp.Protocol), cp.Name, proto(cp.Protocol))
			}
			return cp.ContainerPort
		}
	}
	t.Errorf("Service %s port %s: targetPort %q names no port of container %s", svc.Name, sp.Name, tp.StrVal, d.ctr.Name)
	return 0
}

func proto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func TestStatefulSet(t *testing.T) {
	d := load(t)
	spec := d.sts.Spec
	pod := spec.Template.Spec

	sel, err := metav1.LabelSelectorAsSelector(spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(d.podLabels) {
		t.Errorf("StatefulSet selector %v (%v) does not select its pods' labels %v", spec.Selector, err, d.podLabels)
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel", spec.PodManagementPolicy)
	}
	if spec.Replicas == nil || *spec.Replicas < 3 {
		t.Errorf("replicas %v, want at least 3 (a PDB of maxUnavailable 1 and a quorum of gossip probes)", spec.Replicas)
	}
	if pod.TerminationGracePeriodSeconds == nil {
		t.Error("terminationGracePeriodSeconds unset (30 s)")
	} else if got, min := time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, node.ShutdownGrace*3/2; got <= min {
		// Serve leaves the ring (at most ShutdownGrace/2), then drains (at most ShutdownGrace).
		t.Errorf("terminationGracePeriodSeconds %v, want more than %v (leave + drain, node.ShutdownGrace %v)", got, min, node.ShutdownGrace)
	}

	// The downward API feeds the node its identity and addresses.
	for name, field := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"} {
		if d.env[name] != downward[field] {
			t.Errorf("env %s: want fieldRef %s", name, field)
		}
	}
	if got := d.flags["name"]; got != downward["metadata.name"] {
		t.Errorf("--name expands to %q, want the pod name ($(POD_NAME))", got)
	}

	checkAdmin(t, d, "")
	if d.flags["admin-pprof"] != "" && d.flags["admin-pprof"] != "false" {
		t.Errorf("--admin-pprof=%s: profiles on the pod network", d.flags["admin-pprof"])
	}

	// gRPC: the listen, advertise, container, probe and Service ports agree.
	if h, p := hostPort(t, "listen", d.flags["listen"]); p != d.grpcPort || (h != "0.0.0.0" && h != "" && h != "::") {
		t.Errorf("--listen=%s: want every interface on the grpc containerPort %d", d.flags["listen"], d.grpcPort)
	}
	if h, p := hostPort(t, "advertise", d.flags["advertise"]); h != downward["status.podIP"] || p != d.grpcPort {
		t.Errorf("--advertise expands to %s, want $(POD_IP):%d", d.flags["advertise"], d.grpcPort)
	}
	for name, pr := range map[string]*corev1.Probe{"startupProbe": d.ctr.StartupProbe, "readinessProbe": d.ctr.ReadinessProbe, "livenessProbe": d.ctr.LivenessProbe} {
		switch {
		case pr == nil:
			t.Errorf("%s missing", name)
		case pr.GRPC == nil:
			t.Errorf("%s is not a grpc probe (the image has no shell or curl; health is gRPC)", name)
		case pr.GRPC.Port != d.grpcPort:
			t.Errorf("%s port %d, want the grpc containerPort %d", name, pr.GRPC.Port, d.grpcPort)
		case pr.GRPC.Service != nil && *pr.GRPC.Service != "" && *pr.GRPC.Service != "freqring.v1.Limiter" && *pr.GRPC.Service != node.LivenessService:
			t.Errorf("%s asks for health of service %q, which the node does not report", name, *pr.GRPC.Service)
		}
	}
	// Liveness asks the service that stays SERVING while the process runs:
	// a node whose WAL failed is not ready, and must not be restarted for it.
	if pr := d.ctr.LivenessProbe; pr != nil && pr.GRPC != nil && (pr.GRPC.Service == nil || *pr.GRPC.Service != node.LivenessService) {
		t.Errorf("livenessProbe asks for health of service %v, want %q (the readiness services turn NOT_SERVING while the WAL has failed)", pr.GRPC.Service, node.LivenessService)
	}
	for name, pr := range map[string]*corev1.Probe{"startupProbe": d.ctr.StartupProbe, "readinessProbe": d.ctr.ReadinessProbe} {
		if pr != nil && pr.GRPC != nil && pr.GRPC.Service != nil && *pr.GRPC.Service == node.LivenessService {
			t.Errorf("%s asks for %q, which is SERVING before the node recovers and while its WAL has failed", name, node.LivenessService)
		}
	}
	checkSecrets(t, d)
	if pr := d.ctr.StartupProbe; pr != nil {
		if budget := time.Duration(max(pr.PeriodSeconds, 10)*max(pr.FailureThreshold, 3)) * time.Second; budget < 5*time.Minute {
			t.Errorf("startupProbe allows %v for recovery, want at least 5m (snapshot load and WAL replay)", budget)
		}
	}

	// Gossip: bind, advertise, join and the TCP and UDP container ports agree.
	if h, p := hostPort(t, "gossip", d.flags["gossip"]); p != d.gossip || (h != "0.0.0.0" && h != "") {
		t.Errorf("--gossip=%s: want every interface on the gossip-tcp containerPort %d", d.flags["gossip"], d.gossip)
	}
	if h, p := hostPort(t, "gossip-advertise", d.flags["gossip-advertise"]); h != downward["status.podIP"] || p != d.gossip {
		t.Errorf("--gossip-advertise expands to %s, want $(POD_IP):%d", d.flags["gossip-advertise"], d.gossip)
	}
	udp := false
	for _, cp := range d.ctr.Ports {
		udp = udp || (cp.ContainerPort == d.gossip && cp.Protocol == corev1.ProtocolUDP)
	}
	if !udp {
		t.Errorf("container %s has no UDP port %d for gossip", d.ctr.Name, d.gossip)
	}

	// The WAL lives on the claim, mounted at --data-dir, writable.
	dataDir := d.flags["data-dir"]
	if dataDir == "" {
		t.Fatal("--data-dir unset: the node would keep no WAL")
	}
	if len(spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volumeClaimTemplates, want 1 (the WAL)", len(spec.VolumeClaimTemplates))
	}
	claim := spec.VolumeClaimTemplates[0]
	if q := claim.Spec.Resources.Requests[corev1.ResourceStorage]; q.IsZero() {
		t.Errorf("volume claim %s requests no storage", claim.Name)
	}
	if i := slices.IndexFunc(d.ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == claim.Name }); i < 0 {
		t.Errorf("volume claim %s is not mounted in container %s", claim.Name, d.ctr.Name)
	} else if m := d.ctr.VolumeMounts[i]; path.Clean(m.MountPath) != path.Clean(dataDir) || m.ReadOnly || m.SubPath != "" {
		t.Errorf("volume claim %s mounted at %s (readOnly %v, subPath %q), want read-write at --data-dir %s", claim.Name, m.MountPath, m.ReadOnly, m.SubPath, dataDir)
	}
	if slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == claim.Name }) {
		t.Errorf("pod volume %s shadows the volume claim of the same name", claim.Name)
	}

	// Hardening.
	psc, csc := pod.SecurityContext, d.ctr.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	if psc == nil || psc.FSGroup == nil {
		t.Error("pod securityContext.fsGroup unset: the data volume may not be writable by the non-root user")
	}
	if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Error("container securityContext.readOnlyRootFilesystem is not true")
	}
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Error("container securityContext.allowPrivilegeEscalation is not false")
	}

	// Resources, and a node memory budget below the container's limit:
	// --max-memory auto (the default) takes 90% of it and makes that the Go
	// memory limit, so GOMEMLIMIT would only be a second number to keep in
	// step.
	res := d.ctr.Resources
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := res.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := res.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
	if req, lim := res.Requests[corev1.ResourceMemory], res.Limits[corev1.ResourceMemory]; req.Cmp(lim) != 0 {
		t.Errorf("memory request %s differs from the limit %s: a node holds what it is given, so ask for it (Guaranteed QoS)", req.String(), lim.String())
	}
	if gml, ok := d.env["GOMEMLIMIT"]; ok {
		t.Errorf("GOMEMLIMIT %q is set: serve sets the Go memory limit from --max-memory (auto: 90%% of the memory limit)", gml)
	}
	if lim, ok := res.Limits[corev1.ResourceMemory]; ok {
		if mm, ok := d.flags["max-memory"]; ok && mm != "auto" {
			b, err := parseGoMemLimit(mm)
			if err != nil {
				t.Errorf("--max-memory=%s: %v", mm, err)
			} else if b == 0 || b >= lim.Value() {
				t.Errorf("--max-memory=%s is not below the memory limit %s", mm, lim.String())
			}
		}
	}

	// Spread over machines.
	aff := pod.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Error("no preferred podAntiAffinity")
	} else {
		for _, w := range aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			s, err := metav1.LabelSelectorAsSelector(w.PodAffinityTerm.LabelSelector)
			if err != nil || s.Empty() || !s.Matches(d.podLabels) {
				t.Errorf("podAntiAffinity selector %v (%v) does not match the pods' labels %v", w.PodAffinityTerm.LabelSelector, err, d.podLabels)
			}
		}
	}
}

// parseGoMemLimit parses a GOMEMLIMIT or --max-memory value: bytes, with
// an optional B, KiB, MiB, GiB or TiB suffix.
func parseGoMemLimit(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

func TestServices(t *testing.T) {
	d := load(t)
	h := d.headless
	if h.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s (the StatefulSet's serviceName): clusterIP %q, want None (headless)", h.Name, h.Spec.ClusterIP)
	}
	if !h.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: publishNotReadyAddresses false: nodes that are not ready yet (still joining) could not be found by --join", h.Name)
	}
	if len(d.client) == 0 {
		t.Error("no client Service besides the headless one")
	}
	for _, s := range d.objs.services {
		sel := labels.SelectorFromSet(s.Spec.Selector)
		if len(s.Spec.Selector) == 0 || !sel.Matches(d.podLabels) {
			t.Errorf("Service %s selector %v does not select the pods (labels %v)", s.Name, s.Spec.Selector, d.podLabels)
		}
		var grpc bool
		for _, sp := range s.Spec.Ports {
			tp := d.targetPort(t, s, sp)
			switch {
			case sp.Name == "grpc":
				grpc = true
				if tp != d.grpcPort || proto(sp.Protocol) != corev1.ProtocolTCP {
					t.Errorf("Service %s port grpc targets %d/%s, want the grpc containerPort %d/TCP", s.Name, tp, proto(sp.Protocol), d.grpcPort)
				}
			case strings.HasPrefix(sp.Name, "gossip"):
				if tp != d.gossip {
					t.Errorf("Service %s port %s targets %d, want the gossip port %d", s.Name, sp.Name, tp, d.gossip)
				}
			default:
				t.Errorf("Service %s port %q is neither grpc nor gossip", s.Name, sp.Name)
			}
		}
		if !grpc {
			t.Errorf("Service %s has no port named grpc", s.Name)
		}
	}
	// The headless Service carries gossip on both protocols (and DNS for it).
	for _, p := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		if !slices.ContainsFunc(h.Spec.Ports, func(sp corev1.ServicePort) bool {
			return proto(sp.Protocol) == p && sp.Port == d.gossip && d.targetPort(t, h, sp) == d.gossip
		}) {
			t.Errorf("Service %s has no %s port %d for gossip", h.Name, p, d.gossip)
		}
	}

	// --join names the headless Service, in the pod's namespace, on the gossip port.
	join := d.flags["join"]
	if join == "" {
		t.Fatal("--join unset: every pod would form a cluster of its own")
	}
	ns := downward["metadata.namespace"]
	for _, seed := range strings.Split(join, ",") {
		host, port := hostPort(t, "join", seed)
		host = strings.TrimSuffix(host, ".")
		names := []string{h.Name, h.Name + "." + ns, h.Name + "." + ns + ".svc", h.Name + "." + ns + ".svc.cluster.local"}
		if !slices.Contains(names, host) {
			t.Errorf("--join seed %s: host %q is not the headless Service %s in the pod's namespace ($(POD_NAMESPACE)); want one of %q", seed, host, h.Name, names)
		}
		if port != d.gossip {
			t.Errorf("--join seed %s: port %d, want the gossip port %d (headless DNS names pod IPs, so the seed port is the pods' own)", seed, port, d.gossip)
		}
	}
}

func TestPodDisruptionBudget(t *testing.T) {
	d := load(t)
	if len(d.objs.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(d.objs.pdbs))
	}
	pdb := d.objs.pdbs[0]
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(d.podLabels) {
		t.Errorf("PDB %s selector %v (%v) does not select the pods (labels %v)", pdb.Name, pdb.Spec.Selector, err, d.podLabels)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || *mu != intstr.FromInt32(1) {
		t.Errorf("PDB %s maxUnavailable %v, want 1", pdb.Name, mu)
	}
}

// TestRules: the rules file the container reads is a key of the generated
// ConfigMap, and freqring's own parser accepts it. As shipped it holds the
// embedded default rules.
func TestRules(t *testing.T) {
	d := load(t)
	rulesPath := d.flags["rules"]
	if rulesPath == "" {
		t.Fatal("--rules unset: the ConfigMap would be ignored for the embedded defaults")
	}
	var data string
	found := false
	for _, m := range d.ctr.VolumeMounts {
		rel, err := filepath.Rel(m.MountPath, rulesPath)
		if err != nil || strings.HasPrefix(rel, "..") || m.SubPath != "" {
			continue
		}
		vi := slices.IndexFunc(d.sts.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if vi < 0 {
			t.Fatalf("volumeMount %s names no pod volume", m.Name)
		}
		v := d.sts.Spec.Template.Spec.Volumes[vi]
		if v.ConfigMap == nil {
			t.Fatalf("--rules=%s is on volume %s, which is not a ConfigMap", rulesPath, v.Name)
		}
		key := rel
		if len(v.ConfigMap.Items) > 0 {
			i := slices.IndexFunc(v.ConfigMap.Items, func(it corev1.KeyToPath) bool { return it.Path == rel })
			if i < 0 {
				t.Fatalf("--rules=%s: volume %s projects no item to path %s", rulesPath, v.Name, rel)
			}
			key = v.ConfigMap.Items[i].Key
		}
		ci := slices.IndexFunc(d.objs.configMaps, func(c *corev1.ConfigMap) bool { return c.Name == v.ConfigMap.Name })
		if ci < 0 {
			t.Fatalf("volume %s names ConfigMap %s, which the kustomization does not make (a generated name must be rewritten by kustomize)", v.Name, v.ConfigMap.Name)
		}
		if name := d.objs.configMaps[ci].Name; name != "freqring-rules" {
			t.Errorf("the rules ConfigMap is named %s: a name with a content hash rolls every pod on a rules edit; nodes reload the mounted file in place (disableNameSuffixHash)", name)
		}
		var ok bool
		if data, ok = d.objs.configMaps[ci].Data[key]; !ok {
			t.Fatalf("--rules=%s is key %q of ConfigMap %s, which has keys %v", rulesPath, key, v.ConfigMap.Name, keys(d.objs.configMaps[ci].Data))
		}
		found = true
		break
	}
	if !found {
		t.Fatalf("--rules=%s is under no volumeMount of container %s", rulesPath, d.ctr.Name)
	}

	rs, err := rules.Parse(rulesPath, []byte(data))
	if err != nil {
		t.Fatalf("freqring would refuse to start: %v", err)
	}
	def := rules.Default()
	if !reflect.DeepEqual(rs.Names(), def.Names()) {
		t.Fatalf("domains %v, want the embedded defaults' %v (rules/default_rules.yaml)", rs.Names(), def.Names())
	}
	for _, name := range def.Names() {
		if got, want := rs.Domain(name).Rules(), def.Domain(name).Rules(); !reflect.DeepEqual(got, want) {
			t.Errorf("domain %s: rules %+v, want the embedded defaults %+v (rules/default_rules.yaml); update deploy/k8s/rules.yaml or this check", name, got, want)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestImage: the manifests and deploy/Dockerfile agree on the user, the
// ports and the container defaults that args repeat.
func TestImage(t *testing.T) {
	d := load(t)
	img := readDockerfile(t)
	psc := d.sts.Spec.Template.Spec.SecurityContext
	if psc != nil && psc.RunAsUser != nil {
		u := strconv.FormatInt(*psc.RunAsUser, 10)
		if psc.RunAsGroup != nil {
			u += ":" + strconv.FormatInt(*psc.RunAsGroup, 10)
		}
		if uid, _, _ := strings.Cut(img.user, ":"); u != img.user && u != uid {
			t.Errorf("pod runs as %s, the image's USER is %s", u, img.user)
		}
	}
	want := map[string]bool{}
	for _, cp := range d.ctr.Ports {
		want[fmt.Sprintf("%d/%s", cp.ContainerPort, strings.ToLower(string(proto(cp.Protocol))))] = true
	}
	if !reflect.DeepEqual(img.exposed, want) {
		t.Errorf("Dockerfile EXPOSE %v, container ports %v", keys2(img.exposed), keys2(want))
	}
	cmd, err := parseServeArgs(img.cmd, serveFlags(t))
	if err != nil {
		t.Fatalf("Dockerfile CMD: %v", err)
	}
	for _, f := range []string{"listen", "data-dir"} {
		if cmd[f] != d.flags[f] {
			t.Errorf("--%s: Dockerfile CMD %q, StatefulSet args %q", f, cmd[f], d.flags[f])
		}
	}
	k := loadKustomization(t)
	if len(k.Images) == 0 || !strings.HasPrefix(d.ctr.Image, k.Images[0].NewName) {
		t.Errorf("container image %q is not set by the kustomization's images %+v", d.ctr.Image, k.Images)
	}
}

func keys2(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestTLSOverlay: deploy/k8s-tls builds, its serve flags exist, and every
// file they name is in a Secret mounted read-only, under the key the
// Secret is documented to hold.
func TestTLSOverlay(t *testing.T) {
	d := loadDir(t, tlsDir)
	spec := d.sts.Spec.Template.Spec
	for flag, want := range map[string]struct{ secret, key string }{
		"tls-cert": {"freqring-tls", "tls.crt"}, "tls-key": {"freqring-tls", "tls.key"},
		"tls-ca": {"freqring-tls", "ca.crt"},
	} {
		file, ok := d.flags[flag]
		if !ok {
			t.Errorf("--%s not set", flag)
			continue
		}
		found := false
		for _, m := range d.ctr.VolumeMounts {
			if path.Dir(file) != m.MountPath {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == want.secret && m.ReadOnly && path.Base(file) == want.key {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("--%s=%s is not key %s of Secret %s mounted read-only", flag, file, want.key, want.secret)
		}
	}
	checkSecrets(t, d)
	admin := checkAdmin(t, d, "https")
	if d.flags["admin-tls"] != "true" {
		t.Errorf("--admin-tls=%q, want true: the admin listener shares the gRPC certificate", d.flags["admin-tls"])
	}
	for name, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"startup": {d.ctr.StartupProbe, "/readyz"}, "readiness": {d.ctr.ReadinessProbe, "/readyz"}, "liveness": {d.ctr.LivenessProbe, "/livez"}} {
		p := want.p
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Path != want.path || d.portOf(t, p.HTTPGet.Port) != admin {
			t.Errorf("%s probe %+v: want HTTPS GET %s on the admin port %d (gRPC probes are plaintext)", name, p, want.path, admin)
		}
	}
	if d.flags["tls-client-auth"] == "" || d.flags["tls-server-name"] == "" {
		t.Errorf("flags %v: want --tls-client-auth and --tls-server-name", d.flags)
	}
}

// checkSecrets checks that the node of d authenticates its peers and its
// operators: --cluster-keys and --admin-token-file name keys of the Secret
// freqring, mounted read-only, and no flag runs it without them.
func checkSecrets(t *testing.T, d *deployment) {
	t.Helper()
	spec := d.sts.Spec.Template.Spec
	for flag, key := range map[string]string{"cluster-keys": "cluster-keys", "admin-token-file": "admin-token"} {
		file, ok := d.flags[flag]
		if !ok {
			t.Errorf("--%s not set: the Peer service (or Admin's changes) would take calls from anyone who reaches the gRPC port", flag)
			continue
		}
		found := false
		for _, m := range d.ctr.VolumeMounts {
			if path.Dir(file) != m.MountPath || !m.ReadOnly {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "freqring" && (v.Secret.Optional == nil || !*v.Secret.Optional) && path.Base(file) == key {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("--%s=%s is not key %s of Secret freqring (not optional) mounted read-only", flag, file, key)
		}
	}
	for _, flag := range []string{"insecure-peers", "insecure-admin", "gossip-keys"} {
		if v, ok := d.flags[flag]; ok && v != "false" {
			t.Errorf("--%s=%s set", flag, v)
		}
	}
}

// TestNetworkPolicy: only the nodes reach each other's gossip port, TCP and
// UDP; the gRPC and admin ports stay open (clients, probes, Prometheus).
func TestNetworkPolicy(t *testing.T) {
	d := load(t)
	if len(d.objs.netPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies, want 1", len(d.objs.netPolicies))
	}
	np := d.objs.netPolicies[0]
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() || !sel.Matches(d.podLabels) {
		t.Fatalf("NetworkPolicy %s selects %v (%v), not the pods %v", np.Name, np.Spec.PodSelector, err, d.podLabels)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy %s: policyTypes %v lack Ingress", np.Name, np.Spec.PolicyTypes)
	}
	// open reports whether some rule lets traffic from everyone (no from)
	// or from the nodes alone (a from of the pods' labels) reach port.
	open := func(port int32, p corev1.Protocol) (fromAnyone, fromNodes bool) {
		for _, r := range np.Spec.Ingress {
			has := len(r.Ports) == 0
			for _, rp := range r.Ports {
				has = has || (rp.Port != nil && d.portOf(t, *rp.Port) == port && proto(ptrOr(rp.Protocol)) == p)
			}
			if !has {
				continue
			}
			if len(r.From) == 0 {
				fromAnyone = true
			}
			for _, f := range r.From {
				s, err := metav1.LabelSelectorAsSelector(f.PodSelector)
				if f.PodSelector != nil && err == nil && !s.Empty() && s.Matches(d.podLabels) && f.NamespaceSelector == nil && f.IPBlock == nil {
					fromNodes = true
				} else {
					fromAnyone = true // another source: count it as open
				}
			}
		}
		return
	}
	for _, p := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		if anyone, nodes := open(d.gossip, p); anyone || !nodes {
			t.Errorf("gossip port %d/%s: open to others %v, to the nodes %v; want the nodes only", d.gossip, p, anyone, nodes)
		}
	}
	if anyone, _ := open(d.grpcPort, corev1.ProtocolTCP); !anyone {
		t.Errorf("gRPC port %d closed to clients", d.grpcPort)
	}
}

func ptrOr(p *corev1.Protocol) corev1.Protocol {
	if p == nil {
		return corev1.ProtocolTCP
	}
	return *p
}

// checkAdmin checks the admin listener of d: --admin-listen on every
// interface of the containerPort named admin, and the pod's Prometheus
// annotations pointing at it, with scheme (""  means http) — and returns
// the port.
func checkAdmin(t *testing.T, d *deployment, scheme string) int32 {
	t.Helper()
	var admin int32
	for _, p := range d.ctr.Ports {
		if p.Name == "admin" && p.Protocol == corev1.ProtocolTCP {
			admin = p.ContainerPort
		}
	}
	if admin == 0 {
		t.Fatalf("container %s: no TCP port named admin", d.ctr.Name)
	}
	if h, p := hostPort(t, "admin-listen", d.flags["admin-listen"]); p != admin || (h != "0.0.0.0" && h != "") {
		t.Errorf("--admin-listen=%s: want every interface on the admin containerPort %d", d.flags["admin-listen"], admin)
	}
	ann := d.sts.Spec.Template.Annotations
	want := map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": fmt.Sprint(admin), "prometheus.io/path": "/metrics", "prometheus.io/scheme": scheme}
	for k, v := range want {
		if ann[k] != v {
			t.Errorf("pod annotation %s=%q, want %q", k, ann[k], v)
		}
	}
	return admin
}

// portOf resolves a probe's port (a number or a container port's name).
func (d *deployment) portOf(t *testing.T, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range d.ctr.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Errorf("port %q names no port of container %s", p.StrVal, d.ctr.Name)
	return 0
}
