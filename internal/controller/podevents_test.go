package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/testutil"
)

// TestEnginePodEventsCoalesce: a burst of engine pod events wakes the
// backend that selects them once, after the settle time; a cache-server
// pod's event wakes its backend at once.
func TestEnginePodEventsCoalesce(t *testing.T) {
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"},
		Spec: v1alpha1.CacheBackendSpec{EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}}}}
	r := &CacheBackendReconciler{
		Client:          fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(cb).Build(),
		EnginePodSettle: 500 * time.Millisecond,
	}
	h := r.podEvents()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	ctx := context.Background()
	want := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cb)}

	start := time.Now()
	for i := range 300 {
		pod := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: fmt.Sprintf("qwen-%d", i), Labels: map[string]string{"app": "qwen"}}}
		h.Create(ctx, event.CreateEvent{Object: pod}, q)
		h.Update(ctx, event.UpdateEvent{ObjectOld: pod, ObjectNew: pod}, q)
	}
	other := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "web", Labels: map[string]string{"app": "web"}}}
	h.Create(ctx, event.CreateEvent{Object: other}, q)
	require.Less(t, time.Since(start), r.EnginePodSettle, "the events were sent within the settle time")
	assert.Zero(t, q.Len(), "engine pod events wait for the settle time")
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	got, _ := q.Get()
	assert.Equal(t, want, got)
	q.Done(got)
	time.Sleep(2 * r.EnginePodSettle)
	assert.Zero(t, q.Len(), "600 events of 300 pods woke the backend once")

	server := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache-server-0",
		Labels: map[string]string{render.LabelCacheBackend: "cache"}}}
	h.Delete(ctx, event.DeleteEvent{Object: server}, q)
	assert.Equal(t, 1, q.Len(), "a cache-server pod's event wakes its backend at once")
	got, _ = q.Get()
	q.Done(got)

	left := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "qwen-0", Labels: map[string]string{"app": "web"}}}
	was := left.DeepCopy()
	was.Labels = map[string]string{"app": "qwen"}
	h.Update(ctx, event.UpdateEvent{ObjectOld: was, ObjectNew: left}, q)
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, 10*time.Millisecond, "a pod relabelled away wakes the backend it left")
}
