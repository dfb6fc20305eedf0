package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// setStatefulSetStatus writes what the StatefulSet controller would.
func setStatefulSetStatus(t *testing.T, key client.ObjectKey, ready, updated int32) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		s := &appsv1.StatefulSet{}
		if err := suite.K8s.Get(context.Background(), key, s); err != nil {
			return err
		}
		n := *s.Spec.Replicas
		s.Status = appsv1.StatefulSetStatus{
			ObservedGeneration: s.Generation, Replicas: n, CurrentReplicas: n, UpdatedReplicas: updated,
			ReadyReplicas: ready, AvailableReplicas: ready, CurrentRevision: "r1", UpdateRevision: "r1",
		}
		if updated < n {
			s.Status.UpdateRevision = "r2"
		}
		return suite.K8s.Status().Update(context.Background(), s)
	})
}

// TestStatefulSetReadinessFromReadyAndUpdatedReplicas: the StatefulSet kind
// is Ready from its ready and updated replicas.
func TestStatefulSetReadinessFromReadyAndUpdatedReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.STSBackend(ns, "cache", 2, false)
	key := testutil.StartBackend(t, suite.K8s, cb)
	sts := suite.WaitStatefulSet(t, key, nil)
	assert.True(t, metav1.IsControlledBy(sts, cb))
	assert.Equal(t, "cache", sts.Spec.ServiceName)
	require.NotNil(t, sts.Spec.PersistentVolumeClaimRetentionPolicy)
	assert.Equal(t, appsv1.RetainPersistentVolumeClaimRetentionPolicyType, sts.Spec.PersistentVolumeClaimRetentionPolicy.WhenDeleted)
	assert.True(t, apierrors.IsNotFound(suite.K8s.Get(ctx, key, &appsv1.Deployment{})), "no Deployment for the StatefulSet kind")

	setStatefulSetStatus(t, key, 0, 1)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	setStatefulSetStatus(t, key, 1, 2)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonReplicasUnavailable))
	assert.NotEmpty(t, got.Status.Endpoint, "one ready replica serves")
	setStatefulSetStatus(t, key, 2, 2)
	got = suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.Equal(t, fmt.Sprintf("lm://cache.%s.svc.cluster.local:65432", ns), got.Status.Endpoint)
	assert.Equal(t, int32(2), got.Status.ReadyReplicas)
}

// TestVolumeClaimTemplatesSurviveAPIServerDefaults: per-replica storage is a
// volumeClaimTemplate; the API server's defaults in it (volumeMode) never
// count as a storage change over several reconciles.
func TestVolumeClaimTemplatesSurviveAPIServerDefaults(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	cb := suite.STSBackend(ns, "cache", 1, true)
	key := testutil.StartBackend(t, suite.K8s, cb)
	sts := suite.WaitStatefulSet(t, key, nil)
	require.Len(t, sts.Spec.VolumeClaimTemplates, 1)
	vct := sts.Spec.VolumeClaimTemplates[0]
	assert.Equal(t, "cache-data", vct.Name)
	require.NotNil(t, vct.Spec.VolumeMode, "the API server defaulted volumeMode")
	assert.Equal(t, "10Gi", ptr.To(vct.Spec.Resources.Requests[corev1.ResourceStorage]).String())

	for i := range 3 {
		setStatefulSetStatus(t, key, 1, 1)
		got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
		assert.NotEmpty(t, got.Status.Endpoint, "reconcile %d", i)
		// Touch the StatefulSet's status again to force another reconcile.
		setStatefulSetStatus(t, key, 0, 1)
		suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
			if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady); c.Reason == v1alpha1.ReasonImmutableStatefulSetStorage {
				return nil // fails below
			} else if c.Status == metav1.ConditionTrue {
				return fmt.Errorf("not reconciled yet")
			}
			return nil
		})
		got = suite.GetBackend(t, key)
		assert.NotEqual(t, v1alpha1.ReasonImmutableStatefulSetStorage, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Reason)
	}
}

