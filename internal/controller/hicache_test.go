package controller_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

func newHiCache(ns string) *v1alpha1.CacheBackend {
	return &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hicache"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeSGLang, Type: v1alpha1.BackendTypeSGLangHiCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "sglang"}},
			HiCache:        &v1alpha1.HiCache{Ratio: ptr.To("2"), WritePolicy: "write_through", PageSize: ptr.To[int32](64)},
		},
	}
}

func sglangPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "sglang"}, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "sglang", Image: "lmsysorg/sglang", Command: []string{"python3", "-m", "sglang.launch_server"},
			Args: []string{"--model-path", "Qwen/Qwen2.5-0.5B-Instruct"},
		}}},
	}
}

// markPodReady writes the status a kubelet would write for a running, ready pod.
func markPodReady(t *testing.T, p *corev1.Pod) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		cur := &corev1.Pod{}
		if err := suite.K8s.Get(context.Background(), client.ObjectKeyFromObject(p), cur); err != nil {
			return err
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		return suite.K8s.Status().Update(context.Background(), cur)
	})
}

// TestHiCacheReadiness: an engine-local backend runs nothing, waits for
// engine pods, becomes Ready once an admitted pod is Ready, and reports a
// rollout after a spec change until the pod is replaced.
func TestHiCacheReadiness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := newHiCache(ns)
	key := testutil.StartBackend(t, suite.K8s, cb)

	got := suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonAwaitingEnginePods))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionProgressing))
	assert.Empty(t, got.Status.Endpoint)
	assert.True(t, apierrors.IsNotFound(suite.K8s.Get(ctx, key, &appsv1.Deployment{})), "no workload")
	assert.True(t, apierrors.IsNotFound(suite.K8s.Get(ctx, key, &corev1.Service{})), "no Service")

	pod := sglangPod(ns, "engine-1", nil)
	require.NoError(t, suite.K8s.Create(ctx, pod))
	assert.Equal(t, []string{"--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--enable-hierarchical-cache",
		"--hicache-ratio", "2", "--hicache-write-policy", "write_through", "--page-size", "64"}, pod.Spec.Containers[0].Args)
	assert.NotEmpty(t, pod.Annotations[v1alpha1.AnnotationReceiptSignature], "the receipt is signed")
	suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsUnavailable))

	markPodReady(t, pod)
	got = suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsReady))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady))
	assert.Equal(t, int32(1), got.Status.MatchedEnginePods)
	// Engine-local: no server, so none of a server's status: no endpoint,
	// capacity, server instance or functional probe; the replica counts are
	// the engine pods'.
	assert.Empty(t, got.Status.Endpoint)
	assert.Equal(t, int32(1), got.Status.Replicas)
	assert.Equal(t, int32(1), got.Status.ReadyReplicas)
	assert.Nil(t, got.Status.Capacity)
	assert.Nil(t, got.Status.FirstAvailableAt)
	assert.Empty(t, got.Status.ObservedServerInstance)
	assert.Nil(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK), "no server to probe")

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.HiCache.Ratio = ptr.To("3") })
	got = suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsRolloutInProgress))
	assert.False(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionDegraded), "a rollout never pages as Degraded")

	require.NoError(t, suite.K8s.Delete(ctx, pod, client.GracePeriodSeconds(0)))
	replacement := sglangPod(ns, "engine-2", nil)
	require.NoError(t, suite.K8s.Create(ctx, replacement))
	assert.Contains(t, replacement.Spec.Containers[0].Args, "3")
	markPodReady(t, replacement)
	suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsReady))
}

// TestCopiedReceiptNeverCountsAsInjected: a pod created while the webhook is
// unreachable, carrying a genuine receipt copied from a wired pod (name,
// UID, generation, digest and signature), is not counted as injected:
// EnginePodsNotInjected and a Warning event.
func TestCopiedReceiptNeverCountsAsInjected(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := newHiCache(ns)
	key := testutil.StartBackend(t, suite.K8s, cb)
	genuine := sglangPod(ns, "genuine", nil)
	require.NoError(t, suite.K8s.Create(ctx, genuine))
	markPodReady(t, genuine)
	suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsReady))

	suite.WithWebhookUnreachable(t, func() {
		copied := map[string]string{}
		for _, k := range []string{v1alpha1.AnnotationInjectedBy, v1alpha1.AnnotationInjectedByUID, v1alpha1.AnnotationInjectedGeneration,
			v1alpha1.AnnotationInjectedConfigDigest, v1alpha1.AnnotationReceiptSignature} {
			copied[k] = genuine.Annotations[k]
		}
		var forged *corev1.Pod
		testutil.Eventually(t, 15*time.Second, func() error {
			forged = sglangPod(ns, fmt.Sprintf("forged-%d", time.Now().UnixNano()), copied)
			if err := suite.K8s.Create(ctx, forged); err != nil {
				return err
			}
			if len(forged.Spec.Containers[0].Args) != 2 {
				_ = suite.K8s.Delete(ctx, forged)
				return fmt.Errorf("still admitted through the webhook")
			}
			return nil
		})
		markPodReady(t, forged)
		got := suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsNotInjected))
		assert.Contains(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, forged.Name)
		suite.WaitPodEvent(t, ns, forged.Name, "Warning/"+v1alpha1.EventReceiptMismatch)
		assert.Zero(t, suite.PodEvents(t, ns, forged.Name)["Normal/"+v1alpha1.EventInjected])
	})
}

