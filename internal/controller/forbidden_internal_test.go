package controller

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/rollout"
)

// TestForbiddenEvictionsAreReportedOnce: an engine pod whose eviction RBAC
// refused is not tried (nor reported) again for the same start of its
// node's server, also when the backend's identity changed on another node;
// it is when its node's server changes again; the memo keeps only pods
// still planned.
func TestForbiddenEvictionsAreReportedOnce(t *testing.T) {
	t.Parallel()
	r := &CacheBackendReconciler{}
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp"}}
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	a := rollout.Eviction{Pod: "engine-a", UID: "uid-a", Node: "gpu-a", Since: t0}
	b := rollout.Eviction{Pod: "engine-b", UID: "uid-b", Node: "gpu-b", Since: t0.Add(time.Minute)}
	toTry := func(planned ...rollout.Eviction) []string {
		var out []string
		for _, e := range unreported(r.memo.get(cb).forbidden, planned) {
			out = append(out, e.Pod)
		}
		return out
	}
	assert.Equal(t, []string{"engine-a"}, toTry(a))
	r.rememberForbidden(cb, []rollout.Eviction{a}, []rollout.Eviction{a})
	assert.Empty(t, toTry(a), "reported once")
	assert.Equal(t, []string{"engine-b"}, toTry(a, b), "another node's change: only its pod")
	r.rememberForbidden(cb, []rollout.Eviction{a, b}, []rollout.Eviction{b})
	assert.Empty(t, toTry(a, b))
	again := a
	again.Since = t0.Add(time.Hour)
	assert.Equal(t, []string{"engine-a"}, toTry(again), "gpu-a's server changed again")
	r.rememberForbidden(cb, []rollout.Eviction{b}, nil)
	keys := slices.Collect(maps.Keys(r.memo.get(cb).forbidden))
	assert.Equal(t, []types.UID{"uid-b"}, keys, "only pods still planned are kept")
}

// TestHealRolledIgnoresOtherFailures: the heal counts as rolling when
// every heal roll of the pass was written, whatever else failed (another
// workload's cascade roll, an eviction).
func TestHealRolledIgnoresOtherFailures(t *testing.T) {
	t.Parallel()
	heal := rollout.Roll{Workload: rollout.Workload{Kind: "Deployment", Name: "early"}, Value: "v", Cause: rollout.CauseAdmittedBeforeEndpoint}
	cascade := rollout.Roll{Workload: rollout.Workload{Kind: "Deployment", Name: "wired"}, Value: "v", Cause: rollout.CauseServerChange}
	for _, tc := range []struct {
		name          string
		planned, done []rollout.Roll
		want          bool
	}{
		{"nothing planned", nil, nil, true},
		{"the heal written", []rollout.Roll{heal}, []rollout.Roll{heal}, true},
		{"the heal written, the cascade's roll failed", []rollout.Roll{cascade, heal}, []rollout.Roll{heal}, true},
		{"the heal's roll failed", []rollout.Roll{cascade, heal}, []rollout.Roll{cascade}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, healRolled(tc.planned, tc.done))
		})
	}
}

// TestBackendReadyIsRecordedOnceWhileTheCacheLags: a publish judges the
// Ready transition from this process's last status write, so a reconcile
// retried at once (a failed roll) that reads the status from before the
// first publish records BackendReady no second time.
func TestBackendReadyIsRecordedOnceWhileTheCacheLags(t *testing.T) {
	t.Parallel()
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	cached := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cache", Generation: 1}}
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).WithObjects(cached).Build(), interceptor.Funcs{
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			return nil
		},
	})
	rec := events.NewFakeRecorder(8)
	r := &CacheBackendReconciler{Client: c, Recorder: rec}
	ready := evaluate.Verdict{Ready: true, Available: true, Reason: v1alpha1.ReasonBackendReady, Message: "1 of 1 replicas available"}
	for range 2 {
		// The cache still shows the status from before the first publish.
		p := &pass{cb: cached, st: cached.Status.DeepCopy(), verdict: ready}
		p.out = evaluate.Outcome{Verdict: ready, Endpoint: "lm://cache.llm.svc.cluster.local:65432",
			Wiring: evaluate.WiringReport{Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAllEnginesWired}}
		_, err := r.publish(context.Background(), p)
		require.NoError(t, err)
	}
	close(rec.Events)
	var readyEvents []string
	for e := range rec.Events {
		if strings.Contains(e, v1alpha1.EventBackendReady) {
			readyEvents = append(readyEvents, e)
		}
	}
	assert.Len(t, readyEvents, 1, "BackendReady once: %q", readyEvents)
}

// TestAFailedWorkloadRollHoldsNoEviction: the API server refusing one
// engine workload's restart annotation leaves the other workloads' rolls
// and the per-node evictions to go ahead; the refusal is a Warning event
// EngineRollFailed and the reconcile's error (retried).
func TestAFailedWorkloadRollHoldsNoEviction(t *testing.T) {
	t.Parallel()
	s := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(s))
	var evicted []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).Build(), interceptor.Funcs{
		Apply: func(_ context.Context, _ client.WithWatch, obj runtime.ApplyConfiguration, _ ...client.ApplyOption) error {
			raw, err := json.Marshal(obj)
			require.NoError(t, err)
			if strings.Contains(string(raw), `"name":"locked"`) {
				return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "locked", errors.New("denied by a policy"))
			}
			return nil
		},
		SubResourceCreate: func(_ context.Context, _ client.Client, _ string, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
			evicted = append(evicted, obj.GetName())
			return nil
		},
	})
	rec := events.NewFakeRecorder(8)
	r := &CacheBackendReconciler{Client: c, Applier: apply.New(c), Recorder: rec}
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp"}}
	heal := func(name string) rollout.Roll {
		return rollout.Roll{Workload: rollout.Workload{Kind: "Deployment", Name: name}, Value: "v", Cause: rollout.CauseAdmittedBeforeEndpoint}
	}
	p := &pass{cb: cb, rolls: rollout.RollPlan{Rolls: []rollout.Roll{heal("locked"), heal("open")},
		Evictions: []rollout.Eviction{{Pod: "engine-a", UID: "uid-a", Node: "gpu-a"}}}}
	err := r.roll(context.Background(), p)
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Equal(t, []rollout.Roll{heal("open")}, p.rolled, "the other workload is rolled")
	assert.Equal(t, []string{"engine-a"}, evicted, "the evictions go ahead")
	assert.False(t, healRolled(p.rolls.Rolls, p.rolled))
	close(rec.Events)
	var reasons []string
	for e := range rec.Events {
		reasons = append(reasons, strings.Fields(e)[1])
	}
	assert.ElementsMatch(t, []string{v1alpha1.EventEngineRollFailed, v1alpha1.EventEnginesRestartedForWiring, v1alpha1.EventEnginesRestarted}, reasons)
}
