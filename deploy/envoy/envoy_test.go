// Package envoy_test checks the Envoy examples of deploy/envoy against the
// Envoy v3 API (go-control-plane) and against freqring's descriptor
// convention: each file decodes strictly (unknown and duplicate fields fail)
// and validates, and the rate limit filter, its cluster and the descriptor
// actions are what freqring's Envoy RLS expects.
//
//	go test ./deploy/envoy/
package envoy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	pb "github.com/freqring/freqring/api/freqringv1"
	"github.com/freqring/freqring/gateway"
	"github.com/freqring/freqring/rules"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const (
	bootstrapFile   = "envoy.yaml"
	envoyFilterFile = "istio-envoyfilter.yaml"

	ratelimitFilter = "envoy.filters.http.ratelimit"
	routerFilter    = "envoy.filters.http.router"
	hcmFilter       = "envoy.filters.network.http_connection_manager"
	http2Options    = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	freqringPort    = 7070 // deploy/k8s/service.yaml
)

// The descriptor keys freqring reads by convention; recipient is required.
var descriptorKeys = []string{"recipient", "content", "request_id"}

// yamlToJSON turns one YAML document into JSON, refusing duplicate keys
// (yaml.v3 does), non-string keys (encoding/json does) and a second document.
func yamlToJSON(src []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("more than one YAML document (%v)", err)
	}
	return json.Marshal(v)
}

// validator is what protoc-gen-validate generates on every Envoy type.
type validator interface{ ValidateAll() error }

// strict is protojson's default decoding, under which an unknown field (in
// the message or in any Any it holds) is an error.
var strict = protojson.UnmarshalOptions{}

// validated returns the decoding error, or else the result of the
// validation rules generated for v: validated(strict.Unmarshal(js, m), m).
func validated(err error, v validator) error {
	if err != nil {
		return err
	}
	return v.ValidateAll()
}

