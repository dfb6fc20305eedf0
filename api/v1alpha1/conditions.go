package v1alpha1

// Condition types published in status.conditions. Ready, Progressing and
// Degraded are always present. Reconciling and Stalled are kstatus's
// abnormal-true conditions: present only while true, so that kstatus (Flux,
// kubectl wait, cli-utils) reads a rolling backend as InProgress and a stuck
// one as Failed.
const (
	ConditionReady       = "Ready"
	ConditionProgressing = "Progressing"
	ConditionDegraded    = "Degraded"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// Condition reasons. A reason is API: tools and alerts match on it.
const (
	// ReasonBackendReady: the cache server is rolled out and every replica is available.
	ReasonBackendReady = "BackendReady"
	// ReasonRolloutInProgress: the workload is being created or rolled out.
	ReasonRolloutInProgress = "RolloutInProgress"
	// ReasonReplicasUnavailable: the rollout finished but replicas are not available.
	ReasonReplicasUnavailable = "ReplicasUnavailable"
	// ReasonProgressDeadlineExceeded: the workload's rollout stopped making progress.
	ReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
	// ReasonApplyFailed: the API server refused a child object.
	ReasonApplyFailed = "ApplyFailed"
	// ReasonEngineLocal: an engine-local backend (SGLangHiCache) runs no server.
	ReasonEngineLocal = "EngineLocal"
	// ReasonStable: nothing is progressing or degraded.
	ReasonStable = "Stable"
)

// Event reasons recorded on CacheBackends.
const (
	// EventEngineSelectorUnmatched: the selector matches no pod, observed first or after matches dropped to zero.
	EventEngineSelectorUnmatched = "EngineSelectorUnmatched"
	// EventChildrenApplied: child objects were created, changed or pruned.
	EventChildrenApplied = "ChildrenApplied"
	// EventApplyFailed: applying the children failed.
	EventApplyFailed = "ApplyFailed"
	// EventBackendReady: the backend became Ready.
	EventBackendReady = "BackendReady"
)

// The functional probe's condition and reasons.
const (
	// ConditionFunctionalProbeOK: the cache server accepted a connection on
	// its port (present only while the backend is probed).
	ConditionFunctionalProbeOK = "FunctionalProbeOK"
	// ReasonProbeSucceeded: the last functional probe connected.
	ReasonProbeSucceeded = "ProbeSucceeded"
	// ReasonProbeFailed: the last functional probe did not connect.
	ReasonProbeFailed = "ProbeFailed"
	// ReasonFunctionalProbeFailed is Ready's reason while the workload is
	// ready but the server does not answer.
	ReasonFunctionalProbeFailed = "FunctionalProbeFailed"
)

// Reasons of a reconcile that stopped before its conditions were evaluated:
// Reconciling=True carries one of them, observedGeneration stays where it
// was, and Ready keeps a verdict only if it was computed for the current
// generation (Unknown otherwise).
const (
	// ReasonObservationFailed: the cluster state the reconcile needs could
	// not be read (a list or get failed, the receipt keys are unavailable).
	ReasonObservationFailed = "ObservationFailed"
	// ReasonPlanFailed: the child objects could not be planned.
	ReasonPlanFailed = "PlanFailed"
	// ReasonProgressingWithRetry: a step after the apply failed; the
	// reconcile is retried.
	ReasonProgressingWithRetry = "ProgressingWithRetry"
)

// Reasons of a backend whose children cannot be written.
const (
	// ReasonNameConflict: an object exists under a name the backend's
	// children need (the Service, the workload, the autoscaler, a claim)
	// and the backend does not control it. The operator never adopts it:
	// nothing is applied until it is renamed or deleted.
	ReasonNameConflict = "NameConflict"
)

// Reasons of a StatefulSet backend's storage.
const (
	// ReasonImmutableStatefulSetStorage: the spec's storage differs from the
	// live StatefulSet's volumeClaimTemplates, which cannot change.
	ReasonImmutableStatefulSetStorage = "ImmutableStatefulSetStorage"
)

// Reasons of an engine-local (SGLangHiCache) backend's Ready condition, in
// the order of their precedence when engine pods disagree.
const (
	ReasonAwaitingEnginePods          = "AwaitingEnginePods"
	ReasonAllEnginePodsSkipped        = "AllEnginePodsSkipped"
	ReasonEnginePodsNotInjected       = "EnginePodsNotInjected"
	ReasonEnginePodsInjectionMismatch = "EnginePodsInjectionMismatch"
	ReasonEnginePodsRolloutInProgress = "EnginePodsRolloutInProgress"
	ReasonEnginePodsUnavailable       = "EnginePodsUnavailable"
	ReasonEnginePodsReady             = "EnginePodsReady"
)

// More event reasons recorded on CacheBackends and their claims.
const (
	// EventEnginesRestarted: engine Deployments were rolled after a server change.
	EventEnginesRestarted = "EnginesRestarted"
	// EventSharedPVCRetained: a Deployment backend's shared claim is kept,
	// unmounted, after a switch to StatefulSet with per-replica claims.
	EventSharedPVCRetained = "SharedPVCRetained"
	// EventOrphanedPVCRetained: a claim is kept, unmounted, after storage
	// was removed or the workload kind changed.
	EventOrphanedPVCRetained = "OrphanedPVCRetained"
	// EventStorageChangeRejected: the spec asks for a storage class or a
	// smaller size the existing shared claim cannot take.
	EventStorageChangeRejected = "StorageChangeRejected"
	// EventReconcileFailed: a reconcile stopped before it could evaluate
	// the backend's conditions.
	EventReconcileFailed = "ReconcileFailed"
)

// Event reasons recorded on engine pods, once per pod, by the receipts
// controller.
const (
	// EventInjected: the pod's receipt matches the live CacheBackend.
	EventInjected = "InjectedByCacheBackend"
	// EventSkipped: the webhook left the matched pod unwired on purpose.
	EventSkipped = "SkippedByOperator"
	// EventReceiptMismatch: the pod carries a receipt that does not match a
	// live CacheBackend (hand-written, copied, or of a deleted backend).
	EventReceiptMismatch = "ReceiptMismatch"
)
