package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/workload"
)

// This file holds every read of the cluster a CacheBackend reconcile makes:
// gather before the plan, observe after the apply. Everything between and
// after them (plan, evaluate) is pure.

// Cascades counts engine Deployments rolled after a cache-server change.
var Cascades = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_restart_cascades_total",
	Help: "Engine Deployments rolled because their cache server was replaced or restarted, by namespace and CacheBackend.",
}, []string{"namespace", "cachebackend"})

// Heals counts engine workloads rolled because their pods were admitted
// before the endpoint existed.
var Heals = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_engine_heals_total",
	Help: "Engine Deployments and StatefulSets rolled because their pods were admitted before the cache endpoint existed, by namespace and CacheBackend.",
}, []string{"namespace", "cachebackend"})

func init() { metrics.Registry.MustRegister(Cascades, Heals) }

// observation is what a reconcile reads before it plans.
type observation struct {
	// matched counts the non-terminating pods the engine selector matches;
	// matchedKnown is false when they could not be listed.
	matched      int32
	matchedKnown bool
	// wired are the matched pods that carry cb's receipt and the
	// kvevent-subscriber sidecar (the pods the KV-block index should know).
	wired []evaluate.IndexPod
	// engines are the matched pods' metadata (labels and annotations are
	// what the wiring report reads).
	engines []metav1.PartialObjectMetadata
	// keysErr is why the receipt keys could not be read (server-backed
	// backends: only the wiring report needs them).
	keysErr error
	// plan is the plan's input (server-backed backends).
	plan plan.Input
	// enginePods and keys are an engine-local backend's full engine pods,
	// read from the API server, and the receipt keys.
	enginePods []corev1.Pod
	keys       []receipt.Key
}

// gather reads what the plan and the evaluation of cb need.
func (r *CacheBackendReconciler) gather(ctx context.Context, cb *v1alpha1.CacheBackend) (observation, error) {
	var obs observation
	sel := cb.Spec.EngineSelector.MatchLabels
	pods, err := r.matchedPods(ctx, cb)
	if err != nil {
		return obs, err
	}
	for i := range pods {
		if pods[i].DeletionTimestamp.IsZero() {
			obs.matched++
			obs.engines = append(obs.engines, pods[i])
		}
	}
	obs.matchedKnown = true
	if obs.wired, err = r.indexPods(ctx, cb, pods); err != nil {
		return obs, err
	}
	if cb.Spec.Type == v1alpha1.BackendTypeSGLangHiCache {
		// Without a pod list or keys there is no trustworthy verdict: the
		// reconcile stops and the previous one stands.
		if len(sel) > 0 {
			var pods corev1.PodList
			if err := r.APIReader.List(ctx, &pods, client.InNamespace(cb.Namespace), client.MatchingLabels(sel)); err != nil {
				return obs, fmt.Errorf("listing engine pods (previous verdict kept): %w", err)
			}
			obs.enginePods = pods.Items
		}
		keys, err := r.receiptKeys(ctx)
		if err != nil {
			return obs, fmt.Errorf("reading receipt keys (previous verdict kept): %w", err)
		}
		obs.keys = keys
	} else if len(obs.engines) > 0 {
		// Only the wiring report needs the keys: without them it says
		// Unknown, and the reconcile goes on.
		obs.keys, obs.keysErr = r.receiptKeys(ctx)
	}
	in, err := plan.Gather(ctx, r.Client, r.servers(), cb)
	obs.plan = in
	return obs, err
}

// errNoKeyRing: the reconciler runs without a receipt key ring (only
// tests build one so), so no receipt can be verified.
var errNoKeyRing = errors.New("no receipt key ring configured")

// receiptKeys reads the receipt keys; without a key ring it says so
// instead of failing on a nil ring.
func (r *CacheBackendReconciler) receiptKeys(ctx context.Context) ([]receipt.Key, error) {
	if r.Keys == nil {
		return nil, errNoKeyRing
	}
	return r.Keys.Keys(ctx)
}

// serverObservation is the cache-server pods as read after the apply.
type serverObservation struct {
	change  evaluate.ServerChange
	settled bool
}

// observe reads, after the apply, what the evaluation needs: the workload
// of the kind the spec asks for (a workload of the other kind, being
// pruned, is never advertised), its serving pods, the live status when it
// is needed, and the functional probe's result.
func (r *CacheBackendReconciler) observe(ctx context.Context, s *pass, p plan.Plan, applyErr error) (evaluate.Facts, serverObservation, error) {
	f := evaluate.Facts{ApplyErr: applyErr, StorageNote: p.StorageNote, NameConflict: p.ConflictMessage()}
	var srv serverObservation
	if p.EngineLocal || applyErr != nil || f.NameConflict != "" {
		return f, srv, nil
	}
	cb := s.cb
	if h := p.StatefulSetHold(); h != nil {
		f.StorageHold = h.Message
	}
	w, err := workload.Read(ctx, r.Client, cb)
	if err != nil {
		return f, srv, err
	}
	f.Workload = w
	pods, err := r.serverPods(ctx, cb, w)
	if err != nil {
		return f, srv, err
	}
	srv.change = evaluate.ObserveServer(cb.Status.ObservedServerInstance, pods)
	wv := evaluate.Health(w)
	if (wv.Available && cb.Status.FirstAvailableAt == nil) || srv.change.Changed {
		// The cache may lag a status write: read the live status.
		live := &v1alpha1.CacheBackend{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cb), live); err == nil {
			f.FirstAvailableAt = live.Status.FirstAvailableAt
			srv.settled = r.endpointSettled(cb, live)
		}
		if f.FirstAvailableAt == nil {
			now := r.Now()
			f.FirstAvailableAt = &now
		}
	}
	if wv.Ready && f.StorageHold == "" && r.Prober != nil {
		s.probed = true
		f.Probed = true
		f.ProbeErr, _ = r.Prober.Check(ctx, cb)
	}
	return f, srv, nil
}

// endpointSettled reports whether engines rolled now will be wired: the
// live status publishes the endpoint and has been Ready for a few seconds,
// so that the webhook's cache, which lags the API server, holds it too.
func (r *CacheBackendReconciler) endpointSettled(cb, live *v1alpha1.CacheBackend) bool {
	ready := meta.FindStatusCondition(live.Status.Conditions, v1alpha1.ConditionReady)
	return live.Status.Endpoint == render.Endpoint(cb, r.Inject.ClusterDomain) && ready != nil && ready.Status == metav1.ConditionTrue &&
		r.Now().Sub(ready.LastTransitionTime.Time) >= endpointSettleTime
}

// serverPods lists the serving pods of the workload (workload.Server's
// ServingPods: the pods it controls, not terminating; pods that merely
// carry the labels are not trusted).
func (r *CacheBackendReconciler) serverPods(ctx context.Context, cb *v1alpha1.CacheBackend, w workload.Server) ([]evaluate.ServerPod, error) {
	pods, err := w.ServingPods(ctx, r.servers(), render.SelectorLabels(cb))
	if err != nil {
		return nil, err
	}
	out := make([]evaluate.ServerPod, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		var restarts int32
		for _, c := range p.Status.ContainerStatuses {
			restarts += c.RestartCount
		}
		out = append(out, evaluate.ServerPod{UID: string(p.UID), Restarts: restarts, Ready: evaluate.PodReady(p)})
	}
	return out, nil
}
