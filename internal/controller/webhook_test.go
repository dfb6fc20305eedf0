package controller_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/testutil"
)

// servingBackend creates a CacheBackend and makes its server available, so
// that it has a status.endpoint.
func servingBackend(t *testing.T, ns, name string) *v1alpha1.CacheBackend {
	t.Helper()
	cb := newBackend(ns, name)
	require.NoError(t, k8s.Create(context.Background(), cb))
	key := client.ObjectKeyFromObject(cb)
	waitDeployment(t, key, nil)
	markDeploymentAvailable(t, key)
	return waitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.Endpoint == "" {
			return fmt.Errorf("no endpoint yet")
		}
		return nil
	})
}

func engine(ns, name string, labels map[string]string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai", Args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"},
		}}},
	}
}

func podEvents(t *testing.T, ns, pod string) map[string]int {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, k8s.List(context.Background(), &list, client.InNamespace(ns)))
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind == "Pod" && e.Regarding.Name == pod {
			out[e.Type+"/"+e.Reason]++
		}
	}
	return out
}

func waitPodEvent(t *testing.T, ns, pod, typeReason string) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, func() error {
		if got := podEvents(t, ns, pod); got[typeReason] == 0 {
			return fmt.Errorf("events of pod %s: %v, want %s", pod, got, typeReason)
		}
		return nil
	})
}

func isWired(p *corev1.Pod) bool {
	for _, e := range p.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			return true
		}
	}
	return false
}

