package cli

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
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/testutil"
)

// TestDiffPreviewsTheCascade: after the serving cache-server pod was
// replaced, diff previews the controller's roll plan: the Deployment with
// a pod wired to the backend (its receipt verifies) would be rolled, the
// one whose pod carries no receipt would not; without the receipt keys the
// diff says the rolls are not previewed instead of guessing.
func TestDiffPreviewsTheCascade(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	yes := true
	now := time.Now()
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cb", Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineRestartPolicy: v1alpha1.EngineRestartOnServerChange,
			EngineSelector:      v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}},
		Status: v1alpha1.CacheBackendStatus{
			Endpoint:               "lm://cache.llm.svc.cluster.local:65432",
			ObservedServerInstance: "old-pod:0",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBackendReady,
				LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}},
		},
	}
	owner := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: &yes}}
	}
	// The cache server: its Deployment, ReplicaSet and a new pod (the
	// recorded one, old-pod, is gone).
	server := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-srv",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: "cache", UID: cb.UID, Controller: &yes}}},
		Status: appsv1.DeploymentStatus{Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}}
	serverRS := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache-1", UID: "uid-srv-rs",
		Labels: render.SelectorLabels(cb), OwnerReferences: owner("Deployment", "cache", server.UID)}}
	serverPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache-1-x", UID: "new-pod",
		Labels: render.SelectorLabels(cb), OwnerReferences: owner("ReplicaSet", serverRS.Name, serverRS.UID)},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	objs := []client.Object{cb, server, serverRS, serverPod}
	engine := func(name string, wired bool) {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-d-" + name)}}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name + "-abc", UID: types.UID("uid-rs-" + name),
			OwnerReferences: owner("Deployment", name, d.UID)}}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name + "-abc-x", Labels: map[string]string{"app": "vllm"},
			CreationTimestamp: metav1.NewTime(now.Add(-time.Second)), OwnerReferences: owner("ReplicaSet", rs.Name, rs.UID)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		if wired {
			p = inject.Decide(p, []v1alpha1.CacheBackend{*cb}, inject.Options{Key: &key}).Pod
		}
		objs = append(objs, d, rs, p)
	}
	engine("wired", true)
	engine("plain", false)
	c := fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(objs...).Build()

	p, err := previewRolls(context.Background(), c, cb, false, []receipt.Key{key}, now)
	require.NoError(t, err)
	assert.Equal(t, []plan.Workload{{Kind: "Deployment", Name: "wired"}}, p.Workloads(plan.CauseServerChange))
	assert.Len(t, p.Rolls, 1)
	d := DiffResult{Backend: "llm/cache", Rolls: p}
	assert.True(t, d.HasChanges(), "a roll is a change")
	assert.Contains(t, d.String(), "Deployment/llm/wired would be rolled")

	_, err = previewRolls(context.Background(), c, cb, false, nil, now)
	require.Error(t, err, "without keys the wired engines cannot be verified")
	assert.Contains(t, err.Error(), "receipt keys")

	// Recorded as followed (the new pod is the recorded instance): nothing rolls.
	followed := cb.DeepCopy()
	followed.Status.ObservedServerInstance = "new-pod:0"
	p, err = previewRolls(context.Background(), c, followed, false, []receipt.Key{key}, now)
	require.NoError(t, err)
	assert.Empty(t, p.Rolls)
}
