package controller

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/testutil"
)

// TestEngineLocalKeepsVerdictWhenPodsCannotBeListed: a failed pod list
// returns the error and keeps the published readiness verdict (the seed's
// rule): the status written says Reconciling=True/ObservationFailed, keeps
// Ready exactly as it was and leaves observedGeneration alone. Every status
// write is captured, whatever its verb (the controller applies status), so
// a reconcile that replaced the verdict cannot pass.
func TestEngineLocalKeepsVerdictWhenPodsCannotBeListed(t *testing.T) {
	t.Parallel()
	s := testutil.Scheme()
	cb := testutil.HiCacheBackend(2)
	cb.Status.ObservedGeneration = 2
	cb.Status.MatchedEnginePods = 1
	meta.SetStatusCondition(&cb.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: v1alpha1.ReasonEnginePodsReady, Message: "1 engine pod", ObservedGeneration: 2})
	before := *meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	base := fake.NewClientBuilder().WithScheme(s).WithObjects(cb).WithStatusSubresource(cb).Build()

	var written []v1alpha1.CacheBackendStatus
	capture := func(obj any) {
		raw, err := json.Marshal(obj)
		require.NoError(t, err)
		var o struct {
			Status v1alpha1.CacheBackendStatus `json:"status"`
		}
		require.NoError(t, json.Unmarshal(raw, &o))
		written = append(written, o.Status)
	}
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourceApply: func(_ context.Context, _ client.Client, _ string, o runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
			capture(o)
			return nil
		},
		SubResourcePatch: func(_ context.Context, _ client.Client, _ string, o client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
			capture(o)
			return nil
		},
		SubResourceUpdate: func(_ context.Context, _ client.Client, _ string, o client.Object, _ ...client.SubResourceUpdateOption) error {
			capture(o)
			return nil
		},
	})
	fails := true
	r := fakeReconciler(base, c, &fails, events.NewFakeRecorder(10))
	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cb)})
	require.ErrorContains(t, err, "apiserver unavailable")
	require.Len(t, written, 1, "the stop is published once")
	got := written[0]
	assert.Equal(t, int64(2), got.ObservedGeneration)
	ready := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, before.Status, ready.Status, "the previous verdict is kept")
	assert.Equal(t, before.Reason, ready.Reason)
	assert.Equal(t, before.Message, ready.Message)
	assert.Equal(t, before.LastTransitionTime.Unix(), ready.LastTransitionTime.Unix(), "the transition time is kept (at the API's one-second resolution)")
	rec := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionReconciling)
	require.NotNil(t, rec, "the stop is visible")
	assert.Equal(t, metav1.ConditionTrue, rec.Status)
	assert.Equal(t, v1alpha1.ReasonObservationFailed, rec.Reason)
}

// fakeReconciler is a CacheBackendReconciler writing through c and reading
// pods through base, whose pod lists fail while *podListFails.
func fakeReconciler(base client.WithWatch, c client.Client, podListFails *bool, rec events.EventRecorder) *CacheBackendReconciler {
	reader := interceptor.NewClient(base, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
			if _, ok := l.(*corev1.PodList); ok && *podListFails {
				return errors.New("apiserver unavailable")
			}
			return c.List(ctx, l, opts...)
		},
	})
	return &CacheBackendReconciler{
		Client: c, APIReader: reader, Recorder: rec, Now: metav1.Now,
		Keys: &receipt.KeyRing{Client: base, Reader: base, Namespace: "inferencecache-system", Name: receipt.DefaultSecretName},
	}
}
