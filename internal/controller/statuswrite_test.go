package controller

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestStatusWriteNotSkippedOnAStaleCache: a status equal to the cached one
// is still written when this process wrote another one since (the cache
// lags its own write). The sequence is the one test/gitopsdiff's nudges
// hit: matched 2 written, then 1; the cache still shows 2 when the next
// reconcile computes 2 again, and without this the live status stayed 1.
func TestStatusWriteNotSkippedOnAStaleCache(t *testing.T) {
	var writes int
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).Build(), interceptor.Funcs{
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			writes++
			return nil
		},
	})
	r := &CacheBackendReconciler{Client: c}
	ctx := context.Background()
	cached := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache"}}
	cached.Status.MatchedEnginePods = 2
	status := func(n int32) *v1alpha1.CacheBackendStatus { return &v1alpha1.CacheBackendStatus{MatchedEnginePods: n} }

	require.NoError(t, r.patchStatus(ctx, cached, status(2)))
	assert.Equal(t, 0, writes, "the cache shows it and nothing else was written: nothing to send")
	require.NoError(t, r.patchStatus(ctx, cached, status(1)))
	assert.Equal(t, 1, writes)
	require.NoError(t, r.patchStatus(ctx, cached, status(2)))
	assert.Equal(t, 2, writes, "the cache still shows 2, but 1 was written since")
	require.NoError(t, r.patchStatus(ctx, cached, status(2)))
	assert.Equal(t, 2, writes, "written and shown: nothing to send")
}
