// Package monitoring tests the monitoring the operator ships: the
// PrometheusRule's groups pass `promtool check rules` and `promtool test
// rules` (Debian's prometheus package, installed by
// test/tools/install-packages.sh), every alert has a firing unit test and a
// runbook section in docs/operations.md, and the kustomize component builds
// on the production overlay with a ServiceMonitor that selects the metrics
// Service. The dashboard's PromQL is parsed in the module test/promql.
package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

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
	assert.Equal(t, 5, alerts, "not Ready, fail-open, webhook errors, cascade storm, IndexSynced")
}

// TestComponentOnProductionOverlay builds an overlay that adds the
// component to the production overlay: a ServiceMonitor whose selector
// matches the metrics Service (and no other Service) on a port it has.
func TestComponentOnProductionOverlay(t *testing.T) {
	dir := t.TempDir()
	abs := func(p string) string { a, err := filepath.Abs(p); require.NoError(t, err); return a }
	rel := func(p string) string { r, err := filepath.Rel(dir, abs(p)); require.NoError(t, err); return r }
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(
		"resources: ["+rel("../../kustomize/overlays/production")+"]\ncomponents: ["+rel(component)+"]\n"), 0o600))
	objs, err := manifests.Build(dir)
	require.NoError(t, err)
	var selector map[string]string
	var port string
	services := map[string]map[string]string{}
	servicePorts := map[string][]string{}
	var rule bool
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceMonitor":
			assert.Equal(t, "inferencecache-system", o.GetNamespace())
			m, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			selector = m
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			port, _ = eps[0].(map[string]any)["port"].(string)
		case "PrometheusRule":
			rule = true
			assert.Equal(t, "inferencecache-system", o.GetNamespace())
		case "Service":
			services[o.GetName()] = o.GetLabels()
			ps, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			for _, p := range ps {
				servicePorts[o.GetName()] = append(servicePorts[o.GetName()], p.(map[string]any)["name"].(string))
			}
		}
	}
	require.NotNil(t, selector, "a ServiceMonitor")
	assert.True(t, rule, "a PrometheusRule")
	var matched []string
	for name, labels := range services {
		ok := true
		for k, v := range selector {
			ok = ok && labels[k] == v
		}
		if ok {
			matched = append(matched, name)
		}
	}
	assert.Equal(t, []string{"inferencecache-operator-metrics"}, matched)
	assert.Contains(t, servicePorts["inferencecache-operator-metrics"], port)
}
