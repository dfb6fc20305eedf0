package workload

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestServingPodsNeedAnOwner: a pod that carries the cache-server labels
// but is controlled by no workload of the backend (copied by hand, or
// another controller's) is never a serving pod, for either kind.
func TestServingPodsNeedAnOwner(t *testing.T) {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	sel := map[string]string{"app": "cache"}
	ref := func(kind, name, uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: k8stypes.UID(uid), Controller: ptr.To(true)}}
	}
	pod := func(name string, owners []metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: sel, OwnerReferences: owners}}
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cache", UID: "dep"}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cache-1", UID: "rs", Labels: sel, OwnerReferences: ref("Deployment", "cache", "dep")}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cache", UID: "sts"}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(rs,
		pod("of-rs", ref("ReplicaSet", "cache-1", "rs")),
		pod("of-sts", ref("StatefulSet", "cache", "sts")),
		pod("labelled-only", nil),
		pod("of-another", ref("ReplicaSet", "other", "other"))).Build()
	for _, tc := range []struct {
		kind v1alpha1.DeploymentKind
		obj  client.Object
		want string
	}{
		{v1alpha1.DeploymentKindDeployment, dep, "of-rs"},
		{v1alpha1.DeploymentKindStatefulSet, sts, "of-sts"},
	} {
		w := Observed(&v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{DeploymentKind: tc.kind}}, tc.obj)
		pods, err := w.ServingPods(context.Background(), c, sel)
		if err != nil {
			t.Fatal(err)
		}
		if len(pods) != 1 || pods[0].Name != tc.want {
			t.Fatalf("%s: serving pods %d, want only %s", w.Kind(), len(pods), tc.want)
		}
	}
}

// TestClaimOwner: a per-replica claim belongs to the backend when its
// controller is the backend's workload of a kind that makes such claims,
// by kind, API version and name.
func TestClaimOwner(t *testing.T) {
	for _, c := range []struct {
		name string
		ref  metav1.OwnerReference
		want bool
	}{
		{"the StatefulSet", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "cache"}, true},
		{"another StatefulSet", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "other"}, false},
		{"a Deployment of the name (shared claims only)", metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "cache"}, false},
		{"another group's StatefulSet", metav1.OwnerReference{APIVersion: "apps.kruise.io/v1beta1", Kind: "StatefulSet", Name: "cache"}, false},
	} {
		if got := ClaimOwner(&c.ref, "cache"); got != c.want {
			t.Errorf("%s: ClaimOwner = %v, want %v", c.name, got, c.want)
		}
	}
}
