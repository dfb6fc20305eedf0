package cli

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/workload"
)

// previewRolls plans the engine rolls a reconcile of live would make now,
// with the controller's own roll plan (plan.RollsPerNode over the
// candidates plan.WiredWorkloads or, for per-node servers, plan.WiredPods,
// and plan.EarlyWorkloads read), from the live status
// and the cluster as the controller observes them. hold is the plan's
// StatefulSet hold (its storage cannot change: nothing rolls). keys are
// the receipt keys (nil: receipts naming the backend are not verified, and
// neither the cascade nor the heal can be previewed).
func previewRolls(ctx context.Context, c client.Reader, live *v1alpha1.CacheBackend, hold bool, keys []receipt.Key, now time.Time) (plan.RollPlan, error) {
	if live.Spec.Type == v1alpha1.BackendTypeSGLangHiCache {
		return plan.RollPlan{}, nil // runs no server: nothing rolls
	}
	w, err := workload.Read(ctx, c, live)
	if err != nil {
		return plan.RollPlan{}, err
	}
	pods, err := w.ServingPods(ctx, c, render.SelectorLabels(live))
	if err != nil {
		return plan.RollPlan{}, err
	}
	servers := evaluate.ServerPods(pods, w.PerNode())
	change := evaluate.ObserveServer(live.Status.ObservedServerInstance, servers)
	ready := meta.FindStatusCondition(live.Status.Conditions, v1alpha1.ConditionReady)
	isReady := ready != nil && ready.Status == metav1.ConditionTrue
	var engines []metav1.PartialObjectMetadata
	if sel := live.Spec.EngineSelector.MatchLabels; len(sel) > 0 {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := c.List(ctx, list, client.InNamespace(live.Namespace), client.MatchingLabels(sel)); err != nil {
			return plan.RollPlan{}, fmt.Errorf("listing engine pods: %w", err)
		}
		engines = list.Items
	}
	tally := evaluate.TallyWiring(live, engines, keys, evaluate.EndpointSince(live))
	state := plan.RollState{
		Policy: live.Spec.EngineRestartPolicy, Instance: change.Instance, Changed: change.Changed,
		ServerAvailable: !hold && evaluate.Health(w).Available, Ready: isReady, Multiprocess: render.IsMultiprocess(live),
		Early: len(tally.Early) > 0, KeysUnavailable: tally.KeysUnavailable,
	}
	state.SetPerNode(w, servers, change, now)
	if state.Multiprocess {
		// The CLI previews from the live status: the endpoint it
		// publishes is the one served (the controller's want).
		state.Published = evaluate.Publication(&live.Status, "")
	}
	state.Settled = evaluate.EndpointSettled(&live.Status, "", state.Multiprocess, now)
	var wired, early []plan.Candidate
	var enginePods []plan.EnginePod
	if state.Cascade() {
		if keys == nil {
			return plan.RollPlan{}, fmt.Errorf("a cache-server pod was replaced or restarted, and the receipt keys are needed to find the wired engines")
		}
		if state.PerNode {
			enginePods, err = plan.WiredPods(ctx, c, c, live, keys)
		} else {
			wired, err = plan.WiredWorkloads(ctx, c, c, live, keys)
		}
		if err != nil {
			return plan.RollPlan{}, err
		}
	}
	if state.Heal() && state.Settled {
		if early, err = plan.EarlyWorkloads(ctx, c, live.Namespace, tally.Early); err != nil {
			return plan.RollPlan{}, err
		}
	}
	return plan.RollsPerNode(state, wired, early, enginePods), nil
}

// rollCause says why a reconcile rolls a workload, for a person.
func rollCause(c plan.RollCause) string {
	switch c {
	case plan.CauseServerChange:
		return "a cache-server pod was replaced or restarted, and it has pods wired to it"
	case plan.CauseAdmittedBeforeEndpoint:
		return "it has pods admitted before the endpoint existed, unwired"
	}
	return string(c)
}
