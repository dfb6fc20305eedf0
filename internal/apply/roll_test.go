package apply

import (
	"context"
	"encoding/json"
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
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

// TestRollEnginesVerifiesReceipts: the restart cascade rolls a Deployment
// only for a pod whose receipt verifies (HMAC and container digest) for
// the backend; a receipt signed with another key, one copied onto a pod
// with other containers, and a bare claim of the backend's name and UID
// (what the cascade trusted before) roll nothing.
func TestRollEnginesVerifiesReceipts(t *testing.T) {
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
		return func(p *corev1.Pod) {
			c := receipt.Claim{Backend: "llm/cache", UID: "uid-cb", Generation: "1", Digest: receipt.Digest(p)}
			p.Annotations[v1alpha1.AnnotationInjectedBy] = c.Backend
			p.Annotations[v1alpha1.AnnotationInjectedByUID] = c.UID
			p.Annotations[v1alpha1.AnnotationInjectedGeneration] = c.Generation
			p.Annotations[v1alpha1.AnnotationInjectedConfigDigest] = c.Digest
			p.Annotations[v1alpha1.AnnotationReceiptSignature] = receipt.Sign(k, c)
		}
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
	var applied []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build(), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			applied = append(applied, "applied")
			return nil
		},
	})
	rolled, err := New(c).RollEngines(context.Background(), c, cb, []receipt.Key{key}, "pod-1:0")
	require.NoError(t, err)
	assert.Equal(t, []Workload{{Kind: "Deployment", Name: "wired"}}, rolled)
	assert.Len(t, applied, 1, "one roll, for the verified pod only")
}

// TestRollOncePerValue: Roll writes the value on the pod template of
// Deployments and StatefulSets alike, and leaves a workload that already
// carries it alone (once per pod template and value).
func TestRollOncePerValue(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, appsv1.AddToScheme(s))
	carried := map[string]string{v1alpha1.AnnotationServerInstance: "v1"}
	objs := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "fresh"}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "fresh"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "rolled"},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: carried}}}},
	}
	var kinds []string
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build(), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			o := &client.ApplyOptions{}
			o.ApplyOptions(opts)
			assert.Equal(t, v1alpha1.FieldManagerRollout, o.FieldManager)
			raw, err := json.Marshal(obj)
			require.NoError(t, err)
			assert.Contains(t, string(raw), `"inferencecache.io/server-instance":"v1"`)
			var m struct{ Kind string }
			require.NoError(t, json.Unmarshal(raw, &m))
			kinds = append(kinds, m.Kind)
			return nil
		},
	})
	ws := []Workload{{"Deployment", "fresh"}, {"StatefulSet", "fresh"}, {"Deployment", "rolled"}, {"Deployment", "gone"}}
	rolled, carrying, err := New(c).Roll(context.Background(), c, "llm", ws, "v1")
	require.NoError(t, err)
	assert.Equal(t, []Workload{{"Deployment", "fresh"}, {"StatefulSet", "fresh"}}, rolled)
	assert.Equal(t, []Workload{{"Deployment", "rolled"}}, carrying)
	assert.Equal(t, []string{"Deployment", "StatefulSet"}, kinds)
}
