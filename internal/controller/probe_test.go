package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/testutil"
)

// TestFunctionalProbe: a closed port keeps Ready=False with a reason and
// FunctionalProbeOK=False; once the server answers, both become True.
func TestFunctionalProbe(t *testing.T) {
	ns := newNamespace(t)
	addr := fmt.Sprintf("cache.%s.svc.cluster.local:65432", ns)
	closedTargets.Store(addr, true)
	defer closedTargets.Delete(addr)

	cb := newBackend(ns, "cache")
	key := testutil.StartBackend(t, k8s, cb)
	waitDeployment(t, key, nil)
	markDeploymentAvailable(t, key)
	got := waitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonFunctionalProbeFailed))
	probe := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK)
	require.NotNil(t, probe)
	assert.Equal(t, metav1.ConditionFalse, probe.Status)
	assert.Contains(t, probe.Message, "connection refused")

	closedTargets.Delete(addr)
	got = waitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK))
}

// TestProbeSlotClearedOnEveryExit: each way out of the ready state clears
// the backend's probe slot and the FunctionalProbeOK condition: the
// workload becoming unavailable, an apply failure, immutable StatefulSet
// storage, and deletion.
func TestProbeSlotClearedOnEveryExit(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	ready := func(cb *v1alpha1.CacheBackend, sts bool) client.ObjectKey {
		key := client.ObjectKeyFromObject(cb)
		if sts {
			waitStatefulSet(t, key, nil)
			setStatefulSetStatus(t, key, 1, 1)
		} else {
			waitDeployment(t, key, nil)
			markDeploymentAvailable(t, key)
		}
		waitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
		require.True(t, prober.HasSlot(key), "probed before Ready")
		return key
	}
	cleared := func(key client.ObjectKey) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			if prober.HasSlot(key) {
				return fmt.Errorf("probe slot of %s still held", key)
			}
			cb := &v1alpha1.CacheBackend{}
			if err := k8s.Get(ctx, key, cb); err == nil && meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK) != nil {
				return fmt.Errorf("FunctionalProbeOK still published")
			}
			return nil
		})
	}

	t.Run("workload unavailable", func(t *testing.T) {
		cb := newBackend(ns, "unavailable")
		require.NoError(t, k8s.Create(ctx, cb))
		key := ready(cb, false)
		markDeploymentRolling(t, key)
		cleared(key)
	})
	t.Run("name conflict", func(t *testing.T) {
		cb := newBackend(ns, "applyfail")
		require.NoError(t, k8s.Create(ctx, cb))
		key := ready(cb, false)
		// A foreign StatefulSet holds the name the switched kind needs.
		require.NoError(t, k8s.Create(ctx, foreignStatefulSet(ns, "applyfail")))
		updateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet })
		waitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
		cleared(key)
	})
	t.Run("immutable StatefulSet storage", func(t *testing.T) {
		cb := stsBackend(ns, "drift", 1, true)
		require.NoError(t, k8s.Create(ctx, cb))
		key := ready(cb, true)
		updateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("30Gi") })
		waitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonImmutableStatefulSetStorage))
		cleared(key)
	})
	t.Run("deleted", func(t *testing.T) {
		cb := newBackend(ns, "deleted")
		require.NoError(t, k8s.Create(ctx, cb))
		key := ready(cb, false)
		require.NoError(t, k8s.Delete(ctx, cb))
		testutil.Eventually(t, 10*time.Second, func() error {
			if prober.HasSlot(key) {
				return fmt.Errorf("probe slot still held")
			}
			return nil
		})
	})
}
