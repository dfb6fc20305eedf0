package rollout

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

// TestWiredWorkloadsVerifyReceipts: the restart cascade's candidates are
// the Deployments for a pod whose receipt verifies (HMAC and container digest) for
// the backend; a receipt signed with another key, one copied onto a pod
// with other containers, and a bare claim of the backend's name and UID
// (what the cascade trusted before) roll nothing.
func TestWiredWorkloadsVerifyReceipts(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	require.NoError(t, corev1.AddToScheme(s))
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cb", Generation: 1}}
	var objs []client.Object
	// engine(name, annotate) makes Deployment name → ReplicaSet → pod.
	engine := func(name string, annotate func(*corev1.Pod)) {
		ctrl := true
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-d-" + name)}}
		rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name + "-abc", UID: types.UID("uid-rs-" + name),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: name, UID: d.UID, Controller: &ctrl}}}}
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name + "-abc-x", Annotations: map[string]string{},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: &ctrl}}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/" + name, Args: []string{"--model", "m"}}}}}
		annotate(p)
		objs = append(objs, d, rs, p)
	}
	sign := func(k receipt.Key) func(*corev1.Pod) {
		return func(p *corev1.Pod) { signReceipt(p, k) }
	}
	var wiredAnnotations map[string]string
	engine("wired", func(p *corev1.Pod) { sign(key)(p); wiredAnnotations = p.Annotations })
	engine("forged", sign(receipt.NewKey([]byte("somebody else's key, not ours!!!"))))
	engine("copied", func(p *corev1.Pod) {
		for k, v := range wiredAnnotations {
			p.Annotations[k] = v
		}
	})
	engine("claim-only", func(p *corev1.Pod) {
		p.Annotations[v1alpha1.AnnotationInjectedBy] = "llm/cache"
		p.Annotations[v1alpha1.AnnotationInjectedByUID] = "uid-cb"
	})
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	got, err := WiredWorkloads(context.Background(), c, c, cb, []receipt.Key{key})
	require.NoError(t, err)
	assert.Equal(t, []Candidate{{Workload: Workload{Kind: "Deployment", Name: "wired"}, Found: true}}, got, "one candidate, the verified pod's workload only")
}

// signReceipt gives p the receipt of generation 1 of the CacheBackend
// llm/cache (UID uid-cb), signed with k, as the webhook writes it.
func signReceipt(p *corev1.Pod, k receipt.Key) {
	c := receipt.Claim{Backend: "llm/cache", UID: "uid-cb", Generation: "1", Digest: receipt.Digest(p)}
	p.Annotations[v1alpha1.AnnotationInjectedBy] = c.Backend
	p.Annotations[v1alpha1.AnnotationInjectedByUID] = c.UID
	p.Annotations[v1alpha1.AnnotationInjectedGeneration] = c.Generation
	p.Annotations[v1alpha1.AnnotationInjectedConfigDigest] = c.Digest
	p.Annotations[v1alpha1.AnnotationReceiptSignature] = receipt.Sign(k, c)
}

// TestRollOncePerValue: a workload whose pod template carries the current
// instance's value already is read as carrying it and not rolled again
// (once per pod template and value, across manager restarts); a workload
// that is gone is not rolled, and keeps the heal from reporting Healing.
func TestRollOncePerValue(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	value := InstanceHash("pod-1:0")
	carried := map[string]string{v1alpha1.AnnotationServerInstance: value}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "fresh"}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "fresh"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "rolled"},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: carried}}}},
	).Build()
	set := map[Workload]bool{{"Deployment", "fresh"}: true, {"StatefulSet", "fresh"}: true, {"Deployment", "rolled"}: true, {"Deployment", "gone"}: true}
	cands, err := readCandidates(context.Background(), c, "llm", set)
	require.NoError(t, err)
	assert.Equal(t, []Candidate{
		{Workload: Workload{"Deployment", "fresh"}, Found: true},
		{Workload: Workload{"Deployment", "gone"}},
		{Workload: Workload{"Deployment", "rolled"}, Found: true, Carries: value},
		{Workload: Workload{"StatefulSet", "fresh"}, Found: true},
	}, cands)
	st := RollState{Policy: v1alpha1.EngineRestartOnServerChange, Instance: "pod-1:0", ServerAvailable: true, Ready: true, Settled: true, Early: true}
	p := Rolls(st, nil, cands)
	assert.Equal(t, []Workload{{"Deployment", "fresh"}, {"StatefulSet", "fresh"}}, p.Workloads(CauseAdmittedBeforeEndpoint))
	assert.False(t, p.Healing, "a gone workload's pods are not being replaced")
	p = Rolls(st, nil, cands[2:3])
	assert.Empty(t, p.Rolls)
	assert.True(t, p.Healing, "every early workload carries the value: its pods are being replaced")
}

// TestWiredPodsLeaveOutBarePods: the per-node cascade's candidates are the
// scheduled wired pods of an engine workload (a Deployment's, through its
// ReplicaSet, or a StatefulSet's), each with its UID (the eviction's
// precondition) and node; a bare pod (gone for good once evicted), a pod
// not scheduled yet, and (issue 35) the pods of a Job, a DaemonSet, a
// ReplicaSet no Deployment controls, or a ReplicaSet whose UID is not the
// owner reference's are left out.
func TestWiredPodsLeaveOutBarePods(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(s))
	require.NoError(t, appsv1.AddToScheme(s))
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cb", Generation: 1}}
	ctrl := true
	owner := func(apiVersion, kind, name string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &ctrl}}
	}
	pod := func(name, node string, owners []metav1.OwnerReference) client.Object {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}, OwnerReferences: owners},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
		signReceipt(p, key)
		return p
	}
	rs := func(name string, owners []metav1.OwnerReference) client.Object {
		return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-" + name), OwnerReferences: owners}}
	}
	stale := owner("apps/v1", "ReplicaSet", "engine-abc")
	stale[0].UID = "uid-an-earlier-engine-abc"
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		rs("engine-abc", owner("apps/v1", "Deployment", "engine")), rs("bare-rs", nil),
		pod("engine-abc-x", "gpu-a", owner("apps/v1", "ReplicaSet", "engine-abc")),
		pod("engine-sts-0", "gpu-b", owner("apps/v1", "StatefulSet", "engine-sts")),
		pod("bare", "gpu-a", nil), pod("engine-abc-pending", "", owner("apps/v1", "ReplicaSet", "engine-abc")),
		pod("batch-run-x", "gpu-a", owner("batch/v1", "Job", "batch-run")),
		pod("agent-x", "gpu-a", owner("apps/v1", "DaemonSet", "agent")),
		pod("bare-rs-x", "gpu-a", owner("apps/v1", "ReplicaSet", "bare-rs")),
		pod("engine-abc-old", "gpu-a", stale),
	).Build()
	got, err := WiredPods(context.Background(), c, c, cb, []receipt.Key{key})
	require.NoError(t, err)
	require.Len(t, got, 2, "%+v", got)
	assert.Equal(t, EnginePod{Name: "engine-abc-x", UID: "uid-engine-abc-x", Node: "gpu-a"}, got[0])
	assert.Equal(t, EnginePod{Name: "engine-sts-0", UID: "uid-engine-sts-0", Node: "gpu-b"}, got[1])
}
