package monitoring

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/inferencecache/operator/internal/metrics"
)

const prometheusBin = "/usr/bin/prometheus"

// serviceMonitorHonorLabels builds the component on the production overlay
// and returns its one endpoint's honorLabels.
func serviceMonitorHonorLabels(t *testing.T) bool {
	t.Helper()
	for _, o := range componentObjects(t) {
		if o.GetKind() == "ServiceMonitor" {
			eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			require.Len(t, eps, 1)
			honor, _ := eps[0].(map[string]any)["honorLabels"].(bool)
			return honor
		}
	}
	t.Fatal("no ServiceMonitor in the monitoring component")
	return false
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// scrape runs a real Prometheus scraping a manager-shaped /metrics once
// with honor_labels as given and the target labels the Prometheus
// Operator gives a ServiceMonitor's targets (namespace, service, pod,
// container, endpoint: the metrics Service's, in the operator's
// namespace), and returns the labels of the condition series it stored.
func scrape(t *testing.T, honorLabels bool) map[string]string {
	t.Helper()
	_, err := os.Stat(prometheusBin)
	require.NoError(t, err, "prometheus comes from Debian's prometheus package: run `make packages` (test/tools/install-packages.sh)")
	target := &http.Server{Addr: freeAddr(t), ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE %s gauge\n%s{namespace=\"team-a\",name=\"cache\",type=\"Ready\",status=\"True\"} 1\n", metrics.ConditionName, metrics.ConditionName)
	})}
	l, err := net.Listen("tcp", target.Addr)
	require.NoError(t, err)
	go func() { _ = target.Serve(l) }()
	defer target.Close()

	dir := t.TempDir()
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: serviceMonitor/inferencecache-system/inferencecache-operator/0
    honor_labels: %t
    static_configs:
      - targets: [%q]
        labels: {namespace: inferencecache-system, service: inferencecache-operator-metrics, pod: inferencecache-operator-7d4f9-x2k8p, container: manager, endpoint: metrics}
`, honorLabels, target.Addr)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600))
	web := freeAddr(t)
	prom := exec.Command(prometheusBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	prom.Dir = dir
	require.NoError(t, prom.Start())
	defer func() { _ = prom.Process.Kill(); _ = prom.Wait() }()

	q := "http://" + web + "/api/v1/query?query=" + url.QueryEscape(metrics.ConditionName)
	var labels map[string]string
	require.Eventually(t, func() bool {
		r, err := http.Get(q) //nolint:noctx // a local query
		if err != nil {
			return false
		}
		defer r.Body.Close()
		var body struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(r.Body).Decode(&body) != nil || len(body.Data.Result) != 1 {
			return false
		}
		labels = body.Data.Result[0].Metric
		return true
	}, 60*time.Second, 250*time.Millisecond, "Prometheus scraped the target")
	return labels
}

// TestScrapeKeepsTheBackendsNamespace: the ServiceMonitor honours the
// manager's labels, so a real Prometheus stores a CacheBackend's series
// with the backend's namespace; without honorLabels (before, issue 24)
// the same scrape renames it to exported_namespace and puts the
// operator's namespace in its place, which the alerts and the
// dashboard's namespace filter would read.
func TestScrapeKeepsTheBackendsNamespace(t *testing.T) {
	require.True(t, serviceMonitorHonorLabels(t), "the ServiceMonitor's endpoint sets honorLabels: true")
	got := scrape(t, true)
	assert.Equal(t, "team-a", got["namespace"], "the backend's namespace survives the scrape: %v", got)
	assert.NotContains(t, got, "exported_namespace")
	assert.Equal(t, "cache", got["name"])

	without := scrape(t, false)
	assert.Equal(t, "inferencecache-system", without["namespace"], "without honor_labels the target's namespace wins: %v", without)
	assert.Equal(t, "team-a", without["exported_namespace"])
}