// TestReceiptKeyRotation: with the old key moved to data.previous, receipts
// it signed stay valid (the grace period) and new pods are signed with the
// new key; once previous is removed, pods signed with it no longer count as
// injected and must be rolled.
func TestReceiptKeyRotation(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := newHiCache(ns)
	key := testutil.StartBackend(t, suite.K8s, cb)
	// The webhook wires from its cache of CacheBackends: a pod created
	// before the cache holds the new backend is admitted unwired, so
	// create until one is signed (as for the young pod below).
	var old *corev1.Pod
	testutil.Eventually(t, 15*time.Second, func() error {
		old = sglangPod(ns, fmt.Sprintf("old-%d", time.Now().UnixNano()), nil)
		if err := suite.K8s.Create(ctx, old); err != nil {
			return err
		}
		if old.Annotations[v1alpha1.AnnotationReceiptSignature] == "" {
			_ = suite.K8s.Delete(ctx, old, client.GracePeriodSeconds(0))
			return fmt.Errorf("admitted before the webhook's cache held the backend")
		}
		return nil
	})
	markPodReady(t, old)
	suite.WaitBackend(t, key, testutil.ReadyIs("", v1alpha1.ReasonEnginePodsReady))

	secretKey := client.ObjectKey{Namespace: suite.OperatorNamespace, Name: receipt.DefaultSecretName}
	secret := &corev1.Secret{}
	require.NoError(t, suite.K8s.Get(ctx, secretKey, secret))
	previous := secret.Data[receipt.SecretKeyCurrent]
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	secret.Data = map[string][]byte{receipt.SecretKeyCurrent: fresh, receipt.SecretKeyPrevious: previous}
	require.NoError(t, suite.K8s.Update(ctx, secret))
	defer func() {
		// Leave the suite with a single current key.
		require.NoError(t, suite.K8s.Get(ctx, secretKey, secret))
		delete(secret.Data, receipt.SecretKeyPrevious)
		require.NoError(t, suite.K8s.Update(ctx, secret))
	}()

	var young *corev1.Pod
	testutil.Eventually(t, 15*time.Second, func() error {
		young = sglangPod(ns, fmt.Sprintf("young-%d", time.Now().UnixNano()), nil)
		if err := suite.K8s.Create(ctx, young); err != nil {
			return err
		}
		if young.Annotations[v1alpha1.AnnotationReceiptSignature][:16] != receipt.NewKey(fresh).ID {
			_ = suite.K8s.Delete(ctx, young, client.GracePeriodSeconds(0))
			return fmt.Errorf("not signed with the new key yet")
		}
		return nil
	})
	markPodReady(t, young)
	// Both receipts verify during the grace period: both pods count as
	// injected and Ready.
	suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if err := testutil.ReadyIs("", v1alpha1.ReasonEnginePodsReady)(cb); err != nil {
			return err
		}
		if cb.Status.ReadyReplicas != 2 {
			return fmt.Errorf("%d engine pods count as injected and Ready, want 2", cb.Status.ReadyReplicas)
		}
		return nil
	})

	require.NoError(t, suite.K8s.Get(ctx, secretKey, secret))
	delete(secret.Data, receipt.SecretKeyPrevious)
	require.NoError(t, suite.K8s.Update(ctx, secret))
	// A Ready backend is not polled; a new engine pod wakes it (and, not
	// Ready itself, keeps it polled until the key refresh is seen).
	require.NoError(t, suite.K8s.Create(ctx, sglangPod(ns, "trigger", nil)))
	got := suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Reason != v1alpha1.ReasonEnginePodsNotInjected {
			return fmt.Errorf("Ready is %+v", c)
		}
		return nil
	})
	assert.Contains(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message, "old")
}
