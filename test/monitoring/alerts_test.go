// Package monitoring tests the monitoring the operator ships: the
// PrometheusRule's groups pass `promtool check rules` and `promtool test
// rules` (Debian's prometheus package, installed by
// test/tools/install-packages.sh), every alert has a firing unit test and a
// runbook section in docs/operations.md, and the kustomize component builds
// on the production overlay with a ServiceMonitor that selects the metrics
// Service and PodMonitors that select the cache index and the
// kvevent-subscriber sidecars. The dashboard's PromQL is parsed in the
// module test/promql.
package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/inject/injecttest"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/manifests"
)

const (
	ruleFile  = "../../kustomize/components/monitoring/prometheusrule.yaml"
	component = "../../kustomize/components/monitoring"
	promtool  = "/usr/bin/promtool"
)

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	Annotations map[string]string `json:"annotations"`
}

type prometheusRule struct {
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// rules writes the PrometheusRule's spec (a Prometheus rule file) and the
// promtool unit tests next to each other in a temporary folder.
func rules(t *testing.T) (dir string, pr prometheusRule) {
	t.Helper()
	raw, err := os.ReadFile(ruleFile)
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(raw, &struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       any            `json:"spec"`
	}{}))
	require.NoError(t, yaml.Unmarshal(raw, &pr))
	var obj map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &obj))
	spec, err := yaml.Marshal(obj["spec"])
	require.NoError(t, err)
	dir = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o600))
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600))
	return dir, pr
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	_, err := os.Stat(promtool)
	require.NoError(t, err, "promtool comes from Debian's prometheus package: run `make packages` (test/tools/install-packages.sh)")
	cmd := exec.Command(promtool, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	dir, pr := rules(t)
	out := run(t, dir, "check", "rules", "rules.yaml")
	n := 0
	for _, g := range pr.Spec.Groups {
		n += len(g.Rules)
	}
	require.Positive(t, n)
	assert.Contains(t, out, "SUCCESS: "+strconv.Itoa(n)+" rules found")
}

func TestPromtoolTestRules(t *testing.T) {
	dir, _ := rules(t)
	out := run(t, dir, "test", "rules", "alerts_test.yaml")
	assert.Contains(t, out, "SUCCESS")
}

// TestEveryAlertHasAFiringUnitTestAndARunbook: each alert of the rule is
// expected to fire in at least one promtool test case and to stay silent
// in another, and its runbook_url points at a section of
// docs/operations.md that exists.
func TestEveryAlertHasAFiringUnitTestAndARunbook(t *testing.T) {
	_, pr := rules(t)
	raw, err := os.ReadFile("testdata/alerts_test.yaml")
	require.NoError(t, err)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(ops), -1) {
		anchors[strings.ToLower(strings.ReplaceAll(strings.TrimSpace(m[1]), " ", "-"))] = true
	}
	const prefix = "https://github.com/inferencecache/operator/blob/main/docs/operations.md#"
	var alerts int
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			assert.True(t, firing[r.Alert], "%s has a unit test in which it fires", r.Alert)
			assert.True(t, silent[r.Alert], "%s has a unit test in which it stays silent", r.Alert)
			url := r.Annotations["runbook_url"]
			require.True(t, strings.HasPrefix(url, prefix), "%s runbook_url %q", r.Alert, url)
			anchor := strings.TrimPrefix(url, prefix)
			assert.Equal(t, strings.ToLower(r.Alert), anchor, "%s: the runbook section is named after the alert", r.Alert)
			assert.True(t, anchors[anchor], "%s: docs/operations.md has a section #%s", r.Alert, anchor)
		}
	}
	assert.Equal(t, 11, alerts, "not Ready, fail-open, webhook errors, cascade storm, engine eviction forbidden, IndexSynced, "+
		"reconcile errors, operator down, certificate expiry, KV-event lag, index backlog")
}

// componentObjects builds an overlay that adds the component to the
// production overlay.
func componentObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	abs := func(p string) string { a, err := filepath.Abs(p); require.NoError(t, err); return a }
	rel := func(p string) string { r, err := filepath.Rel(dir, abs(p)); require.NoError(t, err); return r }
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(
		"resources: ["+rel("../../kustomize/overlays/production")+"]\ncomponents: ["+rel(component)+"]\n"), 0o600))
	objs, err := manifests.Build(dir)
	require.NoError(t, err)
	return objs
}

// matches reports whether labels satisfy the matchLabels sel (an empty
// selector matches every object, as the Prometheus Operator reads it).
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// monitor is what a ServiceMonitor or PodMonitor selects.
type monitor struct {
	selector         map[string]string
	selectorPresent  bool
	anyNamespace     bool
	namespaces       []string
	ports            []string
	honorLabels      []bool
	matchExpressions bool
}

