package evaluate

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

// enginePods is the tally of an engine-local backend's engine pods by
// classification.
type enginePods struct {
	cb                                                   *v1alpha1.CacheBackend
	active, skipped                                      int
	notInjected, mismatched, rolling, unavailable, ready []string
}

func (t enginePods) participating() int {
	return len(t.ready) + len(t.unavailable) + len(t.notInjected) + len(t.mismatched) + len(t.rolling)
}

// engineLocalChain is the readiness contract of an engine-local backend,
// one policy per row; the order is the precedence of the reasons when pods
// disagree: not injected, mismatched, rolling out, unavailable.
var engineLocalChain = Chain[enginePods]{
	noActiveEnginePod,
	allEnginePodsSkipped,
	enginePodsNotInjected,
	enginePodsMismatched,
	enginePodsRollingOut,
	enginePodsUnavailable,
	enginePodsReady,
}

func noActiveEnginePod(t enginePods) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonAwaitingEnginePods, Progressing: true,
		Message: "no active engine pod matches spec.engineSelector"}, t.active == 0
}

func allEnginePodsSkipped(t enginePods) (Verdict, bool) {
	return Verdict{Ready: true, Reason: v1alpha1.ReasonAllEnginePodsSkipped,
		Message: fmt.Sprintf("all %d matching engine pods opt out with %s", t.skipped, v1alpha1.AnnotationSkipInject)}, t.participating() == 0
}

func enginePodsNotInjected(t enginePods) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonEnginePodsNotInjected, Degraded: true, Stalled: true,
		Message: fmt.Sprintf("%d engine pod(s) without a valid injection receipt or configuration: %s; restart them so the webhook admits them again", len(t.notInjected), names(t.notInjected))}, len(t.notInjected) > 0
}

func enginePodsMismatched(t enginePods) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonEnginePodsInjectionMismatch, Degraded: true, Stalled: true,
		Message: fmt.Sprintf("%d engine pod(s) carry the receipt of another CacheBackend: %s", len(t.mismatched), names(t.mismatched))}, len(t.mismatched) > 0
}

func enginePodsRollingOut(t enginePods) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonEnginePodsRolloutInProgress, Progressing: true,
		Message: fmt.Sprintf("%d engine pod(s) run another generation of this CacheBackend (%d): %s; roll the engine workload to apply the current spec", len(t.rolling), t.cb.Generation, names(t.rolling))}, len(t.rolling) > 0
}

func enginePodsUnavailable(t enginePods) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonEnginePodsUnavailable, Degraded: true,
		Message: fmt.Sprintf("%d of %d engine pods not Ready: %s", len(t.unavailable), t.participating(), names(t.unavailable))}, len(t.unavailable) > 0
}

func enginePodsReady(t enginePods) (Verdict, bool) {
	return Verdict{Ready: true, Reason: v1alpha1.ReasonEnginePodsReady,
		Message: fmt.Sprintf("%d engine pod(s) injected with generation %d and Ready", t.participating(), t.cb.Generation)}, true
}

// EngineLocal judges an engine-local backend from its selector-matched
// engine pods. Terminating and terminal pods are left out, and so are pods
// that opt out with the skip-inject annotation (a public control: see the
// design doc). Each remaining pod must carry a receipt that names this
// backend, verifies under keys, is of the current generation, whose
// configuration replays to no change, and be Ready.
func EngineLocal(cb *v1alpha1.CacheBackend, pods []corev1.Pod, keys []receipt.Key, opts inject.Options) Verdict {
	t := enginePods{cb: cb}
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !cb.Spec.EngineSelector.Matches(p.Labels) {
			continue
		}
		t.active++
		if inject.SkipRequested(p.Annotations[v1alpha1.AnnotationSkipInject]) {
			t.skipped++
			continue
		}
		switch Classify(cb, p, keys, opts) {
		case "":
			if PodReady(p) {
				t.ready = append(t.ready, p.Name)
			} else {
				t.unavailable = append(t.unavailable, p.Name)
			}
		case v1alpha1.ReasonEnginePodsNotInjected:
			t.notInjected = append(t.notInjected, p.Name)
		case v1alpha1.ReasonEnginePodsInjectionMismatch:
			t.mismatched = append(t.mismatched, p.Name)
		case v1alpha1.ReasonEnginePodsRolloutInProgress:
			t.rolling = append(t.rolling, p.Name)
		}
	}
	v := engineLocalChain.Evaluate(t)
	v.Replicas, v.ReadyReplicas = int32(t.participating()), int32(len(t.ready))
	return v
}

// Classify returns "" for a pod wired with cb's current configuration, or
// the engine-local reason it is not. The receipt is judged by
// receipt.Judge, the verdict the receipts controller and the CLI use too.
func Classify(cb *v1alpha1.CacheBackend, p *corev1.Pod, keys []receipt.Key, opts inject.Options) string {
	j := receipt.Judge(p, cb, keys)
	switch j.Verdict {
	case receipt.Valid:
	case receipt.Foreign, receipt.WrongUID:
		return v1alpha1.ReasonEnginePodsInjectionMismatch
	default:
		// Absent, incomplete, hand-written, copied or tampered.
		return v1alpha1.ReasonEnginePodsNotInjected
	}
	gen, err := strconv.ParseInt(j.Claim.Generation, 10, 64)
	if err != nil {
		return v1alpha1.ReasonEnginePodsNotInjected
	}
	if gen != cb.Generation {
		// Older: the owner has not rolled the pod since the spec changed.
		// Newer (signed, so genuine): the cache lags the spec change that
		// the pod was admitted with. Both are a rollout, not a fault.
		return v1alpha1.ReasonEnginePodsRolloutInProgress
	}
	// Replay the injection on a copy: a converged pod needs no change.
	d := inject.Decide(p, []v1alpha1.CacheBackend{*cb}, opts)
	if d.Outcome != inject.Injected || !equality.Semantic.DeepEqual(p.Spec.Containers, d.Pod.Spec.Containers) {
		return v1alpha1.ReasonEnginePodsNotInjected
	}
	return ""
}

// PodReady reports whether p's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// names lists up to three pod names, sorted, so messages are stable.
func names(n []string) string {
	n = slices.Clone(n)
	sort.Strings(n)
	if len(n) > 3 {
		return strings.Join(n[:3], ", ") + fmt.Sprintf(" and %d more", len(n)-3)
	}
	return strings.Join(n, ", ")
}