// TestPodCreateIsWired: lifecycle steps 2 and 3 through the real API server:
// the webhook wires a matching pod at CREATE and stamps the receipt; the
// receipt controller verifies it and records InjectedByCacheBackend once,
// also when a fresh controller (as after a restart) looks at the pod again.
func TestPodCreateIsWired(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cb := servingBackend(t, ns, "cache")
	pod := engine(ns, "engine", map[string]string{"app": "engine-cache"}, nil)
	require.NoError(t, k8s.Create(ctx, pod))

	assert.True(t, isWired(pod), "the created pod carries the LMCache environment")
	assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", "--kv-transfer-config",
		`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, pod.Spec.Containers[0].Args)
	assert.Equal(t, ns+"/cache", pod.Annotations[inject.AnnotationInjectedBy])
	assert.Equal(t, string(cb.UID), pod.Annotations[inject.AnnotationInjectedByUID])
	assert.Equal(t, fmt.Sprint(cb.Generation), pod.Annotations[inject.AnnotationInjectedGeneration])
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			assert.Equal(t, cb.Status.Endpoint, e.Value)
		}
	}

	waitPodEvent(t, ns, "engine", "Normal/"+v1alpha1.EventInjected)
	testutil.Eventually(t, 10*time.Second, func() error {
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		if p.Annotations[v1alpha1.AnnotationReceiptObserved] != v1alpha1.EventInjected {
			return fmt.Errorf("receipt not marked observed: %v", p.Annotations)
		}
		return nil
	})

	// A fresh receipt controller, as after a manager restart, records nothing new.
	fresh := &controller.ReceiptReconciler{Client: k8s, Recorder: events.NewFakeRecorder(10)}
	_, err := fresh.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pod)})
	require.NoError(t, err)
	assert.Empty(t, fresh.Recorder.(*events.FakeRecorder).Events, "no second event after a restart")
	// A reconcile woken by an update that its cache shows from before the
	// mark (the cache lags the mark it just applied) must not report again:
	// the mark is applied with the cached resourceVersion as a precondition.
	stale := &metav1.PartialObjectMetadata{ObjectMeta: *pod.ObjectMeta.DeepCopy()} // as created: no mark
	stale.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	lagging := &controller.ReceiptReconciler{
		Client:    staleCache{Client: k8s, pod: stale},
		APIReader: k8s,
		Recorder:  events.NewFakeRecorder(10),
		Keys:      &receipt.KeyRing{Client: k8s, Reader: k8s, Namespace: operatorNamespace, Name: receipt.DefaultSecretName},
	}
	res, err := lagging.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pod)})
	require.NoError(t, err)
	assert.Positive(t, res.RequeueAfter, "looks again once the cache caught up")
	assert.Empty(t, lagging.Recorder.(*events.FakeRecorder).Events, "no second event from a lagging cache")
	testutil.Eventually(t, 5*time.Second, func() error {
		if n := podEvents(t, ns, "engine")["Normal/"+v1alpha1.EventInjected]; n != 1 {
			return fmt.Errorf("%d %s events, want one per pod", n, v1alpha1.EventInjected)
		}
		return nil
	})
}

// staleCache answers Gets of one pod's metadata with an old copy, as an
// informer cache that has not yet seen the latest write does.
type staleCache struct {
	client.Client
	pod *metav1.PartialObjectMetadata
}

func (c staleCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok && key == client.ObjectKeyFromObject(c.pod) {
		c.pod.DeepCopyInto(m)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestRelabelledPodIsNotWired: the failure-modes row "labelled after
// creation": the match is evaluated at CREATE only.
func TestRelabelledPodIsNotWired(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	servingBackend(t, ns, "cache")
	pod := engine(ns, "late", map[string]string{"app": "unrelated"}, nil)
	require.NoError(t, k8s.Create(ctx, pod))
	assert.False(t, isWired(pod))

	pod.Labels = map[string]string{"app": "engine-cache"}
	require.NoError(t, k8s.Update(ctx, pod))
	assert.False(t, isWired(pod), "relabelling does not wire an existing pod")
	assert.Empty(t, pod.Annotations[inject.AnnotationInjectedBy])
	waitBackend(t, client.ObjectKey{Namespace: ns, Name: "cache"}, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.MatchedEnginePods != 1 {
			return fmt.Errorf("matched %d", cb.Status.MatchedEnginePods)
		}
		return nil
	})
}

// TestPodsBeforeTheEndpointStayUnwired: lifecycle step 1: the webhook
// admits a pod that a backend without status.endpoint selects unwired
// (fail-open, with the no-endpoint warning), with no annotation and no
// event, yet counted as matched. A pod admitted before the webhook's cache
// holds the backend is a no-match, which leaves a pod unwired too: the
// admission warning tells the two apart, so the test waits for a pod the
// webhook failed open for.
func TestPodsBeforeTheEndpointStayUnwired(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cb := newBackend(ns, "cache")
	require.NoError(t, k8s.Create(ctx, cb))
	warnings := &warningRecorder{}
	wcfg := rest.CopyConfig(cfg)
	wcfg.WarningHandler = warnings
	c, err := client.New(wcfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	var pod *corev1.Pod
	created := int32(0)
	testutil.Eventually(t, 15*time.Second, func() error {
		p := engine(ns, fmt.Sprintf("early-%d", created), map[string]string{"app": "engine-cache"}, nil)
		warnings.reset()
		if err := c.Create(ctx, p); err != nil {
			return err
		}
		created++
		if !warnings.has("has no status.endpoint yet") {
			return fmt.Errorf("pod %s admitted without the fail-open warning (no match yet?): %v", p.Name, warnings.all())
		}
		pod = p
		return nil
	})
	assert.False(t, isWired(pod))
	assert.Empty(t, pod.Annotations)
	waitBackend(t, client.ObjectKeyFromObject(cb), func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.MatchedEnginePods != created {
			return fmt.Errorf("matched %d, want %d", cb.Status.MatchedEnginePods, created)
		}
		return nil
	})
	assert.Empty(t, podEvents(t, ns, pod.Name))
}

// warningRecorder collects the API server's warnings (admission warnings
// among them).
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = nil
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

func (w *warningRecorder) has(s string) bool {
	for _, m := range w.all() {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestSkippedPodGetsEvent: the opt-out row: stamped skip-inject-annotation,
// unwired, with a SkippedByOperator event.
func TestSkippedPodGetsEvent(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	servingBackend(t, ns, "cache")
	pod := engine(ns, "vanilla", map[string]string{"app": "engine-cache"}, map[string]string{inject.AnnotationSkip: "true"})
	require.NoError(t, k8s.Create(ctx, pod))
	assert.False(t, isWired(pod))
	assert.Equal(t, inject.SkippedByAnnotation, pod.Annotations[inject.AnnotationSkipped])
	assert.Equal(t, "true", pod.Annotations[inject.AnnotationSkip])
	assert.Empty(t, pod.Annotations[inject.AnnotationInjectedBy])
	waitPodEvent(t, ns, "vanilla", "Normal/"+v1alpha1.EventSkipped)
}

// TestWebhookUnreachable: with failurePolicy Ignore, pods are admitted while
// the webhook cannot be reached: unwired and without receipts; a receipt
// written by hand is not trusted (Warning ReceiptMismatch, never
// InjectedByCacheBackend).
func TestWebhookUnreachable(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	servingBackend(t, ns, "cache")

	withWebhookUnreachable(t, func() {
		// The webhook configuration change reaches the API server's admission
		// chain asynchronously: wait until a pod is admitted without it.
		var plain *corev1.Pod
		testutil.Eventually(t, 15*time.Second, func() error {
			plain = engine(ns, fmt.Sprintf("plain-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
			if err := k8s.Create(ctx, plain); err != nil {
				return err
			}
			if isWired(plain) {
				return fmt.Errorf("still wired by the webhook")
			}
			return nil
		})
		assert.Empty(t, plain.Annotations, "admitted unwired and without receipts")

		forged := engine(ns, "forged", map[string]string{"app": "engine-cache"}, map[string]string{
			inject.AnnotationInjectedBy: ns + "/cache", inject.AnnotationInjectedByUID: "00000000-copied-from-another-pod", inject.AnnotationInjectedGeneration: "1",
		})
		require.NoError(t, k8s.Create(ctx, forged))
		assert.False(t, isWired(forged))
		waitPodEvent(t, ns, "forged", "Warning/"+v1alpha1.EventReceiptMismatch)
		assert.Zero(t, podEvents(t, ns, "forged")["Normal/"+v1alpha1.EventInjected])
	})
}

// TestValidatingWebhookRejectsWhatTheSchemaCannot: rules beyond the CRD
// schema, each naming the field.
func TestValidatingWebhookRejectsWhatTheSchemaCannot(t *testing.T) {
	ns := newNamespace(t)
	cases := []struct {
		name   string
		mutate func(*v1alpha1.CacheBackend)
		field  string
		text   string
	}{
		{"override of the injected kv-transfer-config", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--kv-transfer-config={}"}}
		}, "spec.integration.engineOverrides.args[0]", "set by the injection"},
		{"override of the endpoint", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "LMCACHE_REMOTE_URL", Value: "lm://x:1"}}}
		}, "spec.integration.engineOverrides.env[0].name", "cannot be overridden"},
		{"invalid env name", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "1=BAD", Value: "x"}}}
		}, "spec.integration.engineOverrides.env[0].name", "environment variable name"},
		{"invalid selector key", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"bad key!": "x"}
		}, "spec.engineSelector.matchLabels[bad key!]", "label key"},
		{"invalid selector value", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "has spaces"}
		}, "spec.engineSelector.matchLabels[app]", "label value"},
		{"invalid engine container", func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.EngineContainer = "Not_A_Name" },
			"spec.integration.engineContainer", "container name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := newBackend(ns, "invalid")
			tc.mutate(cb)
			err := k8s.Create(context.Background(), cb, client.DryRunAll)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
			assert.Contains(t, err.Error(), tc.text)
		})
	}
}

// TestDeletedBackendLeavesWiringInPlace: the failure-modes row "CacheBackend
// deleted, engines keep the old wiring": wiring lasts for the pod's life,
// and pods created afterwards match nothing.
func TestDeletedBackendLeavesWiringInPlace(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cb := servingBackend(t, ns, "cache")
	wired := engine(ns, "wired", map[string]string{"app": "engine-cache"}, nil)
	require.NoError(t, k8s.Create(ctx, wired))
	require.True(t, isWired(wired))

	require.NoError(t, k8s.Delete(ctx, cb))
	testutil.Eventually(t, 10*time.Second, func() error {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(cb), &v1alpha1.CacheBackend{})
		if err == nil {
			return fmt.Errorf("CacheBackend still there")
		}
		return client.IgnoreNotFound(err)
	})
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(wired), wired))
	assert.True(t, isWired(wired), "an admitted pod keeps its wiring")
	// The webhook's cache may lag the deletion for a moment.
	testutil.Eventually(t, 10*time.Second, func() error {
		fresh := engine(ns, fmt.Sprintf("fresh-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
		if err := k8s.Create(ctx, fresh); err != nil {
			return err
		}
		if isWired(fresh) || len(fresh.Annotations) > 0 {
			return fmt.Errorf("pod %s wired after the backend was deleted", fresh.Name)
		}
		return nil
	})
}

// withWebhookUnreachable points the Pod webhook at a closed port while f
// runs, as when the operator is down (failurePolicy Ignore admits pods
// untouched), and restores it afterwards. The change reaches the API
// server's admission chain asynchronously: f should retry until a pod is
// admitted unwired.
func withWebhookUnreachable(t *testing.T, f func()) {
	t.Helper()
	ctx := context.Background()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "inferencecache-pod-injector"}, mwc))
	saved := mwc.Webhooks[0].ClientConfig.URL
	mwc.Webhooks[0].ClientConfig.URL = ptr.To("https://127.0.0.1:1/mutate-v1-pod")
	require.NoError(t, k8s.Update(ctx, mwc))
	defer func() {
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Name: "inferencecache-pod-injector"}, mwc))
		mwc.Webhooks[0].ClientConfig.URL = saved
		require.NoError(t, k8s.Update(ctx, mwc))
	}()
	f()
}
