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
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/rollout"
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

	p, err := PreviewRolls(context.Background(), c, cb, false, []receipt.Key{key}, now)
	require.NoError(t, err)
	assert.Equal(t, []rollout.Workload{{Kind: "Deployment", Name: "wired"}}, p.Workloads(rollout.CauseServerChange))
	assert.Len(t, p.Rolls, 1)
	d := DiffResult{Backend: "llm/cache", Rolls: p}
	assert.True(t, d.HasChanges(), "a roll is a change")
	assert.Contains(t, d.String(), "Deployment/llm/wired would be rolled")

	_, err = PreviewRolls(context.Background(), c, cb, false, nil, now)
	require.Error(t, err, "without keys the wired engines cannot be verified")
	assert.Contains(t, err.Error(), "receipt keys")

	// Recorded as followed (the new pod is the recorded instance): nothing rolls.
	followed := cb.DeepCopy()
	followed.Status.ObservedServerInstance = "new-pod:0"
	p, err = PreviewRolls(context.Background(), c, followed, false, []receipt.Key{key}, now)
	require.NoError(t, err)
	assert.Empty(t, p.Rolls)
}

// TestDiffPreviewsTheMultiprocessHeal: in multiprocess mode diff previews
// the heal as the controller plans it: while the endpoint has been
// published long enough, Ready or not (here one of two nodes has no
// server), the workload of a pod admitted before it is rolled with the
// hash of the endpoint's publication, not of the server identity; a
// workload carrying that value is not rolled again; without a recorded
// publication time the heal waits for Ready.
func TestDiffPreviewsTheMultiprocessHeal(t *testing.T) {
	yes := true
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	published := metav1.NewTime(now.Add(-time.Minute))
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-cb", Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineRestartPolicy: v1alpha1.EngineRestartOnServerChange, Multiprocess: &v1alpha1.Multiprocess{},
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}},
		Status: v1alpha1.CacheBackendStatus{
			Endpoint: "tcp://mp.llm.svc.cluster.local:5555", EndpointPublishedAt: &published,
			ObservedServerInstance: "srv-a:0@gpu-a",
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonReplicasUnavailable,
				LastTransitionTime: published}},
		},
	}
	owner := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: &yes}}
	}
	// The servers: a DaemonSet wanting two nodes, one server ready on gpu-a.
	servers := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-ds",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: "mp", UID: cb.UID, Controller: &yes}}},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2, CurrentNumberScheduled: 2, UpdatedNumberScheduled: 2, NumberReady: 1, NumberAvailable: 1}}
	server := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp-a", UID: "srv-a", Labels: render.SelectorLabels(cb),
		CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Minute)), OwnerReferences: owner("DaemonSet", "mp", servers.UID)},
		Spec:   corev1.PodSpec{NodeName: "gpu-a"},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	engine := func(carries string) []client.Object {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "early", UID: "uid-d-early"}}
		if carries != "" {
			d.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationServerInstance: carries}
		}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "early-abc", UID: "uid-rs-early",
			OwnerReferences: owner("Deployment", "early", d.UID)}}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "early-abc-x", Labels: map[string]string{"app": "vllm"},
			CreationTimestamp: metav1.NewTime(now.Add(-2 * time.Minute)), OwnerReferences: owner("ReplicaSet", rs.Name, rs.UID)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		return []client.Object{d, rs, p}
	}
	preview := func(cb *v1alpha1.CacheBackend, carries string) rollout.RollPlan {
		t.Helper()
		c := fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(append([]client.Object{cb, servers, server}, engine(carries)...)...).Build()
		p, err := PreviewRolls(context.Background(), c, cb, false, []receipt.Key{receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))}, now)
		require.NoError(t, err)
		return p
	}
	value := rollout.InstanceHash(cb.Status.Endpoint + "@" + published.UTC().Format(time.RFC3339))

	p := preview(cb, "")
	assert.Equal(t, []rollout.Workload{{Kind: "Deployment", Name: "early"}}, p.Workloads(rollout.CauseAdmittedBeforeEndpoint), "healed, not Ready")
	if assert.Len(t, p.Rolls, 1) {
		assert.Equal(t, value, p.Rolls[0].Value, "the publication's hash")
	}
	assert.Empty(t, preview(cb, value).Rolls, "carries the value: not rolled again")

	unrecorded := cb.DeepCopy()
	unrecorded.Status.EndpointPublishedAt = nil
	p = preview(unrecorded, "")
	assert.Empty(t, p.Rolls, "no publication time: the heal waits for Ready")
	assert.Zero(t, p.Wait, "and polls nothing")
}