func monitorOf(t *testing.T, o *unstructured.Unstructured, endpoints string) monitor {
	t.Helper()
	var m monitor
	m.selector, _, _ = unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
	_, m.selectorPresent, _ = unstructured.NestedFieldNoCopy(o.Object, "spec", "selector")
	_, m.matchExpressions, _ = unstructured.NestedSlice(o.Object, "spec", "selector", "matchExpressions")
	m.anyNamespace, _, _ = unstructured.NestedBool(o.Object, "spec", "namespaceSelector", "any")
	m.namespaces, _, _ = unstructured.NestedStringSlice(o.Object, "spec", "namespaceSelector", "matchNames")
	eps, _, _ := unstructured.NestedSlice(o.Object, "spec", endpoints)
	for _, e := range eps {
		ep := e.(map[string]any)
		port, _ := ep["port"].(string)
		honor, _ := ep["honorLabels"].(bool)
		m.ports = append(m.ports, port)
		m.honorLabels = append(m.honorLabels, honor)
	}
	return m
}

// TestComponentOnProductionOverlay: the component on the production
// overlay has a PrometheusRule, a ServiceMonitor whose selector matches
// the metrics Service (and no other Service) on a port it has, a
// PodMonitor that matches the cache index's pods (and no other workload of
// the bundle) on their metrics port, and a PodMonitor for the
// kvevent-subscriber sidecars, in every namespace, on the port the webhook
// gives the sidecar. Only the manager's endpoint honours the series'
// labels: the others carry no namespace of their own.
func TestComponentOnProductionOverlay(t *testing.T) {
	objs := componentObjects(t)
	var rule bool
	serviceMonitors, podMonitors := map[string]monitor{}, map[string]monitor{}
	services := map[string]map[string]string{}
	servicePorts := map[string][]string{}
	podLabels := map[string]map[string]string{} // workload -> pod template labels
	podPorts := map[string][]string{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceMonitor":
			assert.Equal(t, "inferencecache-system", o.GetNamespace())
			serviceMonitors[o.GetName()] = monitorOf(t, o, "endpoints")
		case "PodMonitor":
			assert.Equal(t, "inferencecache-system", o.GetNamespace())
			podMonitors[o.GetName()] = monitorOf(t, o, "podMetricsEndpoints")
		case "PrometheusRule":
			rule = true
			assert.Equal(t, "inferencecache-system", o.GetNamespace())
		case "Service":
			services[o.GetName()] = o.GetLabels()
			ps, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			for _, p := range ps {
				servicePorts[o.GetName()] = append(servicePorts[o.GetName()], p.(map[string]any)["name"].(string))
			}
		case "Deployment", "StatefulSet", "DaemonSet":
			key := o.GetKind() + "/" + o.GetName()
			podLabels[key], _, _ = unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			for _, list := range []string{"containers", "initContainers"} {
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", list)
				for _, c := range cs {
					ps, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
					for _, p := range ps {
						podPorts[key] = append(podPorts[key], p.(map[string]any)["name"].(string))
					}
				}
			}
		}
	}
	assert.True(t, rule, "a PrometheusRule")
	require.Len(t, serviceMonitors, 1)
	require.Len(t, podMonitors, 3)

	// The manager's metrics Service.
	sm, ok := serviceMonitors["inferencecache-operator"]
	require.True(t, ok, "ServiceMonitor inferencecache-operator")
	require.NotEmpty(t, sm.selector)
	var matched []string
	for name, labels := range services {
		if matches(sm.selector, labels) {
			matched = append(matched, name)
		}
	}
	assert.Equal(t, []string{"inferencecache-operator-metrics"}, matched)
	require.Len(t, sm.ports, 1)
	assert.Contains(t, servicePorts["inferencecache-operator-metrics"], sm.ports[0])
	assert.Equal(t, []bool{true}, sm.honorLabels, "the manager's series carry each CacheBackend's namespace")

	// The cache index's pods, on the port that serves /metrics
	// (cmd/cache-index: --health-probe-bind-address, port `health`).
	idx, ok := podMonitors["inferencecache-index"]
	require.True(t, ok, "PodMonitor inferencecache-index")
	require.NotEmpty(t, idx.selector)
	assert.False(t, idx.anyNamespace, "the index runs in the monitor's own namespace")
	assert.Empty(t, idx.namespaces)
	matched = nil
	for key, labels := range podLabels {
		if matches(idx.selector, labels) {
			matched = append(matched, key)
		}
	}
	assert.Equal(t, []string{"Deployment/inferencecache-index"}, matched)
	require.Len(t, idx.ports, 1)
	assert.Equal(t, "health", idx.ports[0], "cache-index serves /metrics beside /healthz")
	assert.Contains(t, podPorts["Deployment/inferencecache-index"], idx.ports[0])
	assert.Equal(t, []bool{false}, idx.honorLabels)

	// The sidecars the webhook adds to engine pods of any namespace.
	sc, ok := podMonitors["inferencecache-kvevents"]
	require.True(t, ok, "PodMonitor inferencecache-kvevents")
	assert.True(t, sc.anyNamespace, "engine pods live in the users' namespaces")
	assert.True(t, sc.selectorPresent, "a selector (the Prometheus Operator requires one)")
	assert.False(t, sc.matchExpressions)
	wired := wiredEnginePod(t)
	assert.True(t, matches(sc.selector, wired.Labels), "the selector %v matches a wired engine pod's labels %v", sc.selector, wired.Labels)
	require.Len(t, sc.ports, 1)
	var sidecarPorts []string
	for _, c := range wired.Spec.InitContainers {
		if c.Name == inject.SubscriberContainer {
			for _, p := range c.Ports {
				sidecarPorts = append(sidecarPorts, p.Name)
			}
		}
	}
	require.NotEmpty(t, sidecarPorts, "the webhook added the %s sidecar with a port", inject.SubscriberContainer)
	assert.Contains(t, sidecarPorts, sc.ports[0])
	for key, ports := range podPorts {
		assert.NotContains(t, ports, sc.ports[0], "%s of the bundle has no port the sidecar monitor would scrape", key)
	}
	assert.Equal(t, []bool{false}, sc.honorLabels, "the sidecar's series carry no namespace: the engine pod's is kept")

	// The multiprocess servers of every namespace, on their HTTP port
	// (test/conformance checks that the real server serves its series
	// there); the in-process servers match the selector but have no port
	// of that name, so they give no target.
	mp, ok := podMonitors["inferencecache-lmcache-mp"]
	require.True(t, ok, "PodMonitor inferencecache-lmcache-mp")
	assert.True(t, mp.anyNamespace, "CacheBackends live in the users' namespaces")
	require.NotEmpty(t, mp.selector)
	require.Len(t, mp.ports, 1)
	assert.Equal(t, render.MPHTTPPortName, mp.ports[0])
	assert.Equal(t, []bool{false}, mp.honorLabels, "the server's series carry no namespace: the CacheBackend's is kept")
	cb := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Multiprocess = &v1alpha1.Multiprocess{Port: 5555, HTTPPort: 8080, L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("4Gi")}}
	})
	ds := render.MPDaemonSet(&cb, render.MPServerFor(&cb))
	assert.True(t, matches(mp.selector, ds.Spec.Template.Labels), "the selector %v matches the MP server pods' labels %v", mp.selector, ds.Spec.Template.Labels)
	assert.Contains(t, portNames(ds.Spec.Template.Spec), mp.ports[0], "the metrics-gate sidecar serves the server's /metrics on it")
	plain := injecttest.Backend("cache")
	inProcess := render.Render(&plain).Deployment
	assert.True(t, matches(mp.selector, inProcess.Spec.Template.Labels), "the in-process server pods match too")
	assert.NotContains(t, portNames(inProcess.Spec.Template.Spec), mp.ports[0], "but give no target")
	for key, labels := range podLabels {
		assert.False(t, matches(mp.selector, labels), "%s of the bundle is no MP server", key)
	}
}

