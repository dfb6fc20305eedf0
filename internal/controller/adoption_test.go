package controller_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestNeverAdoptsForeignObjects: issue 13 item 1 through the API server. A
// Service and a claim of someone else exist under the names a new
// CacheBackend's children need: the backend stops with Ready=False
// NameConflict naming them and a Warning event, and neither object changes
// at all (selector, type, labels, owner references, resourceVersion). Once
// they are gone the backend proceeds.
func TestNeverAdoptsForeignObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache", Labels: map[string]string{"app": "database"}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": "database"},
			Ports:    []corev1.ServicePort{{Name: "pg", Port: 5432, TargetPort: intstr.FromInt32(5432), Protocol: corev1.ProtocolTCP}},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, svc))
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-data", Labels: map[string]string{"app": "database"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, pvc))

	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi"),
		Retention: &v1alpha1.PVCRetention{WhenDeleted: v1alpha1.RetentionDelete}}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
	msg := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message
	assert.Contains(t, msg, "Service cache exists and is not owned by this CacheBackend")
	assert.Contains(t, msg, "PersistentVolumeClaim cache-data exists and is not owned by this CacheBackend")
	assert.Empty(t, got.Status.Endpoint)
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.ReasonNameConflict, 1)
	suite.Reconciled(t, key)

	liveSvc := &corev1.Service{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), liveSvc))
	assert.Equal(t, svc.ResourceVersion, liveSvc.ResourceVersion, "the Service was not written")
	assert.Equal(t, corev1.ServiceTypeNodePort, liveSvc.Spec.Type)
	assert.Equal(t, map[string]string{"app": "database"}, liveSvc.Spec.Selector)
	assert.Equal(t, map[string]string{"app": "database"}, liveSvc.Labels)
	assert.Empty(t, liveSvc.OwnerReferences)
	livePVC := &corev1.PersistentVolumeClaim{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(pvc), livePVC))
	assert.Equal(t, pvc.ResourceVersion, livePVC.ResourceVersion, "the claim was not written")
	assert.Equal(t, map[string]string{"app": "database"}, livePVC.Labels)
	assert.Empty(t, livePVC.OwnerReferences)
	assert.Empty(t, livePVC.Annotations)
	err := suite.K8s.Get(ctx, key, &appsv1.Deployment{})
	assert.True(t, client.IgnoreNotFound(err) == nil && err != nil, "nothing applied while the names conflict: %v", err)

	// Their owner deletes both: the backend proceeds once they are gone.
	require.NoError(t, suite.K8s.Delete(ctx, liveSvc))
	require.NoError(t, suite.K8s.Delete(ctx, livePVC))
	// No kube-controller-manager here: lift the pvc-protection finalizer
	// as its controller would for an unused claim.
	require.NoError(t, suite.K8s.Patch(ctx, livePVC, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))))
	testutil.Eventually(t, 15*time.Second, func() error {
		return testutil.Gone(ctx, suite.K8s, client.ObjectKeyFromObject(pvc), &corev1.PersistentVolumeClaim{})
	})
	// A spec change wakes the reconcile (the periodic re-check would, later).
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("2Gi") })
	suite.WaitDeployment(t, key, nil)
	suite.WaitFor(t, key, &corev1.Service{}, func(s *corev1.Service) error {
		if !metav1.IsControlledBy(s, got) {
			return fmt.Errorf("the new Service is not the backend's")
		}
		return nil
	})
}

// TestRetainedClaimIsTakenBack: a claim retained by a deleted CacheBackend
// of the same name (no owner, the operator's label for that name) is the
// new backend's: no conflict.
func TestRetainedClaimIsTakenBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	require.NoError(t, suite.K8s.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache-data", Labels: map[string]string{"inferencecache.io/cachebackend": "cache"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}))
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
}

// TestMultiprocessDaemonSetUnderThePlanRules: the DaemonSet of
// multiprocess mode follows the plan rules of the other kinds, through the
// API server. A foreign DaemonSet under the name an MP CacheBackend's
// server needs stops the backend with Ready=False NameConflict naming it,
// and is not written; once its owner deletes it the backend applies its
// own; dropping spec.multiprocess prunes that DaemonSet and applies the
// in-process Deployment.
func TestMultiprocessDaemonSetUnderThePlanRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	labels := map[string]string{"app": "node-agent"}
	foreign := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "busybox"}}}},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, foreign))

	key := testutil.StartBackend(t, suite.K8s, suite.MPBackend(ns, "cache"))
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
	msg := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message
	assert.Contains(t, msg, "DaemonSet cache exists and is not owned by this CacheBackend")
	assert.Empty(t, got.Status.Endpoint)
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.ReasonNameConflict, 1)
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess.L1.Size = resource.MustParse("5Gi") })
	suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("generation %d not evaluated yet", cb.Generation)
		}
		return testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict)(cb)
	})
	live := &appsv1.DaemonSet{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(foreign), live))
	assert.Equal(t, foreign.ResourceVersion, live.ResourceVersion, "the foreign DaemonSet was not written")
	assert.Equal(t, labels, live.Labels)
	assert.Empty(t, live.OwnerReferences)
	assert.True(t, apierrors.IsNotFound(suite.K8s.Get(ctx, key, &corev1.Service{})), "nothing applied while the name conflicts")

	// Its owner deletes it: the backend applies its own DaemonSet.
	require.NoError(t, suite.K8s.Delete(ctx, live))
	testutil.Eventually(t, 15*time.Second, func() error {
		return testutil.Gone(ctx, suite.K8s, client.ObjectKeyFromObject(foreign), &appsv1.DaemonSet{})
	})
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess.L1.Size = resource.MustParse("6Gi") })
	suite.WaitFor(t, key, &appsv1.DaemonSet{}, func(d *appsv1.DaemonSet) error {
		if !metav1.IsControlledBy(d, got) {
			return fmt.Errorf("the DaemonSet is not the backend's")
		}
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "6") {
			return fmt.Errorf("not the new L1 size yet: %v", d.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})

	// Back to the in-process server: the DaemonSet is pruned, the
	// Deployment applied.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Multiprocess = nil })
	suite.WaitDeployment(t, key, nil)
	testutil.Eventually(t, 15*time.Second, func() error {
		return testutil.Gone(ctx, suite.K8s, key, &appsv1.DaemonSet{})
	})
}
