package controller

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

// Reasons of an engine-local (SGLangHiCache) backend's Ready condition.
const (
	ReasonAwaitingEnginePods          = "AwaitingEnginePods"
	ReasonAllEnginePodsSkipped        = "AllEnginePodsSkipped"
	ReasonEnginePodsNotInjected       = "EnginePodsNotInjected"
	ReasonEnginePodsInjectionMismatch = "EnginePodsInjectionMismatch"
	ReasonEnginePodsRolloutInProgress = "EnginePodsRolloutInProgress"
	ReasonEnginePodsUnavailable       = "EnginePodsUnavailable"
	ReasonEnginePodsReady             = "EnginePodsReady"
)

// engineLocalHealth judges an engine-local backend from its selector-matched
// engine pods. Terminating and terminal pods are left out, and so are pods
// that opt out with the skip-inject annotation (a public control: see the
// design doc). Each remaining pod must carry a receipt that names this
// backend, verifies under keys, is of the current generation, whose
// configuration replays to no change, and be Ready. When pods disagree the
// first verdict of this order wins: not injected, mismatched, rolling out,
// unavailable.
func engineLocalHealth(cb *v1alpha1.CacheBackend, pods []corev1.Pod, keys []receipt.Key, opts inject.Options) health {
	var notInjected, mismatched, rolling, unavailable, ready []string
	active, skipped := 0, 0
	for i := range pods {
		p := &pods[i]
		if !p.DeletionTimestamp.IsZero() || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !inject.Matches(cb.Spec.EngineSelector.MatchLabels, p.Labels) {
			continue
		}
		active++
		if inject.SkipRequested(p.Annotations[inject.AnnotationSkip]) {
			skipped++
			continue
		}
		switch v := classify(cb, p, keys, opts); v {
		case "":
			if podReady(p) {
				ready = append(ready, p.Name)
			} else {
				unavailable = append(unavailable, p.Name)
			}
		case ReasonEnginePodsNotInjected:
			notInjected = append(notInjected, p.Name)
		case ReasonEnginePodsInjectionMismatch:
			mismatched = append(mismatched, p.Name)
		case ReasonEnginePodsRolloutInProgress:
			rolling = append(rolling, p.Name)
		}
	}
	n := len(ready) + len(unavailable) + len(notInjected) + len(mismatched) + len(rolling)
	h := health{Replicas: int32(n), ReadyReplicas: int32(len(ready))}
	switch {
	case active == 0:
		h.Reason, h.Progressing = ReasonAwaitingEnginePods, true
		h.Message = "no active engine pod matches spec.engineSelector"
	case n == 0:
		h.Ready, h.Reason = true, ReasonAllEnginePodsSkipped
		h.Message = fmt.Sprintf("all %d matching engine pods opt out with %s", skipped, inject.AnnotationSkip)
	case len(notInjected) > 0:
		h.Reason, h.Degraded, h.Stalled = ReasonEnginePodsNotInjected, true, true
		h.Message = fmt.Sprintf("%d engine pod(s) without a valid injection receipt or configuration: %s; restart them so the webhook admits them again", len(notInjected), names(notInjected))
	case len(mismatched) > 0:
		h.Reason, h.Degraded, h.Stalled = ReasonEnginePodsInjectionMismatch, true, true
		h.Message = fmt.Sprintf("%d engine pod(s) carry the receipt of another CacheBackend: %s", len(mismatched), names(mismatched))
	case len(rolling) > 0:
		h.Reason, h.Progressing = ReasonEnginePodsRolloutInProgress, true
		h.Message = fmt.Sprintf("%d engine pod(s) run another generation of this CacheBackend (%d): %s; roll the engine workload to apply the current spec", len(rolling), cb.Generation, names(rolling))
	case len(unavailable) > 0:
		h.Reason, h.Degraded = ReasonEnginePodsUnavailable, true
		h.Message = fmt.Sprintf("%d of %d engine pods not Ready: %s", len(unavailable), n, names(unavailable))
	default:
		h.Ready, h.Reason = true, ReasonEnginePodsReady
		h.Message = fmt.Sprintf("%d engine pod(s) injected with generation %d and Ready", n, cb.Generation)
	}
	return h
}

// classify returns "" for a pod wired with the current configuration, or the
// reason it is not.
func classify(cb *v1alpha1.CacheBackend, p *corev1.Pod, keys []receipt.Key, opts inject.Options) string {
	c := inject.ClaimOf(p)
	if c.Backend == "" && c.UID == "" {
		return ReasonEnginePodsNotInjected
	}
	if c.Backend != cb.Namespace+"/"+cb.Name || c.UID != string(cb.UID) {
		return ReasonEnginePodsInjectionMismatch
	}
	if receipt.Verify(keys, p, c) != nil {
		return ReasonEnginePodsNotInjected // hand-written, copied or tampered
	}
	gen, err := strconv.ParseInt(c.Generation, 10, 64)
	if err != nil {
		return ReasonEnginePodsNotInjected
	}
	if gen != cb.Generation {
		// Older: the owner has not rolled the pod since the spec changed.
		// Newer (signed, so genuine): the cache lags the spec change that
		// the pod was admitted with. Both are a rollout, not a fault.
		return ReasonEnginePodsRolloutInProgress
	}
	// Replay the injection on a copy: a converged pod needs no change.
	d := inject.Decide(p, []v1alpha1.CacheBackend{*cb}, opts)
	if d.Outcome != inject.Injected || !equality.Semantic.DeepEqual(p.Spec.Containers, d.Pod.Spec.Containers) {
		return ReasonEnginePodsNotInjected
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// names lists up to three pod names, sorted, so messages are stable.
func names(n []string) string {
	sort.Strings(n)
	if len(n) > 3 {
		return strings.Join(n[:3], ", ") + fmt.Sprintf(" and %d more", len(n)-3)
	}
	return strings.Join(n, ", ")
}
