package apply

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/plan"
)

// TestExecutePrunesOnlyWhatThePlanNames: the applier deletes exactly the
// children the plan prunes, each guarded by its UID (a recreated object of
// the same name survives), and reports them; nothing else is deleted.
func TestExecutePrunesOnlyWhatThePlanNames(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	require.NoError(t, corev1.AddToScheme(s))
	require.NoError(t, autoscalingv2.AddToScheme(s))
	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-hpa"}}
	recreated := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-new-sts"}}
	kept := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-svc"}}
	base := fake.NewClientBuilder().WithScheme(s).WithObjects(hpa, recreated, kept).Build()
	var deleted []string
	c := interceptor.NewClient(base, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			o := &client.DeleteOptions{}
			o.ApplyOptions(opts)
			require.NotNil(t, o.Preconditions, "every prune is guarded by the object's UID")
			require.NotNil(t, o.Preconditions.UID)
			live := &metav1.PartialObjectMetadata{}
			live.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
				return err
			}
			if live.GetUID() != *o.Preconditions.UID {
				return apierrors.NewConflict(live.GroupVersionKind().GroupVersion().WithResource("").GroupResource(), obj.GetName(), nil)
			}
			deleted = append(deleted, obj.GetObjectKind().GroupVersionKind().Kind+"/"+obj.GetName())
			return c.Delete(ctx, obj, opts...)
		},
	})
	p := plan.Plan{
		Backend: &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"}},
		Prune: []plan.Child{
			{Kind: "HorizontalPodAutoscaler", Namespace: "llm", Name: "cache", UID: "uid-hpa"},
			{Kind: "StatefulSet", Namespace: "llm", Name: "cache", UID: "uid-old-sts"},
		},
	}
	res, err := New(c).Execute(context.Background(), p)
	require.Error(t, err, "the recreated StatefulSet is not the one planned for pruning")
	assert.Equal(t, []string{"HorizontalPodAutoscaler/cache"}, deleted)
	assert.Equal(t, []Change{{Subject: "HorizontalPodAutoscaler/llm/cache", Action: Deleted}}, res.Changes)
	require.NoError(t, base.Get(context.Background(), client.ObjectKeyFromObject(recreated), &appsv1.StatefulSet{}))
	require.NoError(t, base.Get(context.Background(), client.ObjectKeyFromObject(kept), &corev1.Service{}), "not in the plan: kept")
}

// TestExecuteHandsReplicasOff: the hand-off applies the workload's current
// count with the hand-off field manager, before anything else.
func TestExecuteHandsReplicasOff(t *testing.T) {
	var applied []string
	c := interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{
		Apply: func(_ context.Context, _ client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			o := &client.ApplyOptions{}
			o.ApplyOptions(opts)
			applied = append(applied, o.FieldManager)
			return nil
		},
	})
	p := plan.Plan{
		Backend:  &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"}},
		Handoffs: []plan.Handoff{{Kind: "Deployment", Namespace: "llm", Name: "cache", Replicas: 3}},
	}
	_, err := New(c).Execute(context.Background(), p)
	require.NoError(t, err)
	assert.Equal(t, []string{v1alpha1.FieldManagerReplicasHandoff}, applied)
}
