package topology

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestOf: the one mode decision.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec v1alpha1.CacheBackendSpec
		want Mode
	}{
		{"LMCache", v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache}, InProcess},
		{"LMCache with spec.multiprocess", v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Multiprocess: &v1alpha1.Multiprocess{}}, Multiprocess},
		{"SGLang HiCache", v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeSGLangHiCache}, EngineLocal},
		{"SGLang HiCache with a stray spec.multiprocess", v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeSGLangHiCache, Multiprocess: &v1alpha1.Multiprocess{}}, EngineLocal},
	} {
		assert.Equal(t, tc.want, Of(&v1alpha1.CacheBackend{Spec: tc.spec}), tc.name)
	}
	assert.Equal(t, []string{"in-process", "multiprocess", "hicache"}, []string{InProcess.String(), Multiprocess.String(), EngineLocal.String()})
}

// TestAddress: the port and scheme follow the mode; the spec's port wins
// over the default.
func TestAddress(t *testing.T) {
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"}, Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache}}
	assert.Equal(t, "lm://cache.llm.svc.cluster.local:65432", Endpoint(cb, ""))
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Port: 7000}}
	assert.Equal(t, "lm://cache.llm.svc.corp.example:7000", Endpoint(cb, "corp.example."))
	cb.Spec.Multiprocess = &v1alpha1.Multiprocess{}
	assert.Equal(t, "tcp://cache.llm.svc.cluster.local:5555", Endpoint(cb, ""), "multiprocess: the node-local Service's ZMQ port, not the in-process server's")
	cb.Spec.Multiprocess.Port = 6000
	assert.Equal(t, int32(6000), Port(cb))
}

// TestSettled: whole-workload rolls count the settle time from the
// Ready transition; multiprocess mode's per-node cascade from
// status.endpointPublishedAt, so a node whose server is missing (Ready
// False) holds no other node's evictions.
func TestSettled(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	const ep = "tcp://mp.llm.svc.cluster.local:5555"
	at := func(ago time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-ago)); return &t }
	ready := func(s metav1.ConditionStatus, ago time.Duration) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: s, LastTransitionTime: *at(ago)}}
	}
	for _, tc := range []struct {
		name    string
		st      v1alpha1.CacheBackendStatus
		want    string
		perNode bool
		settled bool
	}{
		{"Ready for the settle time", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, SettleTime)}, ep, false, true},
		{"Ready just now", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, time.Second)}, ep, false, false},
		{"not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Hour), Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, false, false},
		{"another endpoint", v1alpha1.CacheBackendStatus{Endpoint: "tcp://other:5555", Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, false, false},
		{"any endpoint (the CLI)", v1alpha1.CacheBackendStatus{Endpoint: "tcp://other:5555", Conditions: ready(metav1.ConditionTrue, time.Hour)}, "", false, true},
		{"no endpoint", v1alpha1.CacheBackendStatus{Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, false, false},
		{"per node: published for the settle time and a second, not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(SettleTime + time.Second), Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, true, true},
		{"per node: published just now", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Second), Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, false},
		{"per node: published within the settle time and its second", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(SettleTime + 999*time.Millisecond), Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, false},
		{"per node: no publication time (an older CRD): Ready for the settle time", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, true},
		{"per node: no publication time, not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, true, false},
		{"per node: no endpoint", v1alpha1.CacheBackendStatus{EndpointPublishedAt: at(time.Hour)}, ep, true, false},
	} {
		assert.Equal(t, tc.settled, Settled(&tc.st, tc.want, tc.perNode, now), tc.name)
	}
}

// TestSinceInMultiprocessMode: in multiprocess mode the webhook
// wires from the endpoint's publication on, Ready or not; otherwise from
// the Ready transition.
func TestSinceInMultiprocessMode(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	cb := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Multiprocess: &v1alpha1.Multiprocess{}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "tcp://mp.llm.svc.cluster.local:5555", EndpointPublishedAt: &metav1.Time{Time: t0},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0)}}}}
	since := Since(cb)
	require.NotNil(t, since, "published, not Ready")
	assert.Equal(t, t0.Add(SettleTime+time.Second), *since)
	inProcess := cb.DeepCopy()
	inProcess.Spec.Multiprocess = nil
	assert.Nil(t, Since(inProcess), "the in-process server: from Ready")
	unpublished := cb.DeepCopy()
	unpublished.Status.Endpoint = ""
	assert.Nil(t, Since(unpublished))
}

// TestPublication: the endpoint and its publication time, "" without
// either; a new publication of the same endpoint is a new value.
func TestPublication(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ep := "tcp://mp.llm.svc.cluster.local:5555"
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	st := &v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(0)}
	assert.Equal(t, ep+"@2026-12-05T12:00:00Z", Publication(st, ep))
	assert.Equal(t, ep+"@2026-12-05T12:00:00Z", Publication(st, ""), "any endpoint")
	assert.Empty(t, Publication(st, "tcp://other.llm.svc.cluster.local:5555"), "another endpoint than the one wanted")
	assert.Empty(t, Publication(&v1alpha1.CacheBackendStatus{Endpoint: ep}, ep), "no publication time (pruned by an older CRD)")
	assert.Empty(t, Publication(&v1alpha1.CacheBackendStatus{EndpointPublishedAt: at(0)}, ""), "no endpoint")
	assert.NotEqual(t, Publication(st, ep),
		Publication(&v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Minute)}, ep), "published anew")
}