// TestStorageChangeTripsImmutableStatefulSetStorage: a size change leaves
// the live StatefulSet untouched, publishes Ready=False / Progressing=False
// with reason ImmutableStatefulSetStorage and no endpoint, while the HPA is
// still reconciled.
func TestStorageChangeTripsImmutableStatefulSetStorage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.STSBackend(ns, "cache", 1, true)
	cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 3}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitStatefulSet(t, key, nil)
	setStatefulSetStatus(t, key, 1, 1)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Storage.PVC.Size = resource.MustParse("20Gi")
		cb.Spec.Autoscaling.MaxReplicas = 5
	})
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonImmutableStatefulSetStorage))
	assert.Empty(t, got.Status.Endpoint)
	assert.False(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionProgressing))
	assert.Contains(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, "size 20Gi")

	sts := suite.WaitStatefulSet(t, key, nil)
	assert.Equal(t, "10Gi", ptr.To(sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests[corev1.ResourceStorage]).String(), "the live StatefulSet is untouched")
	testutil.Eventually(t, 10*time.Second, func() error {
		hpa := &autoscalingv2.HorizontalPodAutoscaler{}
		if err := suite.K8s.Get(ctx, key, hpa); err != nil {
			return err
		}
		if hpa.Spec.MaxReplicas != 5 {
			return fmt.Errorf("HPA maxReplicas %d, want 5", hpa.Spec.MaxReplicas)
		}
		return nil
	})

	// Restoring the spec's storage returns to normal.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("10Gi") })
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
}

// TestRetentionPolicyIsRepaired: a retention policy edited by hand on the
// StatefulSet is put back to the spec's.
func TestRetentionPolicyIsRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.STSBackend(ns, "cache", 1, true)
	key := testutil.StartBackend(t, suite.K8s, cb)
	sts := suite.WaitStatefulSet(t, key, nil)
	sts.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
		WhenDeleted: appsv1.DeletePersistentVolumeClaimRetentionPolicyType,
		WhenScaled:  appsv1.DeletePersistentVolumeClaimRetentionPolicyType,
	}
	require.NoError(t, suite.K8s.Update(ctx, sts, client.FieldOwner("someone")))
	suite.WaitStatefulSet(t, key, func(s *appsv1.StatefulSet) error {
		p := s.Spec.PersistentVolumeClaimRetentionPolicy
		if p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType || p.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
			return fmt.Errorf("retention policy is %+v", p)
		}
		return nil
	})
}

// TestKindSwitches: Deployment → StatefulSet keeping storage prunes the
// Deployment and warns SharedPVCRetained once for the old shared claim;
// StatefulSet → Deployment without storage warns OrphanedPVCRetained once per
// per-replica claim; no claim is deleted; the status never advertises the
// workload being replaced.
func TestKindSwitches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet })
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	assert.Empty(t, got.Status.Endpoint, "the available Deployment being replaced is not advertised")
	suite.WaitStatefulSet(t, key, nil)
	testutil.Eventually(t, 15*time.Second, func() error { return testutil.Gone(ctx, suite.K8s, key, &appsv1.Deployment{}) })
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventSharedPVCRetained, 1)
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cache-data"}, &corev1.PersistentVolumeClaim{}), "the shared claim is kept")

	// Per-replica claims as the StatefulSet controller would create them.
	for i := range 2 {
		require.NoError(t, suite.K8s.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cache-data-cache-%d", i), Labels: map[string]string{"inferencecache.io/cachebackend": "cache"}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}))
	}
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.DeploymentKind = v1alpha1.DeploymentKindDeployment
		cb.Spec.Storage = nil
	})
	suite.WaitDeployment(t, key, nil)
	testutil.Eventually(t, 15*time.Second, func() error { return testutil.Gone(ctx, suite.K8s, key, &appsv1.StatefulSet{}) })
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventOrphanedPVCRetained, 3)

	// More reconciles record no further warnings.
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	suite.MarkDeploymentRolling(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	suite.Reconciled(t, key)
	assert.Equal(t, 1, testutil.CountEvents(t, suite.K8s, ns, "cache", v1alpha1.EventSharedPVCRetained))
	assert.Equal(t, 3, testutil.CountEvents(t, suite.K8s, ns, "cache", v1alpha1.EventOrphanedPVCRetained))
	var claims corev1.PersistentVolumeClaimList
	require.NoError(t, suite.K8s.List(ctx, &claims, client.InNamespace(ns)))
	assert.Len(t, claims.Items, 3, "no claim deleted")
	for _, c := range claims.Items {
		assert.Nil(t, c.DeletionTimestamp, c.Name)
	}
}

