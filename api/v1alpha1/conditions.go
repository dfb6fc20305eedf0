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
