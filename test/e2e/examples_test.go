package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/testutil"
)

// TestExamplesEndAsTheirREADMEsSay applies the examples that make demo's
// cluster can hold, each as its README's commands do, and checks that each
// ends as the README's "On make demo's cluster" paragraph says. That cluster
// and this one are alike where it matters: one kwok node without a GPU
// label, no volume provisioner, no metrics server. The quickstart and
// sglang-hicache are TestQuickstartBecomesReady's and
// TestSGLangHiCacheExampleBecomesReady's; argocd, flux and gitops need a
// GitOps controller the demo does not run (test/gitops renders them).
func TestExamplesEndAsTheirREADMEsSay(t *testing.T) {
	ctx := context.Background()
	var nodes corev1.NodeList
	require.NoError(t, k8s.List(ctx, &nodes))
	for _, n := range nodes.Items {
		require.NotEqual(t, "true", n.Labels["nvidia.com/gpu.present"],
			"node %s is labelled as a GPU node; make demo's cluster has none, and the READMEs describe that cluster", n.Name)
	}

	t.Run("persistent-statefulset", func(t *testing.T) {
		ns := exampleNamespace(t, "example-persistent")
		out := kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/persistent-statefulset/cachebackend.yaml")
		assertWarnings(t, out, validation.StorageInMemoryOnly, validation.ReplicasPartition)
		cb := settledBackend(t, client.ObjectKey{Namespace: ns, Name: "qwen-persistent"})
		assertCondition(t, cb, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress)
		assertCondition(t, cb, v1alpha1.ConditionStoragePersistent, metav1.ConditionFalse, v1alpha1.ReasonServerKeepsKVInMemory)
		assert.Empty(t, cb.Status.Endpoint, "no server ready: no endpoint")
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-persistent"}, &appsv1.StatefulSet{}))
		assertPending(t, ns, "qwen-persistent-0", "cache-data-qwen-persistent-0")
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-persistent-1"}, &corev1.Pod{})
		assert.True(t, apierrors.IsNotFound(err), "the StatefulSet creates the second replica after the first is ready: %v", err)
	})

	t.Run("multiprocess", func(t *testing.T) {
		ns := exampleNamespace(t, "example-mp")
		kubectlRun(t, "apply", "--server-side", "-n", ns, "-k", "../../examples/multiprocess")
		key := client.ObjectKey{Namespace: ns, Name: "qwen-mp-cache"}
		cb := settledBackend(t, key)
		ready := assertCondition(t, cb, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonBackendReady)
		assert.Contains(t, ready.Message, "no node selected for a server yet (spec.remoteStorage.lmCacheServer.pod): no endpoint, and engines are admitted unwired")
		assert.Empty(t, cb.Status.Endpoint)
		require.NotNil(t, cb.Status.Multiprocess)
		assert.Equal(t, int32(0), cb.Status.Multiprocess.DesiredServers)
		assert.Equal(t, int32(0), cb.Status.Multiprocess.ReadyServers)
		assert.Empty(t, cb.Status.Multiprocess.Nodes)
		require.NoError(t, k8s.Get(ctx, key, &appsv1.DaemonSet{}))

		var pods corev1.PodList
		require.NoError(t, k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-mp"}))
		require.Len(t, pods.Items, 1)
		pod := pods.Items[0]
		assert.Equal(t, corev1.PodPending, pod.Status.Phase, "no node has the GPU label")
		assert.Empty(t, pod.Annotations[v1alpha1.AnnotationInjectedBy], "admitted unwired")
		for _, c := range pod.Spec.Containers {
			assert.NotContains(t, strings.Join(c.Args, " "), "--kv-transfer-config", "container %s", c.Name)
		}
		testutil.Eventually(t, 30*time.Second, func() error {
			if err := k8s.Get(ctx, key, cb); err != nil {
				return err
			}
			c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonEnginesAdmittedBeforeEndpoint {
				return fmt.Errorf("EnginesWired is %+v", c)
			}
			if !strings.Contains(c.Message, "no endpoint is published yet") {
				return fmt.Errorf("EnginesWired's message: %q", c.Message)
			}
			return nil
		})
	})

	t.Run("environments", func(t *testing.T) {
		dev := exampleNamespace(t, "llm-dev")
		kubectlRun(t, "apply", "--server-side", "-k", "../../examples/environments/overlays/dev")
		out := kubectlRun(t, "wait", "-n", dev, "--for=condition=Ready", "cachebackend/qwen-cache", "--timeout=60s")
		assert.Contains(t, out, "condition met")
		cb := settledBackend(t, client.ObjectKey{Namespace: dev, Name: "qwen-cache"})
		ready := assertCondition(t, cb, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonBackendReady)
		assert.Contains(t, ready.Message, "1 of 1 replicas available")
		assert.Equal(t, "lm://qwen-cache.llm-dev.svc.cluster.local:65432", cb.Status.Endpoint)

		prod := exampleNamespace(t, "llm-prod")
		out = kubectlRun(t, "apply", "--server-side", "-k", "../../examples/environments/overlays/production")
		assertWarnings(t, out, validation.StorageInMemoryOnly, validation.ReplicasPartition)
		cb = settledBackend(t, client.ObjectKey{Namespace: prod, Name: "qwen-cache"})
		assertCondition(t, cb, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress)
		assert.Empty(t, cb.Status.Endpoint)
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: prod, Name: "qwen-cache"}, &appsv1.StatefulSet{}))
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: prod, Name: "qwen-cache"}, &autoscalingv2.HorizontalPodAutoscaler{}))
		assertPending(t, prod, "qwen-cache-0", "cache-data-qwen-cache-0")
	})
}

