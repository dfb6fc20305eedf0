package v1alpha1

// Annotations the operator reads or writes. They are API: users, tools and
// older operator versions match on them.
const (
	// AnnotationSkipInject opts an engine pod out of injection: any
	// non-empty value except the falsey set (see the engine-binding doc).
	AnnotationSkipInject = "inferencecache.io/skip-inject"
	// AnnotationInjectSkipped records why the webhook left a matched pod unwired.
	AnnotationInjectSkipped = "inferencecache.io/inject-skipped"
	// AnnotationInjectedBy is the receipt's <namespace>/<name> of the CacheBackend.
	AnnotationInjectedBy = "inferencecache.io/injected-by"
	// AnnotationInjectedByUID is the receipt's CacheBackend metadata.uid.
	AnnotationInjectedByUID = "inferencecache.io/injected-by-uid"
	// AnnotationInjectedGeneration is the receipt's CacheBackend metadata.generation.
	AnnotationInjectedGeneration = "inferencecache.io/injected-generation"
	// AnnotationInjectedConfigDigest is sha256 of the pod's containers as admitted.
	AnnotationInjectedConfigDigest = "inferencecache.io/injected-config-digest"
	// AnnotationReceiptSignature is <key-id>:<hex HMAC-SHA256> of the receipt.
	AnnotationReceiptSignature = "inferencecache.io/receipt-signature"
	// AnnotationServerInstance is written on the pod template of engine
	// Deployments the operator rolls: a hash of the cache-server instance
	// they must reconnect to.
	AnnotationServerInstance = "inferencecache.io/server-instance"
	// AnnotationWarnedPrefix + an event reason marks a claim once warned
	// for that reason.
	AnnotationWarnedPrefix = "inferencecache.io/warned-"
	// AnnotationRetentionWhenDeleted on a claim records whether it goes with
	// its CacheBackend (Delete) or outlives it (Retain).
	AnnotationRetentionWhenDeleted = "inferencecache.io/retention-when-deleted"
	// AnnotationKVEventsSkipped records why the webhook wired a pod's cache
	// but added no kvevent-subscriber sidecar although the manager and the
	// CacheBackend ask for one (e.g. the engine sets its own
	// --kv-events-config).
	AnnotationKVEventsSkipped = "inferencecache.io/kv-events-skipped"
	// AnnotationServerPodDefaults on a cache-server workload (Deployment or
	// StatefulSet) says which defaults its pod template gets for the fields
	// spec.remoteStorage.lmCacheServer.pod and .resources leave unset. The
	// operator writes ServerPodDefaultsRestricted on every workload it
	// creates; a workload without it was created by an operator before
	// these defaults and keeps its template as it was, so that upgrading
	// the operator restarts no cache server. Setting it by hand opts such a
	// server in (its pods are replaced once).
	AnnotationServerPodDefaults = "inferencecache.io/server-pod-defaults"
	// ServerPodDefaultsRestricted is the value of AnnotationServerPodDefaults
	// for the hardened defaults: non-root UID and GID 65532, seccomp
	// RuntimeDefault, no privilege escalation, all capabilities dropped,
	// and default resources (Pod Security "restricted").
	ServerPodDefaultsRestricted = "restricted"
	// AnnotationVLLMVersion on an engine pod declares the vLLM release it
	// runs (e.g. 0.34.0): the first source the webhook reads it from.
	AnnotationVLLMVersion = "inferencecache.io/vllm-version"
	// AnnotationLMCacheVersion on an engine pod declares the LMCache
	// release inside it (e.g. 0.5.6).
	AnnotationLMCacheVersion = "inferencecache.io/lmcache-version"
	// AnnotationWiredFor is the receipt's record of the releases the
	// webhook wired the pod for and where it read each
	// ("vllm=0.34.0 (image); lmcache=unknown").
	AnnotationWiredFor = "inferencecache.io/wired-for"
)

// Names of the KV-event wiring shared by the webhook, the receipts and the
// KV-block index. They are API.
const (
	// IndexTokenAudience is the audience of the projected ServiceAccount
	// token the kvevent-subscriber sidecar presents to the KV-block index
	// (cache-index --audience, checked with TokenReview).
	IndexTokenAudience = "inferencecache-index"
	// VolumeIndexToken is the pod volume the webhook adds for that token.
	VolumeIndexToken = "inferencecache-index-token"
	// VolumeNoAPIToken is the empty volume the webhook mounts over the
	// Kubernetes API token's path in the kvevent-subscriber sidecar: the
	// sidecar holds no API credentials, and the API server's
	// ServiceAccount admission, run again after the webhook, leaves the
	// sidecar as the webhook signed it.
	VolumeNoAPIToken = "inferencecache-no-api-token"
	// IndexService is the install bundle's Service in front of cache-index,
	// in the operator's namespace (kustomize/base/index).
	IndexService = "inferencecache-index"
	// IndexPeersService is the headless Service (clusterIP None) over the
	// same cache-index pods: its name resolves to every ready replica, and
	// the sidecars forward to each (the webhook's default index address).
	IndexPeersService = "inferencecache-index-peers"
	// IndexGRPCPort serves Ingest (subscribers) and Query; IndexHTTPPort
	// the HTTP/JSON query API.
	IndexGRPCPort = 9400
	IndexHTTPPort = 9401
)

// Names of the LMCache engine wiring's volumes. They are API.
const (
	// VolumeEngineSharedMemory is the pod volume the webhook adds for the
	// engine container's private memory-backed /dev/shm
	// (spec.multiprocess.engineSharedMemory).
	VolumeEngineSharedMemory = "inferencecache-dshm"
	// VolumeNumbaCache is the pod volume the webhook adds for the numba
	// cache of an engine container wired to LMCache (NUMBA_CACHE_DIR),
	// unless the container sets NUMBA_CACHE_DIR itself.
	VolumeNumbaCache = "inferencecache-numba-cache"
)

// Field managers. They are API: renaming one strands the fields it owns on
// every existing object.
const (
	// FieldManagerChildren owns every field the operator applies to children.
	FieldManagerChildren = "inferencecache-operator"
	// FieldManagerStatus owns CacheBackend status.
	FieldManagerStatus = "inferencecache-operator-status"
	// FieldManagerReplicasHandoff holds a workload's replica count for the
	// moment the operator stops applying it because an HPA takes over.
	FieldManagerReplicasHandoff = "inferencecache-operator-replicas-handoff"
	// FieldManagerPVCWarnings owns the claims' AnnotationWarnedPrefix marks.
	FieldManagerPVCWarnings = "inferencecache-operator-pvc-warnings"
	// FieldManagerRollout owns AnnotationServerInstance on engine Deployments.
	FieldManagerRollout = "inferencecache-operator-rollout"
	// FieldManagerCABundle owns the webhook configurations' caBundle (dev
	// overlay's self-provisioned certificate).
	FieldManagerCABundle = "inferencecache-operator-cabundle"
)

// ReportingController is the name events of the operator are reported by.
const ReportingController = "inferencecache-operator"