// portNames lists the names of the ports of a pod's containers and init
// containers (native sidecars serve on theirs).
func portNames(spec *corev1ac.PodSpecApplyConfiguration) []string {
	var out []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, p := range c.Ports {
			if p.Name != nil {
				out = append(out, *p.Name)
			}
		}
	}
	return out
}

// wiredEnginePod is an engine pod as the webhook wires it for a backend
// with spec.observation: with the kvevent-subscriber sidecar.
func wiredEnginePod(t *testing.T) *corev1.Pod {
	t.Helper()
	cb := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Observation = &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"}
	})
	d := inject.Decide(injecttest.EnginePod(), []v1alpha1.CacheBackend{cb}, inject.Options{KVEventSubscriberImage: "inferencecache/kvevent-subscriber:test"})
	require.Equal(t, inject.Injected, d.Outcome, d.Message)
	return d.Pod
}

// TestAlertsNameWhatTheManagerRuns: the reconcile-error alert matches
// exactly the controllers the manager registers (Named in
// internal/controller), and the operator-down alert's job is the Service
// the ServiceMonitor selects (the Prometheus Operator names the job after
// it).
func TestAlertsNameWhatTheManagerRuns(t *testing.T) {
	_, pr := rules(t)
	exprs := map[string]string{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}

	files, err := filepath.Glob("../../internal/controller/*.go")
	require.NoError(t, err)
	var controllers []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`\bNamed\("([^"]+)"\)`).FindAllStringSubmatch(string(src), -1) {
			controllers = append(controllers, m[1])
		}
	}
	require.NotEmpty(t, controllers)
	m := regexp.MustCompile(`controller=~"([^"]+)"`).FindStringSubmatch(exprs["InferenceCacheReconcileErrors"])
	require.NotNil(t, m, "InferenceCacheReconcileErrors matches controllers by name: %s", exprs["InferenceCacheReconcileErrors"])
	assert.ElementsMatch(t, controllers, strings.Split(m[1], "|"))

	var service string
	var selector map[string]string
	objs := componentObjects(t)
	for _, o := range objs {
		if o.GetKind() == "ServiceMonitor" {
			selector, _, _ = unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		}
	}
	require.NotEmpty(t, selector)
	for _, o := range objs {
		if o.GetKind() == "Service" && matches(selector, o.GetLabels()) {
			service = o.GetName()
		}
	}
	require.NotEmpty(t, service)
	assert.Contains(t, exprs["InferenceCacheOperatorDown"], `up{job="`+service+`"}`)
}