// TestFailedReplacementShowsNoEndpoint: when the StatefulSet replacing a
// Deployment cannot be applied (a foreign StatefulSet holds the name), the
// status has no endpoint and is not Ready (NameConflict, naming it).
func TestFailedReplacementShowsNoEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))

	require.NoError(t, suite.K8s.Create(ctx, foreignStatefulSet(ns, "cache")))
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet })
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
	assert.Empty(t, got.Status.Endpoint)
	assert.True(t, strings.Contains(meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, "StatefulSet cache"))
}

// TestFailedReplacementOfAStatefulSetShowsNoEndpoint: the switch the other
// way, StatefulSet → Deployment, when the Deployment cannot be applied: a
// foreign Deployment holds the name (NameConflict, naming it), or the API
// server refuses it (a ValidatingAdmissionPolicy denies Deployments in the
// namespace: ApplyFailed, with the API server's message). Either way: no
// endpoint, not Ready, Stalled, and nothing of the backend is pruned while
// nothing replaces it.
func TestFailedReplacementOfAStatefulSetShowsNoEndpoint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, reason, message string
		block                 func(t *testing.T, ns string)
	}{
		{"a foreign Deployment holds the name", v1alpha1.ReasonNameConflict, "Deployment cache", func(t *testing.T, ns string) {
			require.NoError(t, suite.K8s.Create(context.Background(), foreignDeployment(ns, "cache")))
		}},
		{"the API server refuses the Deployment", v1alpha1.ReasonApplyFailed, "no Deployments in this namespace", denyDeployments},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			ns, key := servingStatefulSet(t)
			c.block(t, ns)
			suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.DeploymentKind = v1alpha1.DeploymentKindDeployment })
			got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, c.reason))
			assert.Empty(t, got.Status.Endpoint, "the StatefulSet being replaced is not advertised")
			assert.Contains(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, c.message)
			assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionStalled))
			suite.Reconciled(t, key)
			require.NoError(t, suite.K8s.Get(ctx, key, &appsv1.StatefulSet{}), "the StatefulSet is kept while nothing replaces it")
			if c.reason == v1alpha1.ReasonApplyFailed {
				var d appsv1.Deployment
				assert.True(t, apierrors.IsNotFound(suite.K8s.Get(ctx, key, &d)), "no Deployment was created")
			}
		})
	}
}

// TestCapacityOfTheBoundClaim: status.capacity is the bound capacity of the
// shared claim, published once the claim is bound, and StoragePersistent
// says the server never writes it.
func TestCapacityOfTheBoundClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.Nil(t, got.Status.Capacity, "no capacity before the claim is bound")
	storage := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionStoragePersistent)
	require.NotNil(t, storage, "a claim the server never writes is said in status")
	assert.Equal(t, metav1.ConditionFalse, storage.Status)
	assert.Equal(t, v1alpha1.ReasonServerKeepsKVInMemory, storage.Reason)
	assert.Contains(t, storage.Message, "the claim cache-data is mounted at /data but never written")

	pvc := &corev1.PersistentVolumeClaim{}
	claim := client.ObjectKey{Namespace: ns, Name: "cache-data"}
	require.NoError(t, suite.K8s.Get(ctx, claim, pvc))
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
	require.NoError(t, suite.K8s.Status().Update(ctx, pvc))
	// A claim event does not wake the backend: a spec change does.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels["tier"] = "a" })
	testutil.Eventually(t, 15*time.Second, func() error {
		got := &v1alpha1.CacheBackend{}
		if err := suite.K8s.Get(ctx, key, got); err != nil {
			return err
		}
		if got.Status.Capacity == nil || got.Status.Capacity.Cmp(resource.MustParse("2Gi")) != 0 {
			return fmt.Errorf("status.capacity %v, want 2Gi", got.Status.Capacity)
		}
		return nil
	})

	// Without the claim the condition goes.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage = nil })
	suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionStoragePersistent); c != nil {
			return fmt.Errorf("StoragePersistent still %s", c.Reason)
		}
		return nil
	})
}

