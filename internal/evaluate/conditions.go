package evaluate

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Outcome is what one evaluated reconcile publishes: the whole condition
// set (Ready through Stalled from the verdict, EnginesWired, IndexSynced,
// FunctionalProbeOK) and the status fields beside them. The reconcile
// builds it from pure evaluations; Publish writes it.
type Outcome struct {
	// Verdict decides Ready, Progressing, Reconciling, Degraded and
	// Stalled, and the replica counts.
	Verdict Verdict
	// Wiring decides EnginesWired; Wired and Unwired are
	// status.wiredEnginePods and status.unwiredEnginePods.
	Wiring         WiringReport
	Wired, Unwired int32
	// Observed: spec.observation is set (without it there is no IndexSynced
	// and no indexParticipation). Index decides IndexSynced.
	Observed      bool
	Index         IndexVerdict
	Participation *v1alpha1.IndexParticipation
	// Probed: the functional probe ran (FunctionalProbeOK is removed
	// otherwise: its verdict holds only while the backend is probed);
	// ProbeErr is its failure.
	Probed   bool
	ProbeErr error
	// Endpoint is status.endpoint ("" when none is published);
	// FirstAvailableAt is recorded when none is yet; Now is recorded as
	// status.endpointPublishedAt when the endpoint appears or changes;
	// Capacity is status.capacity.
	Endpoint         string
	FirstAvailableAt *metav1.Time
	Now              metav1.Time
	Capacity         *resource.Quantity
	// ServerInstance, when Record is set and no restart failed (RollErr),
	// is recorded as status.observedServerInstance.
	ServerInstance string
	Record         bool
	// RollErr is the failure of the engine restarts this reconcile
	// planned: the identity stays unrecorded, so they are retried, and
	// Reconciling is True with EngineRestartsRetrying.
	RollErr error
	// Multiprocess is status.multiprocess (NodeServers; nil without
	// per-node servers).
	Multiprocess *v1alpha1.MultiprocessStatus
	// Storage decides StoragePersistent (StorageOf); nil removes it.
	Storage *metav1.Condition
}

// StorageOf is the StoragePersistent condition of cb: nil without
// spec.storage.pvc; with it, False: the in-process lmcache_server (LMCache
// 0.5), the only server that takes spec.storage, keeps KV in memory, so
// the claims it mounts at /data are never written. The admission warning
// says so once, to whoever applies; the condition says so to whoever
// reads the status (a GitOps tool, a dashboard) for as long as it holds.
func StorageOf(cb *v1alpha1.CacheBackend) *metav1.Condition {
	if cb.Spec.Storage == nil || cb.Spec.Storage.PVC == nil {
		return nil
	}
	claims := "the claim " + cb.Name + "-data"
	if cb.Spec.DeploymentKind == v1alpha1.DeploymentKindStatefulSet {
		claims = "each replica's claim (cache-data-" + cb.Name + "-<n>)"
	}
	return &metav1.Condition{Type: v1alpha1.ConditionStoragePersistent, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonServerKeepsKVInMemory,
		Message: "lmcache_server (LMCache 0.5) keeps KV in memory only: " + claims + " is mounted at /data but never written, status.capacity holds no KV, " +
			"and a restarted server starts empty; for KV that outlives a restart use spec.lmCache.localDisk (the engines' disk tier) or spec.multiprocess with an L2 disk"}
}

