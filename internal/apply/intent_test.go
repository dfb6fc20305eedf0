package apply

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestIntentRecordsTheVersionReadBeforeTheApply: a child the apply left
// alone (its dry run showed nothing to write) is recorded at the
// resourceVersion read before the apply. A change someone makes between
// the dry run and the record is then seen as a change, and repaired by
// the next reconcile, instead of being taken for the applied state.
func TestIntentRecordsTheVersionReadBeforeTheApply(t *testing.T) {
	ctx := context.Background()
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(sts).Build()
	intent := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "StatefulSet",
		"metadata": map[string]any{"namespace": "llm", "name": "cache"},
		"spec":     map[string]any{"replicas": int64(1)},
	}}
	objs := []*unstructured.Unstructured{intent}

	var x intents
	before := versions(ctx, c, objs)
	// The dry run found nothing to write; then someone edits the child.
	live := &appsv1.StatefulSet{}
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(sts), live))
	live.Spec.Replicas = ptr.To[int32](3)
	require.NoError(t, c.Update(ctx, live))
	x.record(objs, []*unstructured.Unstructured{intent.DeepCopy()}, before)
	assert.False(t, x.unchanged(ctx, c, objs), "the edit made after the dry run is a change to repair")

	// The next apply writes the child: its new version is the applied state.
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(sts), live))
	written := intent.DeepCopy()
	written.SetResourceVersion(live.ResourceVersion)
	x.record(objs, []*unstructured.Unstructured{written}, versions(ctx, c, objs))
	assert.True(t, x.unchanged(ctx, c, objs), "nothing changed since the apply")
}
