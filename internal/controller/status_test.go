package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/testutil"
)

// statusStore is a fake API server for status: the controller's status
// applies are stored whole (as the real server-side apply of the whole
// status with one manager does).
func statusStore(t *testing.T, base client.WithWatch, writes *int) interceptor.Funcs {
	return interceptor.Funcs{
		SubResourceApply: func(ctx context.Context, _ client.Client, _ string, o runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
			*writes++
			raw, err := json.Marshal(o)
			require.NoError(t, err)
			var u struct {
				Metadata metav1.ObjectMeta           `json:"metadata"`
				Status   v1alpha1.CacheBackendStatus `json:"status"`
			}
			require.NoError(t, json.Unmarshal(raw, &u))
			cb := &v1alpha1.CacheBackend{}
			require.NoError(t, base.Get(ctx, client.ObjectKey{Namespace: u.Metadata.Namespace, Name: u.Metadata.Name}, cb))
			cb.Status = u.Status
			return base.Status().Update(ctx, cb)
		},
	}
}

// TestStatusNeverClaimsMoreThanEvaluated: reconciles that stop before
// evaluating (the engine pods cannot be listed) publish Reconciling=True
// with a reason and Ready=Unknown, leave observedGeneration alone, and do
// not repeat the first-observation EngineSelectorUnmatched event; once the
// list works, the evaluated generation is published.
func TestStatusNeverClaimsMoreThanEvaluated(t *testing.T) {
	t.Parallel()
	cb := testutil.HiCacheBackend(3)
	base := fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(cb).WithStatusSubresource(cb).Build()
	writes := 0
	c := interceptor.NewClient(base, statusStore(t, base, &writes))
	listFails := true
	rec := events.NewFakeRecorder(20)
	r := fakeReconciler(base, c, &listFails, rec)
	key := client.ObjectKeyFromObject(cb)
	get := func() *v1alpha1.CacheBackend {
		got := &v1alpha1.CacheBackend{}
		require.NoError(t, base.Get(context.Background(), key, got))
		return got
	}
	for range 3 {
		_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
		require.ErrorContains(t, err, "apiserver unavailable")
	}
	got := get()
	assert.Zero(t, got.Status.ObservedGeneration, "nothing was evaluated")
	ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready, "Ready is published from the first reconcile")
	assert.Equal(t, metav1.ConditionUnknown, ready.Status)
	assert.Equal(t, v1alpha1.ReasonObservationFailed, ready.Reason)
	reconciling := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReconciling)
	require.NotNil(t, reconciling)
	assert.Equal(t, metav1.ConditionTrue, reconciling.Status)
	assert.Equal(t, v1alpha1.ReasonObservationFailed, reconciling.Reason)
	assert.NotEmpty(t, got.Status.EngineSelectorMessage, "what was observed is published")

	listFails = false
	_, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key})
	require.NoError(t, err)
	got = get()
	assert.Equal(t, int64(3), got.Status.ObservedGeneration)
	ready = meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, metav1.ConditionFalse, ready.Status)
	assert.Equal(t, v1alpha1.ReasonAwaitingEnginePods, ready.Reason)
	assert.Equal(t, int64(3), ready.ObservedGeneration)

	close(rec.Events)
	unmatched := 0
	for e := range rec.Events {
		if strings.Contains(e, v1alpha1.EventEngineSelectorUnmatched) {
			unmatched++
		}
	}
	assert.Equal(t, 1, unmatched, "the first observation is reported once, failed reconciles notwithstanding")
}