// Publish writes o into st as the status of generation gen. It is the one
// writer of an evaluated reconcile's conditions (SetNotEvaluated is the
// one of a reconcile that stopped before it evaluated). Conditions keep
// their lastTransitionTime while their status does not change.
func Publish(st *v1alpha1.CacheBackendStatus, gen int64, o Outcome) {
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	st.ObservedGeneration = gen
	st.Capacity = o.Capacity
	switch {
	case o.Endpoint == "":
		st.EndpointPublishedAt = nil
	case st.Endpoint != o.Endpoint || st.EndpointPublishedAt == nil:
		now := o.Now
		st.EndpointPublishedAt = &now
	}
	st.Endpoint = o.Endpoint
	st.Multiprocess = o.Multiprocess
	if o.Endpoint != "" && st.FirstAvailableAt == nil {
		st.FirstAvailableAt = o.FirstAvailableAt
	}
	if o.Record && o.RollErr == nil {
		st.ObservedServerInstance = o.ServerInstance
	}
	st.IndexParticipation = nil
	if o.Observed {
		st.IndexParticipation = o.Participation
		set(v1alpha1.ConditionIndexSynced, o.Index.Status, o.Index.Reason, o.Index.Message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionIndexSynced)
	}
	st.WiredEnginePods, st.UnwiredEnginePods = o.Wired, o.Unwired
	set(v1alpha1.ConditionEnginesWired, o.Wiring.Status, o.Wiring.Reason, o.Wiring.Message)
	switch {
	case !o.Probed:
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionFunctionalProbeOK)
	case o.ProbeErr != nil:
		set(v1alpha1.ConditionFunctionalProbeOK, metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, o.ProbeErr.Error())
	default:
		set(v1alpha1.ConditionFunctionalProbeOK, metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, "the cache server answers LMCache's HEALTH request")
	}
	if o.Storage != nil {
		set(o.Storage.Type, o.Storage.Status, o.Storage.Reason, o.Storage.Message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStoragePersistent)
	}
	setServing(st, gen, o.Verdict, o.RollErr)
}

// setServing writes the conditions that follow from the verdict v and
// the engine restarts' failure rollErr, and the replica counts.
func setServing(st *v1alpha1.CacheBackendStatus, gen int64, v Verdict, rollErr error) {
	st.Replicas, st.ReadyReplicas = v.Replicas, v.ReadyReplicas
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen,
		})
	}
	set(v1alpha1.ConditionReady, v.Ready, v.Reason, v.Message)
	if v.Progressing {
		set(v1alpha1.ConditionProgressing, true, v.Reason, v.Message)
	} else {
		set(v1alpha1.ConditionProgressing, false, v1alpha1.ReasonStable, "no rollout in progress")
	}
	if v.Degraded {
		set(v1alpha1.ConditionDegraded, true, v.Reason, v.Message)
	} else {
		set(v1alpha1.ConditionDegraded, false, v1alpha1.ReasonStable, "not degraded")
	}
	if v.Stalled {
		set(v1alpha1.ConditionStalled, true, v.Reason, v.Message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	}
	// Reconciling is decided once, so that it keeps its transition time
	// while it stays True (whatever its reason).
	switch {
	case rollErr != nil:
		// Engine restarts failed: retried until they succeed.
		set(v1alpha1.ConditionReconciling, true, v1alpha1.ReasonEngineRestartsRetrying, Brief(rollErr))
	case v.Progressing:
		set(v1alpha1.ConditionReconciling, true, v.Reason, v.Message)
	case v.Degraded && !v.Stalled:
		// Replicas are being replaced by the workload's controller: kstatus
		// should read the backend as in progress, not current.
		set(v1alpha1.ConditionReconciling, true, v.Reason, v.Message)
	default:
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionReconciling)
	}
}

// SetNotEvaluated records a reconcile that stopped, with reason and msg,
// before it evaluated generation gen: Reconciling=True says so and
// observedGeneration is left as it was. Ready keeps its verdict only when
// that verdict was computed for gen (the seed's rule for engine-local
// backends: a failed pod list keeps the published verdict); otherwise
// Ready is Unknown, so the status never claims more than was evaluated.
func SetNotEvaluated(st *v1alpha1.CacheBackendStatus, gen int64, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
	if ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); ready != nil && ready.ObservedGeneration == gen && st.ObservedGeneration == gen {
		return
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionUnknown, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}
