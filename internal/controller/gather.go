package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/rollout"
	"github.com/inferencecache/operator/internal/topology"
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

// Evictions counts engine pods evicted by the per-node cascade of
// multiprocess mode.
var Evictions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_engine_evictions_total",
	Help: "Engine pods evicted because the node-local cache server of their node (multiprocess mode) was replaced or restarted, by namespace and CacheBackend.",
}, []string{"namespace", "cachebackend"})

// EvictionsForbidden counts engine pods the per-node cascade could not
// evict because the operator may not (an install without the
// engine-eviction grant): they need a restart by hand.
var EvictionsForbidden = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_engine_evictions_forbidden_total",
	Help: "Engine pods the per-node cascade of multiprocess mode was not allowed to evict (no pods/eviction grant), to be restarted by hand, by namespace and CacheBackend.",
}, []string{"namespace", "cachebackend"})

func init() { metrics.Registry.MustRegister(Cascades, Heals, Evictions, EvictionsForbidden) }

// observation is what a reconcile reads before it plans.
type observation struct {
	// matched counts the non-terminating pods the engine selector matches
	// and cb claims (claimedPods).
	matched int32
	// claimedElsewhere counts the pods the selector matches that another
	// CacheBackend claims, by its name.
	claimedElsewhere map[string]int
	// wired are the matched pods that carry cb's receipt and the
	// kvevent-subscriber sidecar (the pods the KV-block index should know).
	wired []evaluate.IndexPod
	// engines are the matched pods' metadata (labels and annotations are
	// what the wiring report reads).
	engines []metav1.PartialObjectMetadata
	// keys are the receipt keys, keysRead whether they were read, keysErr
	// why they could not be (server-backed backends: only the wiring
	// report and the cascade need them).
	keys     []receipt.Key
	keysRead bool
	keysErr  error
	// plan is the plan's input (server-backed backends).
	plan plan.Input
	// enginePods are an engine-local backend's full engine pods, read from
	// the API server.
	enginePods []corev1.Pod
}

// gather reads what the plan and the evaluation of s.cb need.
func (r *CacheBackendReconciler) gather(ctx context.Context, s *pass) error {
	cb, obs := s.cb, &s.obs
	sel := cb.Spec.EngineSelector.MatchLabels
	claims, err := r.claimedPods(ctx, cb)
	if err != nil {
		return err
	}
	pods := claims.mine
	obs.claimedElsewhere = claims.others
	for i := range pods {
		if pods[i].DeletionTimestamp.IsZero() {
			obs.matched++
			obs.engines = append(obs.engines, pods[i])
		}
	}
	r.recordEngineMatch(s)
	if obs.wired, err = r.indexPods(ctx, cb, pods); err != nil {
		return err
	}
	if topology.Of(cb) == topology.EngineLocal {
		// Without a pod list or keys there is no trustworthy verdict: the
		// reconcile stops and the previous one stands.
		if len(sel) > 0 {
			var pods corev1.PodList
			if err := r.APIReader.List(ctx, &pods, client.InNamespace(cb.Namespace), client.MatchingLabels(sel)); err != nil {
				return fmt.Errorf("listing engine pods (previous verdict kept): %w", err)
			}
			obs.enginePods = pods.Items
			if claims.backends != nil {
				// Those another backend claims are not this one's
				// engines.
				obs.enginePods = slices.DeleteFunc(obs.enginePods, func(p corev1.Pod) bool {
					mine, _ := claimedBy(cb.Name, p.Labels, claims.backends)
					return !mine
				})
			}
		}
		if _, err := r.keysOf(ctx, s); err != nil {
			return fmt.Errorf("reading receipt keys (previous verdict kept): %w", err)
		}
	} else if len(obs.engines) > 0 {
		// Only the wiring report needs the keys: without them it says
		// Unknown, and the reconcile goes on.
		_, _ = r.keysOf(ctx, s)
	}
	obs.plan, err = plan.Gather(ctx, r.Client, r.servers(), cb)
	return err
}

// errNoKeyRing: the reconciler runs without a receipt key ring (only
// tests build one so), so no receipt can be verified.
var errNoKeyRing = errors.New("no receipt key ring configured")

// keysOf reads the receipt keys once per pass; without a key ring it says
// so instead of failing on a nil ring.
func (r *CacheBackendReconciler) keysOf(ctx context.Context, s *pass) ([]receipt.Key, error) {
	obs := &s.obs
	if !obs.keysRead {
		obs.keysRead = true
		if r.Keys == nil {
			obs.keysErr = errNoKeyRing
		} else {
			obs.keys, obs.keysErr = r.Keys.Keys(ctx)
		}
	}
	return obs.keys, obs.keysErr
}

