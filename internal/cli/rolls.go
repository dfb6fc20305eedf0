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
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/workload"
)

// PreviewRolls plans the engine rolls a reconcile of live would make now,
// with the controller's own roll plan: rollout.State of the facts read
// from the cluster and the live status, rollout.Gather of its candidates,
// rollout.Decide. hold is the plan's StatefulSet hold (its storage cannot
// change: nothing rolls). keys are the receipt keys (nil: receipts naming
// the backend are not verified, and neither the cascade nor the heal can
// be previewed).
func PreviewRolls(ctx context.Context, c client.Reader, live *v1alpha1.CacheBackend, hold bool, keys []receipt.Key, now time.Time) (rollout.RollPlan, error) {
	if topology.Of(live) == topology.EngineLocal {
		return rollout.RollPlan{}, nil // runs no server: nothing rolls
	}
	w, err := workload.Read(ctx, c, live)
	if err != nil {
		return rollout.RollPlan{}, err
	}
	pods, err := w.ServingPods(ctx, c, render.SelectorLabels(live))
	if err != nil {
		return rollout.RollPlan{}, err
	}
	var engines []metav1.PartialObjectMetadata
	if sel := live.Spec.EngineSelector.MatchLabels; len(sel) > 0 {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := c.List(ctx, list, client.InNamespace(live.Namespace), client.MatchingLabels(sel)); err != nil {
			return rollout.RollPlan{}, fmt.Errorf("listing engine pods: %w", err)
		}
		engines = list.Items
	}
	ready := meta.FindStatusCondition(live.Status.Conditions, v1alpha1.ConditionReady)
	tally := evaluate.TallyWiring(live, engines, keys, topology.Since(live))
	state := rollout.State(rollout.Facts{
		Backend: live, Workload: w, ServerPods: pods,
		Change:      evaluate.ObserveServer(live.Status.ObservedServerInstance, evaluate.ServerPods(pods, w.PerNode())),
		StorageHeld: hold, Ready: ready != nil && ready.Status == metav1.ConditionTrue,
		// The status publishes an endpoint while the backend is available;
		// the CLI previews from it, whichever endpoint it shows.
		Available: live.Status.Endpoint != "", Wiring: tally,
		Status: &live.Status, Live: true, Now: now,
	})
	cands, err := rollout.Gather(ctx, c, c, live, state, func() ([]receipt.Key, error) {
		if keys == nil {
			return nil, fmt.Errorf("a cache-server pod was replaced or restarted, and the receipt keys are needed to find the wired engines")
		}
		return keys, nil
	}, tally.Early)
	if err != nil {
		return rollout.RollPlan{}, err
	}
	return rollout.Decide(state, cands), nil
}

// rollCause says why a reconcile rolls a workload, for a person.
func rollCause(c rollout.RollCause) string {
	switch c {
	case rollout.CauseServerChange:
		return "a cache-server pod was replaced or restarted, and it has pods wired to it"
	case rollout.CauseAdmittedBeforeEndpoint:
		return "it has pods admitted before the endpoint existed, unwired"
	}
	return string(c)
}
