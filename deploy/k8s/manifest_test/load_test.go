// Package manifest_test checks the Kubernetes manifests of deploy/k8s: every
// file decodes strictly into the Kubernetes API types, the kustomization
// builds, and the objects agree with each other, with the image
// (deploy/Dockerfile), with the flags of `freqring serve` and with
// freqring's rules parser.
//
// It is a module of its own so that the main module does not depend on
// Kubernetes; it reaches the main module through a replace directive. Run it
// from the repository root with
//
//	(cd deploy/k8s/manifest_test && go test -count=1 ./...)
package manifest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Paths from this directory.
const (
	k8sDir     = ".."                                // deploy/k8s, the kustomization
	dockerfile = "../../Dockerfile"                  // deploy/Dockerfile
	serveGo    = "../../../cmd/freqring/serve.go"    // the flags of freqring serve
	securityGo = "../../../cmd/freqring/security.go" // and its --tls-* flags
	adminGo    = "../../../cmd/freqring/admin.go"    // and its --admin-* flags
	tlsDir     = "../../k8s-tls"                     // the TLS overlay
)

// objects are the Kubernetes objects of one set of manifests, by kind.
type objects struct {
	services     []*corev1.Service
	statefulSets []*appsv1.StatefulSet
	pdbs         []*policyv1.PodDisruptionBudget
	configMaps   []*corev1.ConfigMap
	netPolicies  []*networkingv1.NetworkPolicy
}

// decodeStrict decodes one YAML or JSON document into the API type its kind
// names, refusing unknown and duplicate fields, and adds it to objs. Kinds
// this deployment does not use are an error, so a new one must be added here
// (and checked) on purpose.
func decodeStrict(objs *objects, src string, doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("%s: %v", src, err)
	}
	gvk := tm.APIVersion + "/" + tm.Kind
	var target any
	switch gvk {
	case "v1/Service":
		o := &corev1.Service{}
		objs.services, target = append(objs.services, o), o
	case "apps/v1/StatefulSet":
		o := &appsv1.StatefulSet{}
		objs.statefulSets, target = append(objs.statefulSets, o), o
	case "policy/v1/PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		objs.pdbs, target = append(objs.pdbs, o), o
	case "v1/ConfigMap":
		o := &corev1.ConfigMap{}
		objs.configMaps, target = append(objs.configMaps, o), o
	case "networking.k8s.io/v1/NetworkPolicy":
		o := &networkingv1.NetworkPolicy{}
		objs.netPolicies, target = append(objs.netPolicies, o), o
	default:
		return fmt.Errorf("%s: kind %q is not one this test knows (Service, StatefulSet, PodDisruptionBudget, ConfigMap, NetworkPolicy)", src, gvk)
	}
	if err := yaml.UnmarshalStrict(doc, target); err != nil {
		return fmt.Errorf("%s: %s: %v", src, gvk, err)
	}
	return nil
}

// loadKustomization decodes kustomization.yaml strictly.
func loadKustomization(t *testing.T) *types.Kustomization {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k8sDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return &k
}

// build runs kustomize on deploy/k8s, as `kubectl apply -k` would, and
// decodes every object it emits strictly.
func build(t *testing.T) *objects { return buildDir(t, k8sDir) }

// buildDir runs kustomize on dir.
func buildDir(t *testing.T, dir string) *objects {
	t.Helper()
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs := &objects{}
	for _, r := range rm.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("kustomize output %s: %v", r.CurId(), err)
		}
		if err := decodeStrict(objs, "kustomize output "+r.CurId().String(), b); err != nil {
			t.Fatal(err)
		}
	}
	return objs
}

// generatorFiles returns the files the kustomization's ConfigMap generators
// read, as key -> file name (kustomize's "key=file" or just "file").
func generatorFiles(g types.ConfigMapArgs) map[string]string {
	out := map[string]string{}
	for _, s := range g.FileSources {
		key, file, ok := strings.Cut(s, "=")
		if !ok {
			key, file = filepath.Base(s), s
		}
		out[key] = file
	}
	return out
}

// serveFlags returns the names of the flags `freqring serve` defines, read
// from cmd/freqring/serve.go and security.go (the --tls-* flags): every
// fs.String("name", ...), fs.Int(...) and so on. Compiling the command would be slower and would reach for code
// this module has no business building.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, file := range []string{serveGo, securityGo, adminGo} {
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		inspectFlags(f, flags)
	}
	if len(flags) < 10 || !flags["listen"] || !flags["join"] || !flags["tls-cert"] || !flags["max-streams"] || !flags["idle-timeout"] {
		t.Fatalf("%s, %s: found only flags %v; has the flag set stopped being called fs?", serveGo, securityGo, flags)
	}
	return flags
}

// inspectFlags adds to flags the names of the flags f defines on fs.
func inspectFlags(f *ast.File, flags map[string]bool) {
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
			return true
		}
		name := 0 // the argument that names the flag
		switch sel.Sel.Name {
		case "String", "Int", "Int64", "Uint", "Uint64", "Bool", "Duration", "Float64":
		case "StringVar", "IntVar", "Int64Var", "UintVar", "Uint64Var", "BoolVar", "DurationVar", "Float64Var":
			name = 1 // fs.IntVar(&v, "name", ...)
		default:
			return true
		}
		if len(call.Args) <= name {
			return true
		}
		if lit, ok := call.Args[name].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if name, err := strconv.Unquote(lit.Value); err == nil {
				flags[name] = true
			}
		}
		return true
	})
}

// parseServeArgs parses a `serve` command line of the forms --k=v, --k v and
// --bool into flag -> value, refusing flags that serve does not define, a
// flag given twice and positional arguments. Boolean flags must use --k=v.
func parseServeArgs(args []string, known map[string]bool) (map[string]string, error) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, fmt.Errorf("command line %q does not start with serve", args)
	}
	out := map[string]string{}
	for i := 1; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return nil, fmt.Errorf("argument %q is not a flag", a)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !known[name] {
			return nil, fmt.Errorf("flag --%s is not a flag of freqring serve (%s)", name, serveGo)
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag --%s has no value", name)
			}
			i++
			val = args[i]
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("flag --%s given twice", name)
		}
		out[name] = val
	}
	return out, nil
}

// image is what the tests read from deploy/Dockerfile.
type image struct {
	user    string          // USER
	exposed map[string]bool // EXPOSE entries as "port/proto"
	cmd     []string        // CMD, exec form
}

func readDockerfile(t *testing.T) image {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	img := image{exposed: map[string]bool{}}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "USER":
			img.user = f[1]
		case "EXPOSE":
			for _, p := range f[1:] {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				img.exposed[strings.ToLower(p)] = true
			}
		case "CMD":
			rest := strings.TrimSpace(line[len(f[0]):])
			if err := json.Unmarshal([]byte(rest), &img.cmd); err != nil {
				t.Fatalf("%s: CMD is not in exec (JSON) form: %v", dockerfile, err)
			}
		}
	}
	return img
}

// splitYAMLDocs splits a multi-document YAML file; each file of deploy/k8s
// should hold one object, but the loader does not assume it.
func splitYAMLDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

// yamlFiles lists the *.yaml and *.yml files of deploy/k8s.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(k8sDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}
