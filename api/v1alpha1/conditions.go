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

// The storage condition: present only while spec.storage.pvc is set.
const (
	// ConditionStoragePersistent: whether the cache server writes the
	// claims spec.storage.pvc asks for, so that KV outlives a server
	// restart.
	ConditionStoragePersistent = "StoragePersistent"
	// ReasonServerKeepsKVInMemory: the server (lmcache_server, LMCache
	// 0.5) keeps KV in memory only: the claim is mounted but never
	// written, and status.capacity is the size of a claim that holds no
	// KV.
	ReasonServerKeepsKVInMemory = "ServerKeepsKVInMemory"
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

// ReasonEngineRestartsRetrying is Reconciling's reason (True) while engine
// restarts the reconcile planned failed (a workload that could not be
// annotated; an eviction a PodDisruptionBudget, an admission webhook or a
// policy refused): they are retried, the server identity stays
// unrecorded until they succeed, and the rest of the status is evaluated
// and published as usual (observedGeneration included).
const ReasonEngineRestartsRetrying = "EngineRestartsRetrying"

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
	// EventEngineEvictionBlocked (Warning): the per-node cascade of
	// multiprocess mode could not evict an engine pod because its
	// PodDisruptionBudget allows no disruption now; the reconcile retries.
	EventEngineEvictionBlocked = "EngineEvictionBlocked"
	// EventEngineRollFailed (Warning): the API server refused the
	// annotation that restarts an engine workload (the cascade or the
	// heal); the reconcile retries, the other workloads and the evictions
	// go ahead meanwhile.
	EventEngineRollFailed = "EngineRollFailed"
	// EventEngineEvictionForbidden (Warning): the per-node cascade of
	// multiprocess mode may not evict engine pods (the install left out
	// the engine-eviction grant, docs/security.md); the event names the
	// pods to restart by hand, and the change is not retried.
	EventEngineEvictionForbidden = "EngineEvictionForbidden"
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
	// EventEngineReleaseUnknown (Warning): the pod's receipt matches, but
	// the webhook could not tell the vLLM release of a pod it wired to a
	// multiprocess-mode CacheBackend, and wired it as every supported
	// release accepts (docs/compatibility.md): declare the release.
	EventEngineReleaseUnknown = "EngineReleaseUnknown"
)

// The KV-event observation condition and its reasons (present only while
// spec.observation is set; evaluated only behind the KV-event gate, see
// docs/design/cachebackend-api.md).
const (
	// ConditionIndexSynced: every wired engine pod streams its KV-cache
	// events to the KV-block index in order.
	ConditionIndexSynced = "IndexSynced"
	// ReasonAllPodsLive: every expected pod is live in the index.
	ReasonAllPodsLive = "AllPodsLive"
	// ReasonAwaitingWorkload: the gate is closed: the cache server is not
	// available yet, or no matched pod carries the subscriber sidecar.
	ReasonAwaitingWorkload = "AwaitingWorkload"
	// ReasonIndexUnavailable: the index could not be read (fail-open:
	// Ready is not affected).
	ReasonIndexUnavailable = "IndexUnavailable"
	// ReasonSubscriberMissing: a wired pod's subscriber never reached the
	// index, or the manager runs without a subscriber image.
	ReasonSubscriberMissing = "SubscriberMissing"
	// ReasonHashMismatch: the engines' block hashes cannot be reproduced
	// with the configured scheme; token-ID queries would never match.
	ReasonHashMismatch = "HashMismatch"
	// ReasonPodsUnsynced: a pod lost events it cannot recover.
	ReasonPodsUnsynced = "PodsUnsynced"
	// ReasonPodsStale: a pod's subscriber went silent.
	ReasonPodsStale = "PodsStale"
	// ReasonPodsResyncing: a pod is connecting or catching up.
	ReasonPodsResyncing = "PodsResyncing"
)

// ConditionEnginesWired says whether every engine pod the selector matches
// (pods skipped on purpose excluded) carries a verified injection receipt.
// It is a report beside Ready: Ready keeps its meaning (the cache server
// serves), and neither kstatus nor the shipped Argo CD health check turn
// EnginesWired=False into "not ready" (docs/operations.md says why).
const ConditionEnginesWired = "EnginesWired"

// Reasons of the EnginesWired condition. They are API.
const (
	// ReasonAllEnginesWired: every matched, non-skipped pod is wired
	// (vacuously true when the selector matches none).
	ReasonAllEnginesWired = "AllEnginesWired"
	// ReasonEnginesAdmittedBeforeEndpoint: pods were admitted unwired
	// because the endpoint did not exist yet (applied together with the
	// CacheBackend, or while the server was unavailable). With
	// engineRestartPolicy OnServerChange the operator rolls their
	// workloads once the endpoint has settled.
	ReasonEnginesAdmittedBeforeEndpoint = "EnginesAdmittedBeforeEndpoint"
	// ReasonEnginesRollingForWiring: the operator rolled the workloads of
	// pods admitted before the endpoint; their unwired pods are being
	// replaced.
	ReasonEnginesRollingForWiring = "EnginesRollingForWiring"
	// ReasonEnginesAdmittedUnwired: pods were admitted unwired while the
	// endpoint existed (webhook unavailable with failurePolicy Ignore, a
	// fail-open reason, a receipt that does not verify), or the backend is
	// observation-only (SGLangHiCache): reported, never rolled.
	ReasonEnginesAdmittedUnwired = "EnginesAdmittedUnwired"
	// ReasonReceiptKeysUnavailable: the receipt keys could not be read, so
	// no receipt could be verified (EnginesWired=Unknown).
	ReasonReceiptKeysUnavailable = "ReceiptKeysUnavailable"
)

// Event reasons of the wiring report and its healing.
const (
	// EventEnginesUnwired (Warning): matched engine pods run unwired; the
	// message names their Deployments and StatefulSets.
	EventEnginesUnwired = "EnginesUnwired"
	// EventEnginesRestartedForWiring: workloads whose pods were admitted
	// before the endpoint existed were rolled, once per pod template.
	EventEnginesRestartedForWiring = "EnginesRestartedForWiring"
)
