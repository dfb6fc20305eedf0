package controller

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestEngineSelectorUnmatchedIsNormal: zero matches is an observation, not
// a failure: EngineSelectorUnmatched is recorded once with type Normal
// (the seed's event table), and not again while the cache lags.
func TestEngineSelectorUnmatchedIsNormal(t *testing.T) {
	t.Parallel()
	rec := events.NewFakeRecorder(4)
	r := &CacheBackendReconciler{Recorder: rec}
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cb", UID: "u"},
		Spec: v1alpha1.CacheBackendSpec{EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}}}
	for range 2 {
		s := &pass{cb: cb, st: cb.Status.DeepCopy()}
		r.recordEngineMatch(s)
	}
	close(rec.Events)
	var got []string
	for e := range rec.Events {
		got = append(got, e)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], corev1.EventTypeNormal+" "+v1alpha1.EventEngineSelectorUnmatched+" ") {
		t.Fatalf("events %q, want one %s %s", got, corev1.EventTypeNormal, v1alpha1.EventEngineSelectorUnmatched)
	}
}

// TestPodsClaimedByAnotherBackend: of the pods a backend's selector
// matches, those the webhook wires to another backend (the first by name
// of those whose selectors match) are not this backend's engines; the
// selector message names the claimant instead of "matches no pod".
func TestPodsClaimedByAnotherBackend(t *testing.T) {
	t.Parallel()
	backend := func(name string, sel map[string]string) v1alpha1.CacheBackend {
		return v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1alpha1.CacheBackendSpec{EngineSelector: v1alpha1.EngineSelector{MatchLabels: sel}}}
	}
	pod := func(name string, labels map[string]string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}}
	}
	demo := map[string]string{"app": "qwen-demo"}
	backends := []v1alpha1.CacheBackend{
		backend("qwen-persistent", demo),
		backend("qwen-demo-cache", demo),
		backend("tiered", map[string]string{"app": "qwen-demo", "tier": "gpu"}),
	}
	pods := []metav1.PartialObjectMetadata{pod("a", demo), pod("b", map[string]string{"app": "qwen-demo", "tier": "gpu"})}

	c := claimed(pods, backends, "qwen-demo-cache")
	assert.Len(t, c.mine, 2, "the first by name of the matching backends claims both")
	assert.Empty(t, c.others)

	c = claimed(pods, backends, "qwen-persistent")
	assert.Empty(t, c.mine)
	assert.Equal(t, map[string]int{"qwen-demo-cache": 2}, c.others)

	c = claimed(pods[1:], backends, "tiered")
	assert.Empty(t, c.mine)
	assert.Equal(t, map[string]int{"qwen-demo-cache": 1}, c.others)

	// A backend being deleted claims nothing; its pods stay its own to
	// report while it goes.
	deleting := backends[1].DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	c = claimed(pods[:1], []v1alpha1.CacheBackend{*deleting}, "qwen-demo-cache")
	assert.Len(t, c.mine, 1)
	assert.Empty(t, c.others)

	msg := selectorMessage(&backends[0], map[string]int{"qwen-demo-cache": 2})
	assert.Equal(t, "engineSelector app=qwen-demo matches 2 pod(s) in namespace ns, each claimed by another CacheBackend (2 by CacheBackend qwen-demo-cache): "+
		"the webhook wires a pod to the first by name of the backends whose selectors match it; give this one a selector of its own", msg)
	assert.Equal(t, "engineSelector app=qwen-demo matches no pod in namespace ns", selectorMessage(&backends[0], nil))
}
