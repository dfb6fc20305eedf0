package evaluate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/testutil"
)

var testKey = receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))

func hiCacheBackend(gen int64) *v1alpha1.CacheBackend { return testutil.HiCacheBackend(gen) }

func rawPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, Labels: map[string]string{"app": "sglang"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "sglang", Image: "lmsysorg/sglang", Command: []string{"python3", "-m", "sglang.launch_server"},
			Args: []string{"--model-path", "Qwen/Qwen2.5-0.5B-Instruct"},
		}}},
	}
}

// admitted is a pod as the webhook admits it for cb, signed with testKey.
func admitted(t *testing.T, name string, cb *v1alpha1.CacheBackend, ready bool) corev1.Pod {
	t.Helper()
	d := inject.Decide(rawPod(name), []v1alpha1.CacheBackend{*cb}, inject.Options{Key: &testKey})
	require.Equal(t, inject.Injected, d.Outcome, d.Message)
	p := *d.Pod
	return withReady(p, ready)
}

func withReady(p corev1.Pod, ready bool) corev1.Pod {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: s}}
	return p
}

func mutate(p corev1.Pod, f func(*corev1.Pod)) corev1.Pod {
	c := p.DeepCopy()
	f(c)
	return *c
}

// TestEngineLocalHealth: one case per row of the readiness contract, then
// the review's edge cases.
func TestEngineLocalHealth(t *testing.T) {
	cb := hiCacheBackend(2)
	older := hiCacheBackend(1)
	older.Spec.HiCache.Ratio = ptr.To("3")
	newer := hiCacheBackend(3)
	newer.Spec.HiCache.WritePolicy = "write_back"
	other := hiCacheBackend(2)
	other.Name, other.UID = "other", "uid-other"

	good := admitted(t, "good", cb, true)
	unready := admitted(t, "unready", cb, false)
	stale := admitted(t, "stale", older, true)
	staleUnready := admitted(t, "stale-unready", older, false)
	future := admitted(t, "future", newer, true)
	foreign := admitted(t, "foreign", other, true)
	missing := withReady(*rawPod("missing"), true)
	skipped := mutate(withReady(*rawPod("skipped"), true), func(p *corev1.Pod) {
		p.Annotations = map[string]string{v1alpha1.AnnotationSkipInject: "true", v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedByAnnotation}
	})
	skipOnlyOperatorAnnotation := mutate(withReady(*rawPod("skip-only"), true), func(p *corev1.Pod) {
		p.Annotations = map[string]string{v1alpha1.AnnotationSkipInject: "yes"}
	})
	terminating := mutate(admitted(t, "terminating", cb, false), func(p *corev1.Pod) {
		p.DeletionTimestamp = ptr.To(metav1.Now())
	})
	succeeded := mutate(missing, func(p *corev1.Pod) { p.Name, p.Status.Phase = "done", corev1.PodSucceeded })
	failed := mutate(missing, func(p *corev1.Pod) { p.Name, p.Status.Phase = "crashed", corev1.PodFailed })
	// A pod created while the webhook was down, carrying a receipt with the
	// right name, UID and generation and the canonical flags written by hand.
	forgedCanonical := mutate(good, func(p *corev1.Pod) {
		p.Name = "forged"
		p.Annotations[v1alpha1.AnnotationReceiptSignature] = testKey.ID + ":" + "00"
	})
	// A genuine receipt copied onto a pod whose configuration differs.
	copied := mutate(good, func(p *corev1.Pod) {
		p.Name = "copied"
		p.Spec.Containers[0].Args = rawPod("").Spec.Containers[0].Args
	})
	// A correctly signed receipt of the current generation on a pod whose
	// override value is present but wrong (as a leaked key would allow):
	// the replay of the injection still refuses it.
	wrongOverride := func() corev1.Pod {
		bad := hiCacheBackend(2)
		bad.Spec.Integration.EngineOverrides.Env[0].Value = "debug"
		p := admitted(t, "wrong-override", bad, true)
		return p
	}()

	// Incomplete receipts: one half of the identity without the other is
	// not a receipt of another backend but no valid receipt at all.
	byOnly := mutate(good, func(p *corev1.Pod) { p.Name = "by-only"; delete(p.Annotations, v1alpha1.AnnotationInjectedByUID) })
	uidOnly := mutate(good, func(p *corev1.Pod) { p.Name = "uid-only"; delete(p.Annotations, v1alpha1.AnnotationInjectedBy) })

	cases := []struct {
		name        string
		backend     *v1alpha1.CacheBackend
		pods        []corev1.Pod
		reason      string
		ready, prog bool
		degraded    bool
	}{
		{"row 1: no active matching pods", cb, nil, v1alpha1.ReasonAwaitingEnginePods, false, true, false},
		{"row 2: all active matching pods skipped", cb, []corev1.Pod{skipped, skipOnlyOperatorAnnotation}, v1alpha1.ReasonAllEnginePodsSkipped, true, false, false},
		{"row 3: a participating pod lacks a receipt", cb, []corev1.Pod{good, missing}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"row 4: a receipt of another backend", cb, []corev1.Pod{good, foreign}, v1alpha1.ReasonEnginePodsInjectionMismatch, false, false, true},
		{"row 5: an older generation", cb, []corev1.Pod{good, stale}, v1alpha1.ReasonEnginePodsRolloutInProgress, false, true, false},
		{"row 6: current receipts, a pod not Ready", cb, []corev1.Pod{good, unready}, v1alpha1.ReasonEnginePodsUnavailable, false, false, true},
		{"row 7: current receipts, all Ready", cb, []corev1.Pod{good}, v1alpha1.ReasonEnginePodsReady, true, false, false},

		{"mixed skipped and ready pods", cb, []corev1.Pod{good, skipped}, v1alpha1.ReasonEnginePodsReady, true, false, false},
		{"terminal and terminating pods are excluded", cb, []corev1.Pod{good, terminating, succeeded, failed}, v1alpha1.ReasonEnginePodsReady, true, false, false},
		{"only terminal pods: awaiting", cb, []corev1.Pod{succeeded, failed, terminating}, v1alpha1.ReasonAwaitingEnginePods, false, true, false},
		{"missing beats mismatched", cb, []corev1.Pod{foreign, missing}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"mismatched beats rollout", cb, []corev1.Pod{stale, foreign}, v1alpha1.ReasonEnginePodsInjectionMismatch, false, false, true},
		{"stale generation beats unavailability", cb, []corev1.Pod{staleUnready, unready}, v1alpha1.ReasonEnginePodsRolloutInProgress, false, true, false},
		{"a newer generation (cache lag) is a rollout, not a fault", cb, []corev1.Pod{good, future}, v1alpha1.ReasonEnginePodsRolloutInProgress, false, true, false},
		{"a forged receipt with canonical flags is not injected", cb, []corev1.Pod{good, forgedCanonical}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"a genuine receipt copied onto another configuration is not injected", cb, []corev1.Pod{copied}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"wrong override values are not injected", cb, []corev1.Pod{wrongOverride}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"injected-by without injected-by-uid is not injected", cb, []corev1.Pod{good, byOnly}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"injected-by-uid without injected-by is not injected", cb, []corev1.Pod{good, uidOnly}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"an incomplete receipt beats a foreign one", cb, []corev1.Pod{foreign, byOnly}, v1alpha1.ReasonEnginePodsNotInjected, false, false, true},
		{"nil selector awaits pods", func() *v1alpha1.CacheBackend {
			c := hiCacheBackend(2)
			c.Spec.EngineSelector.MatchLabels = nil
			return c
		}(), []corev1.Pod{good}, v1alpha1.ReasonAwaitingEnginePods, false, true, false},
		{"a pod the selector does not match is ignored", cb, []corev1.Pod{good, mutate(missing, func(p *corev1.Pod) { p.Labels = nil })}, v1alpha1.ReasonEnginePodsReady, true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := EngineLocal(tc.backend, tc.pods, []receipt.Key{testKey}, inject.Options{})
			assert.Equal(t, tc.reason, h.Reason, h.Message)
			assert.Equal(t, tc.ready, h.Ready, "ready")
			assert.Equal(t, tc.prog, h.Progressing, "progressing")
			assert.Equal(t, tc.degraded, h.Degraded, "degraded")
		})
	}
}
