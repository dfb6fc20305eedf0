package monitoring

import (
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/kvevent/subscriber"
	"github.com/inferencecache/operator/internal/kvindex/indexmetrics"
	"github.com/inferencecache/operator/internal/metrics"
	"github.com/inferencecache/operator/internal/webhook/podmutation"
)

// seriesFile is the label names of the series each scrape job's metrics
// carry before the scrape adds its target labels, read by test/promql
// (its own module, which cannot import the operator's packages) to check
// that every label the alerts and the dashboard match on survives the
// scrape. The jobs manager, index and kvevents are checked against the
// metrics' own descriptors here; controller-runtime is kept by hand.
const seriesFile = "../promql/testdata/series.json"

// updateSeries rewrites the checked jobs of seriesFile (go test
// ./test/monitoring -run TestSeriesLabelsFile -update-series).
var updateSeries = flag.Bool("update-series", false, "rewrite "+seriesFile+" from the metrics' descriptors")

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), .*variableLabels: \{([^}]*)\}\}$`)

// labelsOf returns the series names and label names the collectors
// expose (a histogram's _bucket with le, _sum and _count).
func labelsOf(t *testing.T, cs ...prometheus.Collector) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, c := range cs {
		_, histogram := c.(prometheus.Histogram)
		if _, ok := c.(*prometheus.HistogramVec); ok {
			histogram = true
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descRE.FindStringSubmatch(d.String())
			require.NotNil(t, m, "descriptor %s", d)
			name, err := strconv.Unquote(m[1])
			require.NoError(t, err)
			labels := []string{}
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			slices.Sort(labels)
			if !histogram {
				out[name] = labels
				continue
			}
			out[name+"_bucket"] = slices.Sorted(slices.Values(append(slices.Clone(labels), "le")))
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		}
	}
	return out
}

// TestSeriesLabelsFile: test/promql's table of each job's series and
// their own labels is what the manager, the index and the sidecar export.
func TestSeriesLabelsFile(t *testing.T) {
	index, sidecar := &recorder{}, &recorder{}
	indexmetrics.New(index)
	subscriber.NewMetrics(sidecar)
	want := map[string]map[string][]string{
		"manager": labelsOf(t, &metrics.Collector{}, &metrics.CertificateCollector{}, metrics.APIRequests,
			controller.Cascades, controller.Heals, controller.Evictions, controller.EvictionsForbidden, controller.ProbeResults,
			podmutation.Decisions, podmutation.GuardTrips, podmutation.AdmissionDuration, podmutation.AdmissionWait),
		"index":    labelsOf(t, index.collectors...),
		"kvevents": labelsOf(t, sidecar.collectors...),
	}
	require.Contains(t, want["manager"], metrics.EnginePodsName)
	require.Contains(t, want["kvevents"], "inferencecache_kvevents_event_lag_seconds_bucket")

	raw, err := os.ReadFile(seriesFile)
	require.NoError(t, err)
	var got map[string]map[string][]string
	require.NoError(t, json.Unmarshal(raw, &got))
	if *updateSeries {
		for job, series := range want {
			got[job] = series
		}
		out, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(seriesFile, append(out, '\n'), 0o600))
	}
	wantJSON, err := json.MarshalIndent(want, "", "  ")
	require.NoError(t, err)
	for job, series := range want {
		assert.Equal(t, series, got[job], "%s: the series of job %s (want, for the file:\n%s)", seriesFile, job, wantJSON)
	}
	assert.NotEmpty(t, got["controller-runtime"], "the controller-runtime series the alerts and the dashboard use")
}