// exampleNamespace creates a namespace that is deleted when the subtest
// ends, so that no example is left to act on later tests' nodes (the
// multiprocess example's DaemonSet would take any node labelled as a GPU
// node).
func exampleNamespace(t *testing.T, name string) string {
	t.Helper()
	ns := namespace(t, name)
	t.Cleanup(func() {
		err := k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		assert.NoError(t, client.IgnoreNotFound(err))
	})
	return ns
}

// assertWarnings checks that kubectl's output carries each admission
// warning.
func assertWarnings(t *testing.T, out string, warnings ...string) {
	t.Helper()
	for _, w := range warnings {
		assert.Contains(t, out, "Warning: "+w)
	}
}

// settledBackend waits until key's CacheBackend has a status for its
// current generation and a Ready condition, then gives it a few seconds
// more (the READMEs describe where a backend ends, not where it passes)
// and returns what it reads then.
func settledBackend(t *testing.T, key client.ObjectKey) *v1alpha1.CacheBackend {
	t.Helper()
	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(context.Background(), key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedGeneration != cb.Generation || meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady) == nil {
			return fmt.Errorf("no status for generation %d yet: %+v", cb.Generation, cb.Status.Conditions)
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	require.NoError(t, k8s.Get(context.Background(), key, cb))
	return cb
}

func assertCondition(t *testing.T, cb *v1alpha1.CacheBackend, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(cb.Status.Conditions, typ)
	if !assert.NotNil(t, c, "%s has no condition %s: %+v", cb.Name, typ, cb.Status.Conditions) {
		return &metav1.Condition{}
	}
	assert.Equal(t, status, c.Status, "%s %s: %s", typ, c.Reason, c.Message)
	assert.Equal(t, reason, c.Reason, "%s: %s", typ, c.Message)
	return c
}

// assertPending checks that the pod and its claim exist and stay Pending:
// nothing on the cluster provisions volumes.
func assertPending(t *testing.T, ns, pod, claim string) {
	t.Helper()
	ctx := context.Background()
	var p corev1.Pod
	var c corev1.PersistentVolumeClaim
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, &p); err != nil {
			return err
		}
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: claim}, &c)
	})
	assert.Equal(t, corev1.PodPending, p.Status.Phase, "pod %s", pod)
	assert.Empty(t, p.Spec.NodeName, "pod %s is not scheduled", pod)
	assert.Equal(t, corev1.ClaimPending, c.Status.Phase, "claim %s", claim)
}
