package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestEngineSelectorUnmatchedIsNormal: zero matches is an observation, not
// a failure: EngineSelectorUnmatched is recorded once with type Normal
// (the seed's event table), and not again while the cache lags.
func TestEngineSelectorUnmatchedIsNormal(t *testing.T) {
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