// loadBootstrap decodes and validates an Envoy bootstrap in YAML.
func loadBootstrap(src []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yamlToJSON(src)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := validated(strict.Unmarshal(js, &b), &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// envoyFilter is the part of Istio's networking.istio.io/v1alpha3
// EnvoyFilter that these examples use, spelt as the Istio API spells it, so
// that decoding with KnownFields refuses a misspelt or unknown key. Patch
// values stay generic: they are decoded into the Envoy types below.
type envoyFilter struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		WorkloadSelector struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"workloadSelector"`
		Priority      int           `yaml:"priority"`
		ConfigPatches []configPatch `yaml:"configPatches"`
	} `yaml:"spec"`
}

type configPatch struct {
	ApplyTo string `yaml:"applyTo"`
	Match   struct {
		Context string `yaml:"context"`
		Proxy   struct {
			ProxyVersion string            `yaml:"proxyVersion"`
			Metadata     map[string]string `yaml:"metadata"`
		} `yaml:"proxy"`
		Listener struct {
			Name        string `yaml:"name"`
			PortNumber  int    `yaml:"portNumber"`
			FilterChain struct {
				Name                 string `yaml:"name"`
				Sni                  string `yaml:"sni"`
				TransportProtocol    string `yaml:"transportProtocol"`
				ApplicationProtocols string `yaml:"applicationProtocols"`
				DestinationPort      int    `yaml:"destinationPort"`
				Filter               struct {
					Name      string `yaml:"name"`
					SubFilter struct {
						Name string `yaml:"name"`
					} `yaml:"subFilter"`
				} `yaml:"filter"`
			} `yaml:"filterChain"`
		} `yaml:"listener"`
		RouteConfiguration struct {
			Name       string `yaml:"name"`
			PortNumber int    `yaml:"portNumber"`
			PortName   string `yaml:"portName"`
			Gateway    string `yaml:"gateway"`
			Vhost      struct {
				Name  string `yaml:"name"`
				Route struct {
					Name   string `yaml:"name"`
					Action string `yaml:"action"`
				} `yaml:"route"`
			} `yaml:"vhost"`
		} `yaml:"routeConfiguration"`
		Cluster struct {
			Name       string `yaml:"name"`
			PortNumber int    `yaml:"portNumber"`
			Service    string `yaml:"service"`
			Subset     string `yaml:"subset"`
		} `yaml:"cluster"`
	} `yaml:"match"`
	Patch struct {
		Operation   string `yaml:"operation"`
		FilterClass string `yaml:"filterClass"`
		Value       any    `yaml:"value"`
	} `yaml:"patch"`
}

// decodedPatch is a config patch with its value decoded into the Envoy type
// its applyTo names.
type decodedPatch struct {
	configPatch
	filter  *hcmv3.HttpFilter    // HTTP_FILTER
	cluster *clusterv3.Cluster   // CLUSTER
	vhost   *routev3.VirtualHost // VIRTUAL_HOST
	route   *routev3.Route       // HTTP_ROUTE
}

// loadEnvoyFilter decodes an EnvoyFilter strictly and each patch value
// strictly into its Envoy type, and validates it. A MERGE value is partial by
// design (Istio proto-merges it into the generated object), so the required
// fields it leaves out are filled as the generated object has them before
// validating. An applyTo these examples do not use is an error, so a new
// one must be added here (and checked) on purpose.
func loadEnvoyFilter(src []byte) (*envoyFilter, []decodedPatch, error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	var ef envoyFilter
	if err := dec.Decode(&ef); err != nil {
		return nil, nil, err
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("more than one YAML document (%v)", err)
	}
	var out []decodedPatch
	for i, cp := range ef.Spec.ConfigPatches {
		js, err := json.Marshal(cp.Patch.Value)
		if err != nil {
			return nil, nil, fmt.Errorf("patch %d: %v", i+1, err)
		}
		d := decodedPatch{configPatch: cp}
		merge := cp.Patch.Operation == "MERGE"
		switch cp.ApplyTo {
		case "HTTP_FILTER":
			d.filter = new(hcmv3.HttpFilter)
			err = validated(strict.Unmarshal(js, d.filter), d.filter)
		case "CLUSTER":
			d.cluster = new(clusterv3.Cluster)
			err = validated(strict.Unmarshal(js, d.cluster), d.cluster)
		case "VIRTUAL_HOST":
			d.vhost = new(routev3.VirtualHost)
			if err = strict.Unmarshal(js, d.vhost); err == nil {
				if merge && d.vhost.Name == "" {
					d.vhost.Name = "inbound|http|8080"
				}
				if merge && len(d.vhost.Domains) == 0 {
					d.vhost.Domains = []string{"*"}
				}
				err = d.vhost.ValidateAll()
			}
		case "HTTP_ROUTE":
			d.route = new(routev3.Route)
			if err = strict.Unmarshal(js, d.route); err == nil {
				if merge && d.route.Match == nil {
					d.route.Match = &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
				}
				if merge && d.route.Action == nil {
					d.route.Action = &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "inbound|8080||"}}}
				}
				err = d.route.ValidateAll()
			}
		default:
			err = fmt.Errorf("applyTo %q is not checked by this test", cp.ApplyTo)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("patch %d (%s): %v", i+1, cp.ApplyTo, err)
		}
		out = append(out, d)
	}
	return &ef, out, nil
}

// checkRateLimitFilter checks the rate limit filter's own configuration and
// returns it: freqring's domain, failing closed, the v3 transport, no
// X-RateLimit headers of Envoy's (freqring sends the IETF ones), and no
// filter-level descriptors (which would override the route's).
func checkRateLimitFilter(t *testing.T, f *hcmv3.HttpFilter) *ratelimitv3.RateLimit {
	t.Helper()
	if f.GetName() != ratelimitFilter || f.GetDisabled() || f.GetIsOptional() {
		t.Fatalf("filter %q (disabled %v, optional %v), want %s enabled", f.GetName(), f.GetDisabled(), f.GetIsOptional(), ratelimitFilter)
	}
	var rl ratelimitv3.RateLimit
	if err := f.GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatalf("%s typed_config: %v", ratelimitFilter, err)
	}
	if rl.GetDomain() != "default" {
		t.Errorf("domain %q, want default (the domain of freqring's embedded rules)", rl.GetDomain())
	}
	if !rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny is false: Envoy would admit whenever freqring cannot decide")
	}
	if v := rl.GetRateLimitService().GetTransportApiVersion().String(); v != "V3" {
		t.Errorf("rate_limit_service transport_api_version %s, want V3", v)
	}
	if rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" {
		t.Error("rate_limit_service has no envoy_grpc cluster_name")
	}
	if rl.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_OFF {
		t.Errorf("enable_x_ratelimit_headers %s: freqring adds the RateLimit headers itself", rl.GetEnableXRatelimitHeaders())
	}
	if len(rl.GetRateLimits()) != 0 {
		t.Error("the filter has rate_limits of its own, which make Envoy ignore the route's")
	}
	return &rl
}

// checkFreqringCluster: the cluster speaks HTTP/2 (gRPC) and every endpoint
// is host on freqring's gRPC port.
func checkFreqringCluster(t *testing.T, c *clusterv3.Cluster, host string) {
	t.Helper()
	opts, ok := c.GetTypedExtensionProtocolOptions()[http2Options]
	if !ok {
		t.Fatalf("cluster %s has no %s: Envoy would speak HTTP/1.1 to a gRPC server", c.GetName(), http2Options)
	}
	var po upstreamhttpv3.HttpProtocolOptions
	if err := opts.UnmarshalTo(&po); err != nil {
		t.Fatalf("cluster %s: %v", c.GetName(), err)
	}
	if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s: protocol options %v, want explicit_http_config http2_protocol_options", c.GetName(), &po)
	}
	if c.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster %s: type %s, want STRICT_DNS (a Service name)", c.GetName(), c.GetType())
	}
	n := 0
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, ep := range le.GetLbEndpoints() {
			sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
			if sa.GetAddress() != host || sa.GetPortValue() != freqringPort {
				t.Errorf("cluster %s: endpoint %s:%d, want %s:%d", c.GetName(), sa.GetAddress(), sa.GetPortValue(), host, freqringPort)
			}
			n++
		}
	}
	if n == 0 {
		t.Errorf("cluster %s has no endpoint", c.GetName())
	}
}

// checkRateLimits: each descriptor is made of request headers under the keys
// freqring reads, names the recipient exactly once and never skips it (a
// descriptor without it would not be limited), and is evaluated at the
// filter rl's stage; and freqring's RLS, on the embedded default rules,
// limits the descriptor Envoy would send for a request with every header
// set under the filter's domain.
func checkRateLimits(t *testing.T, where string, rls []*routev3.RateLimit, rl *ratelimitv3.RateLimit) {
	t.Helper()
	stage := rl.GetStage()
	for i, r := range rls {
		checkTranslates(t, fmt.Sprintf("%s rate_limits[%d]", where, i), rl.GetDomain(), r)
	}
	if len(rls) == 0 {
		t.Errorf("%s: no rate_limits", where)
	}
	for i, r := range rls {
		if r.GetStage().GetValue() != stage {
			t.Errorf("%s rate_limits[%d]: stage %d, the filter's is %d", where, i, r.GetStage().GetValue(), stage)
		}
		recipients := 0
		for j, a := range r.GetActions() {
			rh := a.GetRequestHeaders()
			if rh == nil {
				t.Errorf("%s rate_limits[%d].actions[%d]: %v, want request_headers", where, i, j, a)
				continue
			}
			if !slices.Contains(descriptorKeys, rh.GetDescriptorKey()) {
				t.Errorf("%s rate_limits[%d].actions[%d]: descriptor_key %q, want one of %v (freqring does not limit other keys)", where, i, j, rh.GetDescriptorKey(), descriptorKeys)
			}
			if rh.GetDescriptorKey() == "recipient" {
				recipients++
				if rh.GetSkipIfAbsent() {
					t.Errorf("%s rate_limits[%d].actions[%d]: recipient is skip_if_absent", where, i, j)
				}
			}
		}
		if recipients != 1 {
			t.Errorf("%s rate_limits[%d]: %d recipient actions, want 1", where, i, recipients)
		}
	}
}

// TestBootstrapDecodesStrictly: envoy.yaml decodes into the Envoy v3
// Bootstrap with unknown fields refused (in typed_config Anys too) and
// validates; and the decoder really is strict: a misspelt field, a
// duplicate key or an out-of-range value in a copy of the file fails.
func TestBootstrapDecodesStrictly(t *testing.T) {
	src, err := os.ReadFile(bootstrapFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadBootstrap(src); err != nil {
		t.Fatalf("%s: %v", bootstrapFile, err)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"misspelt field in an Any", "failure_mode_deny: true", "failure_mode_denied: true"},
		{"misspelt route field", "skip_if_absent: true", "skip_if_missing: true"},
		{"duplicate key", "domain: default", "domain: default\n                      domain: default"},
		{"invalid value", "port_value: 7070", "port_value: 70700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(string(src), tc.old, tc.new, 1)
			if bad == string(src) {
				t.Fatalf("%q is not in %s", tc.old, bootstrapFile)
			}
			if _, err := loadBootstrap([]byte(bad)); err == nil {
				t.Fatalf("%s with %q decodes", bootstrapFile, tc.new)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
}

// TestBootstrapLimitsThroughFreqring: every HTTP connection manager of
// envoy.yaml runs the rate limit filter before the router, configured for
// freqring, calling a cluster of the bootstrap that reaches freqring's gRPC
// port over HTTP/2; every route goes to a defined cluster and carries
// descriptors that freqring reads.
func TestBootstrapLimitsThroughFreqring(t *testing.T) {
	src, err := os.ReadFile(bootstrapFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadBootstrap(src)
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	hcms := 0
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if f.GetName() != hcmFilter {
					continue
				}
				hcms++
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatalf("listener %s: %v", l.GetName(), err)
				}
				names := []string{}
				for _, hf := range hcm.GetHttpFilters() {
					names = append(names, hf.GetName())
				}
				rli, ri := slices.Index(names, ratelimitFilter), slices.Index(names, routerFilter)
				if rli < 0 || ri != len(names)-1 || rli > ri {
					t.Fatalf("listener %s: http filters %v, want %s before %s (last)", l.GetName(), names, ratelimitFilter, routerFilter)
				}
				var router routerv3.Router
				if err := hcm.GetHttpFilters()[ri].GetTypedConfig().UnmarshalTo(&router); err != nil {
					t.Errorf("listener %s: router: %v", l.GetName(), err)
				}
				rl := checkRateLimitFilter(t, hcm.GetHttpFilters()[rli])
				name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
				c, ok := clusters[name]
				if !ok {
					t.Fatalf("listener %s: rate limit cluster %q is not defined", l.GetName(), name)
				}
				checkFreqringCluster(t, c, "freqring")

				if hcm.GetRouteConfig() == nil {
					t.Fatalf("listener %s: no inline route_config", l.GetName())
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						where := fmt.Sprintf("listener %s vhost %s route %v", l.GetName(), vh.GetName(), r.GetMatch())
						if _, ok := clusters[r.GetRoute().GetCluster()]; !ok {
							t.Errorf("%s: cluster %q is not defined", where, r.GetRoute().GetCluster())
						}
						checkRateLimits(t, where, append(r.GetRoute().GetRateLimits(), vh.GetRateLimits()...), rl)
					}
				}
			}
		}
	}
	if hcms == 0 {
		t.Fatal("no http_connection_manager in", bootstrapFile)
	}
}

// TestEnvoyFilterDecodesStrictly: istio-envoyfilter.yaml is one Istio
// EnvoyFilter with no unknown key, and each patch value decodes strictly
// into the Envoy type its applyTo names and validates; a misspelt field in
// a patch value or in the Istio part of a copy fails.
func TestEnvoyFilterDecodesStrictly(t *testing.T) {
	src, err := os.ReadFile(envoyFilterFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := loadEnvoyFilter(src); err != nil {
		t.Fatalf("%s: %v", envoyFilterFile, err)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"misspelt field in an Any", "failure_mode_deny: true", "failure_mode_denied: true"},
		{"misspelt cluster field", "lb_policy: ROUND_ROBIN", "lb_polcy: ROUND_ROBIN"},
		{"misspelt vhost field", "descriptor_key: recipient", "descriptor: recipient"},
		{"misspelt Istio match", "subFilter:", "subfilter:"},
		{"unknown top-level key", "kind: EnvoyFilter", "kind: EnvoyFilter\nstatus: {}"},
		{"invalid value", "port_value: 7070", "port_value: 70700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(string(src), tc.old, tc.new, 1)
			if bad == string(src) {
				t.Fatalf("%q is not in %s", tc.old, envoyFilterFile)
			}
			if _, _, err := loadEnvoyFilter([]byte(bad)); err == nil {
				t.Fatalf("%s with %q decodes", envoyFilterFile, tc.new)
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
}

// TestEnvoyFilterLimitsThroughFreqring: the EnvoyFilter inserts the same
// rate limit filter before the router, adds the cluster it calls (HTTP/2 to
// the freqring Service's gRPC port, in one explicit context so Istio adds it
// once), and merges descriptors that freqring reads, all on the sidecar's
// inbound side of the selected workload.
func TestEnvoyFilterLimitsThroughFreqring(t *testing.T) {
	src, err := os.ReadFile(envoyFilterFile)
	if err != nil {
		t.Fatal(err)
	}
	ef, patches, err := loadEnvoyFilter(src)
	if err != nil {
		t.Fatal(err)
	}
	if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" {
		t.Fatalf("%s/%s, want networking.istio.io/v1alpha3/EnvoyFilter", ef.APIVersion, ef.Kind)
	}
	if len(ef.Spec.WorkloadSelector.Labels) == 0 {
		t.Error("no workloadSelector: the filter would apply to every workload of the namespace")
	}
	var (
		rl       *ratelimitv3.RateLimit
		clusters = map[string]*clusterv3.Cluster{}
		limits   int
	)
	for _, p := range patches {
		if p.Match.Context != "SIDECAR_INBOUND" {
			t.Errorf("%s patch: context %q, want SIDECAR_INBOUND", p.ApplyTo, p.Match.Context)
		}
		switch {
		case p.filter != nil:
			if p.Patch.Operation != "INSERT_BEFORE" || p.Match.Listener.FilterChain.Filter.Name != hcmFilter ||
				p.Match.Listener.FilterChain.Filter.SubFilter.Name != routerFilter {
				t.Errorf("HTTP_FILTER patch: %s relative to %q in %q, want INSERT_BEFORE %s in %s", p.Patch.Operation,
					p.Match.Listener.FilterChain.Filter.SubFilter.Name, p.Match.Listener.FilterChain.Filter.Name, routerFilter, hcmFilter)
			}
			if rl != nil {
				t.Error("two rate limit filters")
			}
			rl = checkRateLimitFilter(t, p.filter)
		case p.cluster != nil:
			if p.Patch.Operation != "ADD" {
				t.Errorf("CLUSTER patch: operation %s, want ADD", p.Patch.Operation)
			}
			clusters[p.cluster.GetName()] = p.cluster
		case p.vhost != nil, p.route != nil:
			if p.Patch.Operation != "MERGE" {
				t.Errorf("%s patch: operation %s, want MERGE", p.ApplyTo, p.Patch.Operation)
			}
			limits++
		}
	}
	if rl == nil || limits == 0 {
		t.Fatalf("want an HTTP_FILTER patch and a VIRTUAL_HOST or HTTP_ROUTE patch; have filter %v, %d route patches", rl != nil, limits)
	}
	name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c, ok := clusters[name]
	if !ok {
		t.Fatalf("rate limit cluster %q is not added by the EnvoyFilter", name)
	}
	host := ""
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, ep := range le.GetLbEndpoints() {
			host = ep.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
		}
	}
	if ns, ok := strings.CutPrefix(host, "freqring."); !ok || !strings.HasSuffix(ns, ".svc.cluster.local") {
		t.Errorf("rate limit cluster host %q, want freqring.<namespace>.svc.cluster.local", host)
	}
	checkFreqringCluster(t, c, host)
	for _, p := range patches {
		switch {
		case p.vhost != nil:
			checkRateLimits(t, "VIRTUAL_HOST patch", p.vhost.GetRateLimits(), rl)
		case p.route != nil:
			checkRateLimits(t, "HTTP_ROUTE patch", p.route.GetRoute().GetRateLimits(), rl)
		}
	}
}

// checkTranslates sends the descriptor Envoy builds from r's request_headers
// actions (every header present) to freqring's RLS on the embedded default
// rules under domain, and wants it limited: one item for the recipient, in
// freqring domain default, with the content and a request id.
func checkTranslates(t *testing.T, where, domain string, r *routev3.RateLimit) {
	t.Helper()
	d := &commonv3.RateLimitDescriptor{}
	for _, a := range r.GetActions() {
		if rh := a.GetRequestHeaders(); rh != nil {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: "value of " + rh.GetHeaderName()})
		}
	}
	var got *pb.CheckRequest
	rls, err := gateway.NewRLS(gateway.RLSConfig{Rules: rules.Default, Checker: checkFunc(func(req *pb.CheckRequest) *pb.CheckResponse {
		got = req
		n := len(req.Recipients)
		return &pb.CheckResponse{Admitted: make([]bool, n), Recorded: make([]bool, n), DeniedBy: make([]int32, n), RetryAfterMs: make([]int64, n),
			DecidedAtMs: make([]int64, n), RuleCounts: make([]uint32, n)}
	})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{d}}); err != nil {
		t.Errorf("%s: freqring refuses the descriptor %v: %v", where, d, err)
		return
	}
	if got == nil || len(got.Recipients) != 1 || got.Domains[0] != "default" || !strings.HasPrefix(got.Recipients[0], "value of ") ||
		!strings.HasPrefix(string(got.Contents[0]), "value of ") || len(got.RequestIds) != 1 || got.RequestIds[0] == 0 {
		t.Errorf("%s: descriptor %v became %v; want one item with recipient, content and request id", where, d, got)
	}
}

// checkFunc is a gateway.Checker.
type checkFunc func(*pb.CheckRequest) *pb.CheckResponse

func (f checkFunc) Check(_ context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return f(req), nil
}
