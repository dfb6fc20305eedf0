package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil"
)

// TestDiffAndTheControllerPlanTheSameRolls: on the same cluster, the
// controller's reconcile (gather, plan, observe, planRolls, reading
// through the same client, nothing written) and the CLI's diff
// (cli.PreviewRolls) plan the same engine rolls: the restart cascade after
// a replaced server pod (the wired workload rolled, the unwired one not),
// the cascade followed already (nothing), and the multiprocess heal (the
// publication's hash, not Ready). Both decide with rollout.State,
// rollout.Gather and rollout.Decide; before, each built its own roll state
// and read its own candidates.
func TestDiffAndTheControllerPlanTheSameRolls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	yes := true
	owner := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: &yes}}
	}
	backendOwner := func(cb *v1alpha1.CacheBackend) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: cb.Name, UID: cb.UID, Controller: &yes}}
	}
	readyPod := corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	// engine is a Deployment of the backend's namespace with one pod,
	// admitted by the webhook with cb (wired) or not, carrying carries on
	// its template.
	engine := func(cb *v1alpha1.CacheBackend, name string, key *receipt.Key, created time.Time, carries string) []client.Object {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: name, UID: types.UID("uid-d-" + name)}}
		if carries != "" {
			d.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationServerInstance: carries}
		}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: name + "-abc", UID: types.UID("uid-rs-" + name),
			OwnerReferences: owner("Deployment", name, d.UID)}}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: name + "-abc-x", UID: types.UID("uid-p-" + name),
			Labels: map[string]string{"app": "vllm"}, CreationTimestamp: metav1.NewTime(created), OwnerReferences: owner("ReplicaSet", rs.Name, rs.UID)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		if key != nil {
			p = inject.Decide(p, []v1alpha1.CacheBackend{*cb}, inject.Options{Key: key}).Pod
		}
		return []client.Object{d, rs, p}
	}
	// compare runs both on objs and returns the controller's plan.
	compare := func(t *testing.T, cb *v1alpha1.CacheBackend, objs func(key *receipt.Key) []client.Object) rollout.RollPlan {
		t.Helper()
		base := fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(cb).WithStatusSubresource(cb).Build()
		ring := &receipt.KeyRing{Client: base, Reader: base, Namespace: "inferencecache-system", Name: receipt.DefaultSecretName}
		key, err := ring.Signing(ctx)
		require.NoError(t, err)
		for _, o := range objs(&key) {
			require.NoError(t, base.Create(ctx, o))
		}
		r := &CacheBackendReconciler{Client: base, APIReader: base, Keys: ring, Now: func() metav1.Time { return metav1.NewTime(now) }}
		s, err := r.begin(ctx, client.ObjectKeyFromObject(cb))
		require.NoError(t, err)
		require.NotNil(t, s)
		require.NoError(t, r.gather(ctx, s))
		s.plan, err = plan.Build(s.obs.plan)
		require.NoError(t, err)
		require.NoError(t, r.observe(ctx, s))
		r.planRolls(s)

		keys, err := ring.Keys(ctx)
		require.NoError(t, err)
		live := &v1alpha1.CacheBackend{}
		require.NoError(t, base.Get(ctx, client.ObjectKeyFromObject(cb), live))
		diff, err := cli.PreviewRolls(ctx, base, live, s.plan.WorkloadHold() != nil, keys, now)
		require.NoError(t, err)
		assert.Equal(t, s.rolls, diff, "the controller's plan and the diff's")
		return s.rolls
	}

	t.Run("cascade", func(t *testing.T) {
		cb := &v1alpha1.CacheBackend{
			ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cb", Generation: 1},
			Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
				EngineRestartPolicy: v1alpha1.EngineRestartOnServerChange,
				EngineSelector:      v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}},
		}
		cb.Status = v1alpha1.CacheBackendStatus{
			Endpoint: topology.Endpoint(cb, ""), ObservedServerInstance: "old-pod:0",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBackendReady,
				LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}},
		}
		cluster := func(key *receipt.Key) []client.Object {
			// The server's Deployment, ReplicaSet and a new pod (the
			// recorded one, old-pod, is gone).
			server := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-srv", OwnerReferences: backendOwner(cb)},
				Status: appsv1.DeploymentStatus{Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
					Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}}
			rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache-1", UID: "uid-srv-rs",
				Labels: render.SelectorLabels(cb), OwnerReferences: owner("Deployment", "cache", server.UID)}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache-1-x", UID: "new-pod",
				Labels: render.SelectorLabels(cb), OwnerReferences: owner("ReplicaSet", rs.Name, rs.UID)}, Status: readyPod}
			objs := []client.Object{server, rs, pod}
			objs = append(objs, engine(cb, "wired", key, now.Add(-time.Hour), "")...)
			// Unwired, admitted after the endpoint (not the heal's).
			return append(objs, engine(cb, "plain", nil, now.Add(-30*time.Second), "")...)
		}
		p := compare(t, cb, cluster)
		assert.Equal(t, []rollout.Workload{{Kind: "Deployment", Name: "wired"}}, p.Workloads(rollout.CauseServerChange), "the case compared rolls something")

		followed := cb.DeepCopy()
		followed.Status.ObservedServerInstance = "new-pod:0"
		assert.Empty(t, compare(t, followed, cluster).Rolls, "followed already")
	})

	t.Run("multiprocess heal", func(t *testing.T) {
		published := metav1.NewTime(now.Add(-time.Minute))
		cb := &v1alpha1.CacheBackend{
			ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp", Generation: 1},
			Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
				EngineRestartPolicy: v1alpha1.EngineRestartOnServerChange, Multiprocess: &v1alpha1.Multiprocess{},
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}},
		}
		cb.Status = v1alpha1.CacheBackendStatus{
			Endpoint: topology.Endpoint(cb, ""), EndpointPublishedAt: &published, ObservedServerInstance: "srv-a:0@gpu-a",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonReplicasUnavailable,
				LastTransitionTime: published}},
		}
		cluster := func(*receipt.Key) []client.Object {
			// A DaemonSet wanting two nodes, one server ready on gpu-a; an
			// engine admitted before the endpoint existed (no receipt).
			servers := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-ds", OwnerReferences: backendOwner(cb)},
				Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2, CurrentNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 1, NumberAvailable: 1}}
			server := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp-a", UID: "srv-a", Labels: render.SelectorLabels(cb),
				CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Minute)), OwnerReferences: owner("DaemonSet", "mp", servers.UID)},
				Spec: corev1.PodSpec{NodeName: "gpu-a"}, Status: readyPod}
			return append([]client.Object{servers, server}, engine(cb, "early", nil, now.Add(-2*time.Minute), "")...)
		}
		p := compare(t, cb, cluster)
		assert.Equal(t, []rollout.Workload{{Kind: "Deployment", Name: "early"}}, p.Workloads(rollout.CauseAdmittedBeforeEndpoint), "the case compared rolls something")
	})
}
