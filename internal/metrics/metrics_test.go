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
