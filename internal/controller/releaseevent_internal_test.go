package controller

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/inject/injecttest"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil"
)

// TestReceiptEventSaysTheReleaseIsUnknown: a pod the webhook wired to a
// multiprocess-mode CacheBackend without knowing its vLLM release gets the
// Warning EngineReleaseUnknown (its receipt verifies; the note says what
// to declare) instead of the Normal InjectedByCacheBackend, which a pod of
// a known release, or an in-process backend's pod, gets.
func TestReceiptEventSaysTheReleaseIsUnknown(t *testing.T) {
	t.Parallel()
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	mp := injecttest.Backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Multiprocess = &v1alpha1.Multiprocess{Port: 5555, HTTPPort: 8080, L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("4Gi")}}
	})
	mp.Status.Endpoint = topology.Endpoint(&mp, "")
	inProcess := injecttest.Backend("other")
	inProcess.Status.Endpoint = topology.Endpoint(&inProcess, "")
	for _, tc := range []struct {
		name    string
		backend v1alpha1.CacheBackend
		pod     *corev1.Pod
		evType  string
		reason  string
	}{
		{"multiprocess, release unknown", mp, injecttest.EnginePod(), corev1.EventTypeWarning, v1alpha1.EventEngineReleaseUnknown},
		{"multiprocess, release declared", mp, injecttest.EnginePod(injecttest.WithAnnotations(v1alpha1.AnnotationVLLMVersion, "0.34.0")), corev1.EventTypeNormal, v1alpha1.EventInjected},
		{"in-process, release unknown", inProcess, injecttest.EnginePod(), corev1.EventTypeNormal, v1alpha1.EventInjected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := inject.Decide(tc.pod, []v1alpha1.CacheBackend{tc.backend}, inject.Options{Key: &key})
			require.Equal(t, inject.Injected, d.Outcome, d.Message)
			view, err := receiptView(d.Pod)
			require.NoError(t, err)
			cb := tc.backend
			r := &ReceiptReconciler{Client: fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(&cb).Build()}
			evType, reason, related, note, err := r.verdict(context.Background(), view.(*corev1.Pod), []receipt.Key{key})
			require.NoError(t, err)
			assert.Equal(t, tc.evType, evType)
			assert.Equal(t, tc.reason, reason, note)
			require.NotNil(t, related)
			assert.Equal(t, cb.Name, related.Name)
			if reason == v1alpha1.EventEngineReleaseUnknown {
				assert.Contains(t, note, v1alpha1.AnnotationVLLMVersion)
			}
		})
	}
}
