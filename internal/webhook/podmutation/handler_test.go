package podmutation

import (
	"context"
	"encoding/json"
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