// TestSharedClaimChangesThatCannotApply: a storage class change of the
// shared claim is held back and reported (Warning event once, Ready
// message); shrinking is refused at admission.
func TestSharedClaimChangesThatCannotApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("2Gi"), StorageClassName: ptr.To("standard")}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.StorageClassName = ptr.To("fast") })
	got := suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || cb.Status.ObservedGeneration != cb.Generation || !strings.Contains(c.Message, "storageClassName") {
			return fmt.Errorf("Ready is %+v", c)
		}
		return nil
	})
	assert.Contains(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, `"fast" cannot be applied`)
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventStorageChangeRejected, 1)
	pvc := &corev1.PersistentVolumeClaim{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cache-data"}, pvc))
	assert.Equal(t, "standard", *pvc.Spec.StorageClassName)

	err := retryUpdate(ctx, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("1Gi") })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.storage.pvc.size")
	assert.Contains(t, err.Error(), "cannot shrink from 2Gi to 1Gi")
}

// TestOverlongStatefulSetNameIsRejected: a StatefulSet's pods are labelled
// controller-revision-hash=<name>-<hash>, so the name is limited to 52.
func TestOverlongStatefulSetNameIsRejected(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	name := "c" + strings.Repeat("a", 52)
	cb := suite.STSBackend(ns, name, 1, true)
	err := suite.K8s.Create(context.Background(), cb, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metadata.name")
	assert.Contains(t, err.Error(), "at most 52 characters")
	cb = suite.STSBackend(ns, name[:52], 1, true)
	require.NoError(t, suite.K8s.Create(context.Background(), cb, client.DryRunAll))
}

func retryUpdate(ctx context.Context, key client.ObjectKey, mutate func(*v1alpha1.CacheBackend)) error {
	var err error
	for range 5 {
		cb := &v1alpha1.CacheBackend{}
		if err = suite.K8s.Get(ctx, key, cb); err != nil {
			return err
		}
		mutate(cb)
		if err = suite.K8s.Update(ctx, cb); !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

// foreignStatefulSet is a StatefulSet of someone else, with a selector the
// operator's cannot replace (selectors are immutable).
func foreignStatefulSet(ns, name string) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "someone-else"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "someone-else"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}},
			},
		},
	}
}

func foreignDeployment(ns, name string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "someone-else"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "someone-else"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}},
			},
		},
	}
}

// servingStatefulSet starts a backend served by a ready StatefulSet of one
// replica in a namespace of its own, and waits until it publishes its
// endpoint.
func servingStatefulSet(t *testing.T) (string, client.ObjectKey) {
	t.Helper()
	ns := suite.NewNamespace(t)
	key := testutil.StartBackend(t, suite.K8s, suite.STSBackend(ns, "cache", 1, false))
	suite.WaitStatefulSet(t, key, nil)
	setStatefulSetStatus(t, key, 1, 1)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	require.NotEmpty(t, got.Status.Endpoint)
	return ns, key
}

// denyDeployments makes the API server refuse every Deployment created in
// ns (a ValidatingAdmissionPolicy and its binding, removed at the test's
// end), and waits until it does.
func denyDeployments(t *testing.T, ns string) {
	ctx := context.Background()
	name := "deny-deployments-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "no Deployments in this namespace"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}
	require.NoError(t, suite.K8s.Create(ctx, policy))
	require.NoError(t, suite.K8s.Create(ctx, binding))
	t.Cleanup(func() {
		_ = suite.K8s.Delete(context.Background(), binding)
		_ = suite.K8s.Delete(context.Background(), policy)
	})
	probe := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "probe"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "probe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			},
		},
	}
	testutil.Eventually(t, 15*time.Second, func() error {
		err := suite.K8s.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			return nil
		}
		return fmt.Errorf("a Deployment is still admitted (%w)", err)
	})
}
