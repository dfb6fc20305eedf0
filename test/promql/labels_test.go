package promql

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// A scrape job of the monitoring component: which monitor scrapes a
// series, and so which labels the stored series has.
type job struct {
	monitorFile string // in kustomize/components/monitoring
	kind, name  string
}

// jobs maps the sections of testdata/series.json (written from the
// metrics' descriptors by test/monitoring's TestSeriesLabelsFile) to the
// monitor that scrapes them. controller-runtime's series are the
// manager's.
var jobs = map[string]job{
	"manager":            {"servicemonitor.yaml", "ServiceMonitor", "inferencecache-operator"},
	"controller-runtime": {"servicemonitor.yaml", "ServiceMonitor", "inferencecache-operator"},
	"index":              {"podmonitors.yaml", "PodMonitor", "inferencecache-index"},
	"kvevents":           {"podmonitors.yaml", "PodMonitor", "inferencecache-kvevents"},
}

// targetLabels are the labels the Prometheus Operator gives a monitor's
// targets (and so every series scraped from them, and up).
func targetLabels(kind string) []string {
	l := []string{"job", "instance", "namespace", "pod", "container", "endpoint"}
	if kind == "ServiceMonitor" {
		l = append(l, "service")
	}
	return l
}

// honorLabels reads the first endpoint's honorLabels of the named monitor.
func honorLabels(t *testing.T, j job) bool {
	t.Helper()
	raw, err := os.ReadFile("../../kustomize/components/monitoring/" + j.monitorFile)
	require.NoError(t, err)
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Endpoints []struct {
					HonorLabels bool `json:"honorLabels"`
				} `json:"endpoints"`
				PodMetricsEndpoints []struct {
					HonorLabels bool `json:"honorLabels"`
				} `json:"podMetricsEndpoints"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &m))
		if m.Kind != j.kind || m.Metadata.Name != j.name {
			continue
		}
		eps := append(m.Spec.Endpoints, m.Spec.PodMetricsEndpoints...)
		require.Len(t, eps, 1, "%s %s", j.kind, j.name)
		return eps[0].HonorLabels
	}
	t.Fatalf("no %s %s in %s", j.kind, j.name, j.monitorFile)
	return false
}

// stored is, per series name, the labels Prometheus stores with it, and
// the series' own labels the scrape replaced (renamed exported_<name>:
// a target label of the same name, without honorLabels).
type stored struct {
	labels   map[string]bool
	replaced map[string]bool
}

// storedLabels builds the table from testdata/series.json and the monitors.
func storedLabels(t *testing.T, series map[string]map[string][]string) map[string]stored {
	t.Helper()
	out := map[string]stored{}
	upLabels := map[string]bool{}
	for section, metrics := range series {
		j, ok := jobs[section]
		require.True(t, ok, "testdata/series.json: section %q has no monitor", section)
		honor := honorLabels(t, j)
		targets := targetLabels(j.kind)
		for _, l := range targets {
			upLabels[l] = true
		}
		for name, own := range metrics {
			s := stored{labels: map[string]bool{}, replaced: map[string]bool{}}
			for _, l := range targets {
				s.labels[l] = true
			}
			for _, l := range own {
				if !honor && slices.Contains(targets, l) {
					s.replaced[l] = true
					s.labels["exported_"+l] = true
					continue
				}
				s.labels[l] = true
			}
			out[name] = s
		}
	}
	// up is the scrape's own series: target labels only.
	out["up"] = stored{labels: upLabels, replaced: map[string]bool{}}
	return out
}

// checkLabels reports each label a matcher or a grouping of expr names
// that the series it applies to do not carry after the scrape.
func checkLabels(expr parser.Expr, table map[string]stored) []string {
	var problems []string
	// names returns the series names a subtree selects.
	names := func(n parser.Node) []string {
		var out []string
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				out = append(out, vs.Name)
			}
			return nil
		})
		return out
	}
	carried := func(series []string, label string) bool {
		for _, s := range series {
			// A replaced label is the target's: grouping by it merges
			// the series' own values.
			if table[s].labels[label] && !table[s].replaced[label] {
				return true
			}
		}
		return false
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			s, ok := table[n.Name]
			if !ok {
				problems = append(problems, fmt.Sprintf("series %q is in no section of testdata/series.json", n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				switch {
				case m.Name == "__name__":
				case s.replaced[m.Name]:
					problems = append(problems, fmt.Sprintf("%s: matcher on %q, which the scrape replaces by the target's (set honorLabels)", n.Name, m.Name))
				case !s.labels[m.Name]:
					problems = append(problems, fmt.Sprintf("%s: matcher on %q, a label its series do not carry (%v)", n.Name, m.Name, slices.Sorted(maps.Keys(s.labels))))
				}
			}
		case *parser.AggregateExpr:
			if n.Without {
				return nil
			}
			series := names(n.Expr)
			for _, l := range n.Grouping {
				if !carried(series, l) {
					problems = append(problems, fmt.Sprintf("%s by (%s): no series of %v carries %q", n.Op, strings.Join(n.Grouping, ", "), series, l))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching == nil || !n.VectorMatching.On {
				return nil
			}
			series := names(n)
			for _, l := range n.VectorMatching.MatchingLabels {
				if !carried(series, l) {
					problems = append(problems, fmt.Sprintf("on (%s): no series of %v carries %q", strings.Join(n.VectorMatching.MatchingLabels, ", "), series, l))
				}
			}
		}
		return nil
	})
	return problems
}

func loadTable(t *testing.T) map[string]stored {
	t.Helper()
	raw, err := os.ReadFile("testdata/series.json")
	require.NoError(t, err)
	var series map[string]map[string][]string
	require.NoError(t, json.Unmarshal(raw, &series))
	return storedLabels(t, series)
}

// allQueries is every alert's expression and every dashboard query (with
// Grafana's variables replaced), by where it is.
func allQueries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
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
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	raw, err = os.ReadFile("../../docs/monitoring/inferencecache-operator.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	for _, p := range d.Panels {
		for i, target := range p.Targets {
			out[fmt.Sprintf("panel %q query %d", p.Title, i)] = grafanaVariables.Replace(target.Expr)
		}
	}
	return out
}

// TestQueriesMatchLabelsTheScrapeKeeps: every label a matcher, a grouping
// or an on() of the alerts and of the dashboard names is one the series
// carry once scraped by the component's monitors: their own labels (kept
// under their own name only where the monitor honours them, else renamed
// exported_<name> when a target label has the name) and the target labels
// the Prometheus Operator adds.
func TestQueriesMatchLabelsTheScrapeKeeps(t *testing.T) {
	table := loadTable(t)
	queries := allQueries(t)
	require.Greater(t, len(queries), 30)
	for _, what := range slices.Sorted(maps.Keys(queries)) {
		expr, err := promQL.ParseExpr(queries[what])
		require.NoError(t, err, "%s: %s", what, queries[what])
		for _, p := range checkLabels(expr, table) {
			t.Errorf("%s: %s", what, p)
		}
	}
}

// TestCheckLabelsCatches: the check flags a label no series carries, a
// namespace the scrape replaces (no honorLabels), a grouping on a label
// the aggregated series lack and an unknown series; it passes target
// labels and honoured ones.
func TestCheckLabelsCatches(t *testing.T) {
	table := loadTable(t)
	for _, tc := range []struct {
		expr string
		want string // "" when the expression is fine
	}{
		{`inferencecache_cachebackend_condition{namespace="ml",name="a"}`, ""},
		{`max by (namespace, pod) (inferencecache_kvevents_forward_journal_depth{namespace="ml"})`, ""},
		{`up{job="inferencecache-operator-metrics"}`, ""},
		{`inferencecache_cachebackend_condition{cachebackend="a"}`, `matcher on "cachebackend"`},
		{`sum by (name) (inferencecache_kvevents_forward_journal_depth)`, `carries "name"`},
		{`inferencecache_no_such_series`, `in no section`},
		{`x_total * on (name) inferencecache_index_streams`, `in no section`},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			expr, err := promQL.ParseExpr(tc.expr)
			require.NoError(t, err)
			got := strings.Join(checkLabels(expr, table), "; ")
			if tc.want == "" {
				assert.Empty(t, got)
			} else {
				assert.Contains(t, got, tc.want)
			}
		})
	}

	// A series with its own namespace, scraped without honorLabels.
	replaced := storedLabels(t, map[string]map[string][]string{"kvevents": {"backend_series": {"namespace", "name"}}})
	expr, err := promQL.ParseExpr(`backend_series{namespace="ml"}`)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(checkLabels(expr, replaced), "; "), "replaces by the target's")
	grouped, err := promQL.ParseExpr(`max by (namespace, name) (backend_series)`)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(checkLabels(grouped, replaced), "; "), `carries "namespace"`)
	assert.Empty(t, checkLabels(grouped, storedLabels(t, map[string]map[string][]string{"manager": {"backend_series": {"namespace", "name"}}})))
	honoured := storedLabels(t, map[string]map[string][]string{"manager": {"backend_series": {"namespace", "name"}}})
	assert.Empty(t, checkLabels(expr, honoured))
}
