package inject

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func request(t testing.TB, op admissionv1.Operation, pod *corev1.Pod) admission.Request {
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: op, Namespace: "llm", Name: pod.Name,
		Kind:   metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Object: runtime.RawExtension{Raw: raw},
	}}
}

func fakeReader(t testing.TB, objs ...client.Object) client.Client {
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

func TestHandlerInjectsOnCreate(t *testing.T) {
	cb := backend("cache")
	h := &Handler{Reader: fakeReader(t, &cb)}
	resp := h.Handle(context.Background(), request(t, admissionv1.Create, enginePod()))
	require.True(t, resp.Allowed)
	assert.NotEmpty(t, resp.Patches)
}

func TestHandlerIgnoresUpdates(t *testing.T) {
	cb := backend("cache")
	h := &Handler{Reader: fakeReader(t, &cb)}
	resp := h.Handle(context.Background(), request(t, admissionv1.Update, enginePod()))
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patches, "relabelling or updating a pod never re-evaluates it")
}

func TestHandlerFailsOpen(t *testing.T) {
	h := &Handler{Reader: failingReader(t)}
	resp := h.Handle(context.Background(), request(t, admissionv1.Create, enginePod()))
	assert.True(t, resp.Allowed, "the webhook never rejects a pod")
	assert.Empty(t, resp.Patches)
	require.Len(t, resp.Warnings, 1)
	assert.Contains(t, resp.Warnings[0], "cache not synced")

	garbage := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, Namespace: "llm", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Object: runtime.RawExtension{Raw: []byte(`{"metadata":{"labels":{"app":"qwen"}},"spec": 7}`)},
	}}
	cb := backend("cache")
	resp = (&Handler{Reader: fakeReader(t, &cb)}).Handle(context.Background(), garbage)
	assert.True(t, resp.Allowed)
	assert.Empty(t, resp.Patches)
	assert.NotEmpty(t, resp.Warnings)
}

// FuzzAdmit: arbitrary pods never panic the webhook, and every patch it
// returns applies cleanly to the pod it was computed for.
func FuzzAdmit(f *testing.F) {
	for _, p := range []*corev1.Pod{
		enginePod(), enginePod(forgedReceipt), enginePod(withAnnotations(v1alpha1.AnnotationSkipInject, "true")),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers = nil }),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"bash", "-c", "vllm serve"} }),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{KVTransferConfigFlag} }),
	} {
		raw, _ := json.Marshal(p)
		f.Add(raw, "qwen", false)
		f.Add(raw, "qwen", true)
	}
	f.Add([]byte(`{"metadata":{"labels":{"app":"qwen"},"annotations":null},"spec":{"containers":[{"name":"a","env":[{"name":"LMCACHE_REMOTE_URL"}]}]}}`), "qwen", false)
	f.Add([]byte(`{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{}],"initContainers":[{}]}}`), "qwen", true)
	f.Fuzz(func(t *testing.T, raw []byte, app string, hicache bool) {
		cbs := []v1alpha1.CacheBackend{backend("b", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": app}
			cb.Spec.Observation = &v1alpha1.Observation{ModelID: "m"}
			if hicache {
				cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
			}
		}), backend("a", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "" })}
		d, ops, err := Admit(raw, cbs, Options{KVEventSubscriberImage: "sub:v1"})
		if err != nil {
			return // not a pod: the handler admits it unchanged
		}
		if len(ops) == 0 {
			return
		}
		assertPatchApplies(t, raw, ops, d.Pod)
	})
}

// BenchmarkAdmit measures one admission (decode, decide, patch) with 1,
// 100 and 1,000 CacheBackends in the namespace, the last of which selects
// the wired pod and none the unmatched one.
func BenchmarkAdmit(b *testing.B) {
	for _, c := range []struct {
		name string
		app  string
		want Outcome
	}{{"wired", "qwen", Injected}, {"unmatched", "nothing-selects-this", NoMatch}} {
		raw, err := json.Marshal(enginePod(func(p *corev1.Pod) { p.Labels["app"] = c.app }))
		require.NoError(b, err)
		for _, n := range []int{1, 100, 1000} {
			cbs := make([]v1alpha1.CacheBackend, n)
			for i := range cbs {
				cbs[i] = backend(fmt.Sprintf("cache-%04d", i), func(cb *v1alpha1.CacheBackend) {
					cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": fmt.Sprintf("other-%d", i)}
				})
			}
			cbs[n-1].Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen"}
			b.Run(fmt.Sprintf("pod=%s/backends=%d", c.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					d, _, err := Admit(raw, cbs, Options{})
					if err != nil || d.Outcome != c.want {
						b.Fatalf("outcome %s, want %s: %v", d.Outcome, c.want, err)
					}
				}
			})
		}
	}
}
