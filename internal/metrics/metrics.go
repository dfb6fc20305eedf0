// Package metrics exports the manager's own gauges on controller-runtime's
// metrics registry: the build it runs (inferencecache_build_info) and one
// series per CacheBackend condition (inferencecache_cachebackend_condition),
// its engine pods by wiring state (inferencecache_cachebackend_engine_pods)
// and, where the manager serves webhooks, when their serving certificate
// expires (inferencecache_webhook_certificate_expiry_timestamp_seconds).
//
// The condition gauge is computed at scrape time from the manager's
// informer cache, kube-state-metrics style, instead of being updated by the
// status writer: it is always what the API server holds, a deleted
// CacheBackend's series go away with it, and the reconciler needs no hook.
// Every replica serves the same series (the cache runs on standbys too), so
// alerts aggregate with max by (namespace, name).
package metrics

import (
	"context"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/version"
)

// Metric names; alerts, the dashboard and docs/operations.md use them.
const (
	BuildInfoName         = "inferencecache_build_info"
	ConditionName         = "inferencecache_cachebackend_condition"
	EnginePodsName        = "inferencecache_cachebackend_engine_pods"
	CertificateExpiryName = "inferencecache_webhook_certificate_expiry_timestamp_seconds"
)

// Values of the engine-pod gauge's state label, from the CacheBackend's
// status: wired (status.wiredEnginePods), unwired
// (status.unwiredEnginePods) and other, the matched pods that are neither
// (status.matchedEnginePods minus both): skipped on purpose
// (inferencecache.io/inject-skipped or skip-inject), or not countable
// while the receipt keys cannot be read (EnginesWired Unknown).
const (
	EnginePodsWired   = "wired"
	EnginePodsUnwired = "unwired"
	EnginePodsOther   = "other"
)

// statuses are the values of the status label: for each condition the
// series of its current status is 1 and the other two are 0, so that
// `{type="Ready",status="True"} == 0` selects the backends not Ready.
var statuses = []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown}

var (
	buildInfoDesc = prometheus.NewDesc(BuildInfoName,
		"The manager's build: always 1, with its version, VCS revision and Go version as labels.",
		[]string{"version", "revision", "goversion"}, nil)
	conditionDesc = prometheus.NewDesc(ConditionName,
		"A CacheBackend's status conditions: 1 for the condition's current status, 0 for the other two.",
		[]string{"namespace", "name", "type", "status"}, nil)
	enginePodsDesc = prometheus.NewDesc(EnginePodsName,
		"A CacheBackend's matched engine pods by state: wired (the receipt verifies), unwired, other (skipped, or not countable without the receipt keys).",
		[]string{"namespace", "name", "state"}, nil)
)

// Collector emits the build-info gauge, and the condition and engine-pod
// gauges of every CacheBackend Reader lists.
type Collector struct {
	// Reader lists CacheBackends: the manager's cache (no API request per scrape).
	Reader client.Reader
	// Timeout bounds one listing (the cache waits for its first sync); 5s when zero.
	Timeout time.Duration
	// OnError, when set, is told about a listing that failed; the scrape
	// then has the build info only.
	OnError func(error)
}

// Register adds a Collector reading from r to controller-runtime's registry.
func Register(r client.Reader, onError func(error)) error {
	return ctrlmetrics.Registry.Register(&Collector{Reader: r, OnError: onError})
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- buildInfoDesc
	ch <- conditionDesc
	ch <- enginePodsDesc
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(buildInfoDesc, prometheus.GaugeValue, 1, version.Version, version.Revision(), runtime.Version())
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var list v1alpha1.CacheBackendList
	if err := c.Reader.List(ctx, &list); err != nil {
		if c.OnError != nil {
			c.OnError(err)
		}
		return
	}
	for i := range list.Items {
		cb := &list.Items[i]
		for _, cond := range cb.Status.Conditions {
			for _, s := range statuses {
				v := 0.0
				if cond.Status == s {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(conditionDesc, prometheus.GaugeValue, v, cb.Namespace, cb.Name, cond.Type, string(s))
			}
		}
		st := &cb.Status
		other := max(st.MatchedEnginePods-st.WiredEnginePods-st.UnwiredEnginePods, 0)
		for state, n := range map[string]int32{EnginePodsWired: st.WiredEnginePods, EnginePodsUnwired: st.UnwiredEnginePods, EnginePodsOther: other} {
			ch <- prometheus.MustNewConstMetric(enginePodsDesc, prometheus.GaugeValue, float64(n), cb.Namespace, cb.Name, state)
		}
	}
}
