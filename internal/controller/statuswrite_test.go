package controller

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

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
	t.Parallel()
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

// TestEveryStatusWriteKeepsTheLastPublication: a reconcile that reads a
// cache lagging this process's last status write takes the endpoint and
// the time it was published from that write, also when it stops before it
// evaluates (stop writes the status too): an older cached status never
// withdraws the endpoint or restarts its settle time.
func TestEveryStatusWriteKeepsTheLastPublication(t *testing.T) {
	t.Parallel()
	var applied []map[string]any
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	cached := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp", Generation: 1}}
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).WithObjects(cached).Build(), interceptor.Funcs{
		SubResourceApply: func(_ context.Context, _ client.Client, _ string, obj runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
			raw, err := json.Marshal(obj)
			if err != nil {
				return err
			}
			var u map[string]any
			if err := json.Unmarshal(raw, &u); err != nil {
				return err
			}
			applied = append(applied, u["status"].(map[string]any))
			return nil
		},
	})
	r := &CacheBackendReconciler{Client: c}
	ctx := context.Background()
	at := metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	published := cached.Status.DeepCopy()
	published.Endpoint, published.EndpointPublishedAt = "tcp://mp-local.llm.svc.cluster.local:5555", &at
	require.NoError(t, r.patchStatus(ctx, cached, published))

	// The cache still shows the status from before the endpoint.
	p, err := r.begin(ctx, client.ObjectKeyFromObject(cached))
	require.NoError(t, err)
	_, err = r.stop(ctx, p, v1alpha1.ReasonObservationFailed, errors.New("listing engine pods: refused"))
	require.Error(t, err)
	require.Len(t, applied, 2)
	assert.Equal(t, published.Endpoint, applied[1]["endpoint"], "stop keeps the endpoint")
	assert.Equal(t, at.UTC().Format(time.RFC3339), applied[1]["endpointPublishedAt"], "and when it was published")
}

// TestStatusShownByTheCacheIsNotWrittenAgain: the status this process
// wrote is remembered as the API server stores it (times in whole
// seconds), so once the cache shows the write, a reconcile that computes
// the same status (with the remembered endpoint publication laid over the
// cached status) sends nothing; remembering the write's nanoseconds made
// every reconcile write the status again.
func TestStatusShownByTheCacheIsNotWrittenAgain(t *testing.T) {
	t.Parallel()
	var writes int
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	at := metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 123456789, time.UTC))
	st := v1alpha1.CacheBackendStatus{ObservedGeneration: 1, Endpoint: "tcp://mp-local.llm.svc.cluster.local:5555", EndpointPublishedAt: &at}
	// The cache, once it shows the write: the time in whole seconds.
	shown := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp", Generation: 1}, Status: *st.DeepCopy()}
	shown.Status.EndpointPublishedAt = &metav1.Time{Time: at.Truncate(time.Second)}
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).WithObjects(shown).Build(), interceptor.Funcs{
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			writes++
			return nil
		},
	})
	r := &CacheBackendReconciler{Client: c}
	ctx := context.Background()
	before := &v1alpha1.CacheBackend{ObjectMeta: shown.ObjectMeta}
	require.NoError(t, r.patchStatus(ctx, before, &st))
	require.Equal(t, 1, writes)

	p, err := r.begin(ctx, client.ObjectKeyFromObject(shown))
	require.NoError(t, err)
	require.NoError(t, r.patchStatus(ctx, p.cb, p.st))
	assert.Equal(t, 1, writes, "the cache shows the write: nothing to send")
}
