package metrics_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/metrics"
	"github.com/inferencecache/operator/internal/version"
)

func backend(ns, name string, conds ...metav1.Condition) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	cb.Status.Conditions = conds
	return cb
}

// TestCollect: one series per (backend, condition type, status), 1 for the
// current status and 0 for the other two; a backend without conditions
// has none; the build info carries the linked version.
func TestCollect(t *testing.T) {
	defer func(v string) { version.Version = v }(version.Version)
	version.Version = "v0.0.1-test"
	s := k8sruntime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		backend("a", "ready",
			metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue},
			metav1.Condition{Type: "Degraded", Status: metav1.ConditionFalse}),
		backend("b", "rolling", metav1.Condition{Type: "Ready", Status: metav1.ConditionUnknown}),
		backend("b", "new"),
	).Build()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(&metrics.Collector{Reader: c}))
	want := `
# HELP inferencecache_build_info The manager's build: always 1, with its version, VCS revision and Go version as labels.
# TYPE inferencecache_build_info gauge
inferencecache_build_info{goversion="` + runtime.Version() + `",revision="` + version.Revision() + `",version="v0.0.1-test"} 1
# HELP inferencecache_cachebackend_condition A CacheBackend's status conditions: 1 for the condition's current status, 0 for the other two.
# TYPE inferencecache_cachebackend_condition gauge
inferencecache_cachebackend_condition{name="ready",namespace="a",status="False",type="Degraded"} 1
inferencecache_cachebackend_condition{name="ready",namespace="a",status="True",type="Degraded"} 0
inferencecache_cachebackend_condition{name="ready",namespace="a",status="Unknown",type="Degraded"} 0
inferencecache_cachebackend_condition{name="ready",namespace="a",status="False",type="Ready"} 0
inferencecache_cachebackend_condition{name="ready",namespace="a",status="True",type="Ready"} 1
inferencecache_cachebackend_condition{name="ready",namespace="a",status="Unknown",type="Ready"} 0
inferencecache_cachebackend_condition{name="rolling",namespace="b",status="False",type="Ready"} 0
inferencecache_cachebackend_condition{name="rolling",namespace="b",status="True",type="Ready"} 0
inferencecache_cachebackend_condition{name="rolling",namespace="b",status="Unknown",type="Ready"} 1
# HELP inferencecache_cachebackend_engine_pods A CacheBackend's matched engine pods by state: wired (the receipt verifies), unwired, other (skipped, or not countable without the receipt keys).
# TYPE inferencecache_cachebackend_engine_pods gauge
inferencecache_cachebackend_engine_pods{name="new",namespace="b",state="other"} 0
inferencecache_cachebackend_engine_pods{name="new",namespace="b",state="unwired"} 0
inferencecache_cachebackend_engine_pods{name="new",namespace="b",state="wired"} 0
inferencecache_cachebackend_engine_pods{name="ready",namespace="a",state="other"} 0
inferencecache_cachebackend_engine_pods{name="ready",namespace="a",state="unwired"} 0
inferencecache_cachebackend_engine_pods{name="ready",namespace="a",state="wired"} 0
inferencecache_cachebackend_engine_pods{name="rolling",namespace="b",state="other"} 0
inferencecache_cachebackend_engine_pods{name="rolling",namespace="b",state="unwired"} 0
inferencecache_cachebackend_engine_pods{name="rolling",namespace="b",state="wired"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
}

type failingReader struct{ client.Reader }

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("cache not synced")
}

// TestCollectListError: a failed listing is reported and the scrape still
// has the build info (and no stale condition series).
func TestCollectListError(t *testing.T) {
	var got error
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(&metrics.Collector{Reader: failingReader{}, OnError: func(err error) { got = err }}))
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.EqualError(t, got, "cache not synced")
}

// TestCollectEnginePods: one series per backend and state, from the
// status the controller wrote: wired and unwired as counted, other the
// matched pods that are neither (skipped, or uncountable without keys),
// never negative when a status is momentarily inconsistent.
func TestCollectEnginePods(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		matched, wired, unwired int32
		want                    map[string]float64
	}{
		{"none matched", 0, 0, 0, map[string]float64{"wired": 0, "unwired": 0, "other": 0}},
		{"all wired", 3, 3, 0, map[string]float64{"wired": 3, "unwired": 0, "other": 0}},
		{"some unwired", 5, 2, 3, map[string]float64{"wired": 2, "unwired": 3, "other": 0}},
		{"skipped pods are other", 6, 2, 1, map[string]float64{"wired": 2, "unwired": 1, "other": 3}},
		{"more counted than matched", 1, 2, 1, map[string]float64{"wired": 2, "unwired": 1, "other": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := backend("ml", "cache")
			cb.Status.MatchedEnginePods, cb.Status.WiredEnginePods, cb.Status.UnwiredEnginePods = tc.matched, tc.wired, tc.unwired
			s := k8sruntime.NewScheme()
			require.NoError(t, v1alpha1.AddToScheme(s))
			reg := prometheus.NewPedanticRegistry()
			require.NoError(t, reg.Register(&metrics.Collector{Reader: fake.NewClientBuilder().WithScheme(s).WithObjects(cb).Build()}))
			families, err := reg.Gather()
			require.NoError(t, err)
			got := map[string]float64{}
			for _, f := range families {
				if f.GetName() != metrics.EnginePodsName {
					continue
				}
				for _, m := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					assert.Equal(t, "ml", labels["namespace"])
					assert.Equal(t, "cache", labels["name"])
					got[labels["state"]] = m.GetGauge().GetValue()
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
