// Package promql parses every PromQL query the project ships with
// Prometheus' own parser: the Grafana dashboard's panel queries and the
// PrometheusRule's expressions. It is a module of its own so that
// Prometheus' dependency graph stays out of the operator's go.mod.
package promql

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// grafanaVariables replaces the dashboard's template variables by values
// Grafana could give them, so that the query is what Prometheus receives.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$namespace", "default|ml",
)

// promQL is the parser with the default options (stable functions only).
var promQL = parser.NewParser(parser.Options{})

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func TestDashboardQueriesParse(t *testing.T) {
	raw, err := os.ReadFile("../../docs/monitoring/inferencecache-operator.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	var n int
	metrics := map[string]bool{}
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has a query", p.Title)
		for _, target := range p.Targets {
			q := grafanaVariables.Replace(target.Expr)
			assert.NotContains(t, q, "$", "panel %q: a template variable the test does not know", p.Title)
			expr, err := promQL.ParseExpr(q)
			if !assert.NoError(t, err, "panel %q: %s", p.Title, q) {
				continue
			}
			for _, vs := range parser.ExtractSelectors(expr) {
				for _, m := range vs {
					if m.Name == "__name__" {
						metrics[m.Value] = true
					}
				}
			}
			n++
		}
	}
	assert.GreaterOrEqual(t, n, 10)
	// The operator's own metrics are all on the dashboard.
	for _, m := range []string{
		"inferencecache_cachebackend_condition", "inferencecache_build_info",
		"inferencecache_webhook_decisions_total", "inferencecache_restart_cascades_total",
		"inferencecache_functional_probes_total",
		"inferencecache_cachebackend_engine_pods", "inferencecache_webhook_certificate_expiry_timestamp_seconds",
		// The index's participation and lag (issue 24).
		"inferencecache_index_streams", "inferencecache_index_deltas_total",
		"inferencecache_kvevents_forward_connected", "inferencecache_kvevents_event_lag_seconds_bucket",
		"inferencecache_kvevents_forward_journal_depth",
	} {
		assert.True(t, metrics[m], "the dashboard shows %s", m)
	}
}

func TestAlertExpressionsParse(t *testing.T) {
	raw, err := os.ReadFile("../../kustomize/components/monitoring/prometheusrule.yaml")
	require.NoError(t, err)
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &pr))
	var n int
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			_, err := promQL.ParseExpr(r.Expr)
			assert.NoError(t, err, "%s: %s", r.Alert, r.Expr)
			n++
		}
	}
	assert.Positive(t, n)
}