// observed is what a reconcile reads after the apply, and the facts the
// evaluation takes from it.
type observed struct {
	// facts are the server-backed evaluation's facts.
	facts evaluate.Facts
	// wiring is the tally of the matched pods by their receipts.
	wiring evaluate.Wiring
	// index are the IndexSynced evaluation's facts, the index's summary
	// read when the KV-event gate is open.
	index evaluate.IndexFacts
	// roll is what decides the engine rolls (rollout.State), candidates
	// what they may roll, read only when the cascade or the heal needs
	// them (rollout.Gather).
	roll       rollout.RollState
	candidates rollout.Candidates
	// serverPods are the serving cache-server pods.
	serverPods []corev1.Pod
}

// observe makes every read after the apply: the workload of the kind the
// spec asks for (a workload of the other kind, being pruned, is never
// advertised), its serving pods, the functional probe, the live status
// when the cache may lag it, the KV-block index once the gate opens, and
// the engine workloads a roll would write. Which of them it reads follows
// from what it read before, with the pure evaluations.
func (r *CacheBackendReconciler) observe(ctx context.Context, s *pass) error {
	cb, p, seen := s.cb, s.plan, &s.seen
	seen.facts = evaluate.Facts{ApplyErr: s.applyErr, StorageNote: p.StorageNote, NameConflict: p.ConflictMessage()}
	serving := !p.EngineLocal && s.applyErr == nil && seen.facts.NameConflict == ""
	var change evaluate.ServerChange
	if serving {
		var err error
		if change, err = r.observeServer(ctx, s); err != nil {
			return err
		}
	}
	s.verdict = r.serve(s)
	keys := s.obs.keys
	if s.obs.keysErr != nil {
		keys = nil
	}
	seen.wiring = evaluate.TallyWiring(cb, s.obs.engines, keys, topology.Since(cb))
	// The roll state from the publication this process last wrote (or
	// the cache shows); from the live status's below when read.
	rf := rollout.Facts{
		Backend: cb, EngineLocal: p.EngineLocal, ApplyFailed: s.applyErr != nil,
		Workload: seen.facts.Workload, ServerPods: seen.serverPods, Change: change, StorageHeld: seen.facts.StorageHold != "",
		Ready: s.verdict.Ready, Available: s.verdict.Available, Wiring: seen.wiring,
		Status: s.st, Want: topology.Endpoint(cb, r.Inject.ClusterDomain), Now: r.Now().Time,
	}
	seen.roll = rollout.State(rf)
	if serving && ((evaluate.Health(seen.facts.Workload).Available && cb.Status.FirstAvailableAt == nil) || change.Changed || seen.roll.Heal()) {
		// The cache may lag a status write: read the live status.
		live := &v1alpha1.CacheBackend{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(cb), live); err == nil {
			seen.facts.FirstAvailableAt = live.Status.FirstAvailableAt
			rf.Status, rf.Live = &live.Status, true
			seen.roll = rollout.State(rf)
		}
		if seen.facts.FirstAvailableAt == nil {
			now := r.Now()
			seen.facts.FirstAvailableAt = &now
		}
	}
	seen.index = r.indexFacts(cb, s.obs.wired, s.verdict.Available || (p.EngineLocal && s.verdict.Ready))
	r.readIndex(ctx, cb, &seen.index)
	return r.observeRolls(ctx, s)
}

// observeServer reads the server workload, its serving pods and the
// functional probe's result into the pass's facts.
func (r *CacheBackendReconciler) observeServer(ctx context.Context, s *pass) (evaluate.ServerChange, error) {
	cb, f := s.cb, &s.seen.facts
	if h := s.plan.WorkloadHold(); h != nil {
		f.StorageHold = h.Message
	}
	w, err := workload.Read(ctx, r.Client, cb)
	if err != nil {
		return evaluate.ServerChange{}, err
	}
	f.Workload = w
	pods, err := w.ServingPods(ctx, r.servers(), render.SelectorLabels(cb))
	if err != nil {
		return evaluate.ServerChange{}, err
	}
	s.seen.serverPods = pods
	change := evaluate.ObserveServer(cb.Status.ObservedServerInstance, evaluate.ServerPods(pods, w.PerNode()))
	// Multiprocess mode has no functional probe: its node-local Service
	// reaches only the manager's own node, and each server pod's readiness
	// is its kubelet's GET /healthcheck (render.MPProbe).
	if evaluate.Health(w).Ready && f.StorageHold == "" && r.Prober != nil && topology.Of(cb) != topology.Multiprocess {
		s.probed = true
		f.Probed = true
		f.ProbeErr, _ = r.Prober.Check(ctx, cb)
	}
	return change, nil
}

// observeRolls reads the engine workloads the cascade or the heal would
// roll, only when the roll state says they roll now.
func (r *CacheBackendReconciler) observeRolls(ctx context.Context, s *pass) error {
	var err error
	s.seen.candidates, err = rollout.Gather(ctx, r.Client, r.APIReader, s.cb, s.seen.roll,
		func() ([]receipt.Key, error) { return r.keysOf(ctx, s) }, s.seen.wiring.Early)
	return err
}
