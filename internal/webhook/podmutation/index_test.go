package podmutation

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// indexOf feeds backends to a new, synced Index as the informer would.
func indexOf(backends ...v1alpha1.CacheBackend) *Index {
	x := NewIndex()
	for i := range backends {
		x.OnAdd(&backends[i], true)
	}
	x.SetSynced(func() bool { return true })
	return x
}

func TestIndexSelectIsSelect(t *testing.T) {
	deleting := metav1.Now()
	backends := []v1alpha1.CacheBackend{
		backend("b-qwen", func(cb *v1alpha1.CacheBackend) {}),
		backend("a-qwen-gpu", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen", "tier": "gpu"}
		}),
		backend("c-tier", func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels = map[string]string{"tier": "gpu"} }),
		backend("0-gone", func(cb *v1alpha1.CacheBackend) { cb.DeletionTimestamp = &deleting }),
		backend("0-empty", func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels = nil }),
		backend("other-ns", func(cb *v1alpha1.CacheBackend) { cb.Namespace = "elsewhere" }),
	}
	pods := []map[string]string{
		nil,
		{"app": "qwen"},
		{"app": "qwen", "tier": "gpu"},
		{"tier": "gpu"},
		{"tier": "cpu", "app": "llama"},
		{"app": ""},
	}
	x := indexOf(backends...)
	inNS := func(ns string) []v1alpha1.CacheBackend {
		var out []v1alpha1.CacheBackend
		for _, cb := range backends {
			if cb.Namespace == ns {
				out = append(out, cb)
			}
		}
		return out
	}
	check := func(step string) {
		t.Helper()
		for _, ns := range []string{"llm", "elsewhere", "none"} {
			for _, labels := range pods {
				want, got := v1alpha1.Claimant(labels, inNS(ns)), x.Select(ns, labels)
				name := func(cb *v1alpha1.CacheBackend) string {
					if cb == nil {
						return "<none>"
					}
					return cb.Name
				}
				assert.Equal(t, name(want), name(got), "%s: namespace %s, pod labels %v", step, ns, labels)
			}
		}
	}
	check("initial list")

	// A selector change re-anchors the backend; a deletion removes it,
	// also when the informer only knows its last state.
	changed := backends[1].DeepCopy()
	changed.Spec.EngineSelector.MatchLabels = map[string]string{"app": "llama"}
	x.OnUpdate(&backends[1], changed)
	backends[1] = *changed
	check("after a selector change")

	x.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "llm/b-qwen", Obj: &backends[0]})
	backends = append(backends[:0:0], backends[1:]...)
	check("after a deletion")

	x.OnDelete(&backends[len(backends)-1])
	backends = backends[:len(backends)-1]
	check("after the namespace's last backend is deleted")
	assert.NotContains(t, x.byNS, "elsewhere", "an emptied namespace is dropped")
}

func TestIndexSelectionIsFlat(t *testing.T) {
	// Selecting among 1,000 backends touches only those anchored at one of
	// the pod's labels: the allocation count does not grow with them.
	var backends []v1alpha1.CacheBackend
	for i := range 1000 {
		backends = append(backends, backend(fmt.Sprintf("cache-%04d", i), func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": fmt.Sprintf("other-%d", i)}
		}))
	}
	backends[999].Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen"}
	x := indexOf(backends...)
	labels := map[string]string{"app": "qwen", "pod-template-hash": "abc"}
	allocs := testing.AllocsPerRun(100, func() {
		if cb := x.Select("llm", labels); cb == nil || cb.Name != "cache-0999" {
			t.Fatalf("selected %v", cb)
		}
	})
	assert.Zero(t, allocs)
}

func TestHandlerWithIndex(t *testing.T) {
	cb := backend("cache")
	x := indexOf(cb)
	h := &Handler{Backends: x, Reader: failingReader(t)}

	resp := h.Handle(context.Background(), request(t, admissionv1.Create, enginePod()))
	require.True(t, resp.Allowed)
	assert.NotEmpty(t, resp.Patches, "the backend the index selects wires the pod")

	resp = h.Handle(context.Background(), request(t, admissionv1.Create, enginePod(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "llama"} })))
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patches, "a pod no backend claims is admitted as sent")
	assert.Empty(t, resp.Warnings)

	resp = h.Handle(context.Background(), request(t, admissionv1.Create, enginePod(forgedReceipt, func(p *corev1.Pod) { p.Labels = map[string]string{"app": "llama"} })))
	assert.True(t, resp.Allowed)
	require.NotEmpty(t, resp.Patches, "an unclaimed pod's hand-written receipt is stripped")
	for _, op := range resp.Patches {
		assert.Equal(t, "remove", op.Operation, op.Path)
	}

	// Until the index holds the informer's initial list, the handler lists.
	x.SetSynced(func() bool { return false })
	resp = h.Handle(context.Background(), request(t, admissionv1.Create, enginePod()))
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patches)
	require.Len(t, resp.Warnings, 1)
	assert.Contains(t, resp.Warnings[0], "cache not synced", "an unsynced index is not trusted")
}

// failingReader is a CacheBackend reader whose List fails as an unsynced
// cache's would.
func failingReader(t testing.TB) client.Reader {
	return interceptor.NewClient(fakeReader(t).(client.WithWatch), interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("cache not synced")
		},
	})
}
