package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Runtime names the inference engine a CacheBackend wires.
// +kubebuilder:validation:Enum=VLLM;SGLang
type Runtime string

const (
	// RuntimeVLLM is the vLLM engine.
	RuntimeVLLM Runtime = "VLLM"
	// RuntimeSGLang is the SGLang engine.
	RuntimeSGLang Runtime = "SGLang"
)

// BackendType names the kind of KV cache a CacheBackend provides.
// +kubebuilder:validation:Enum=LMCache;SGLangHiCache
type BackendType string

const (
	// BackendTypeLMCache is a shared LMCache server run by the operator.
	BackendTypeLMCache BackendType = "LMCache"
	// BackendTypeSGLangHiCache is SGLang's engine-local hierarchical cache:
	// no server, only launch flags injected into the engine pods.
	BackendTypeSGLangHiCache BackendType = "SGLangHiCache"
)

// IntegrationRole is how an engine uses the shared cache.
// +kubebuilder:validation:Enum=ReadWrite;ReadOnly;WriteOnly
type IntegrationRole string

const (
	// RoleReadWrite stores and loads KV blocks (vLLM kv_role kv_both).
	RoleReadWrite IntegrationRole = "ReadWrite"
	// RoleReadOnly only loads KV blocks (vLLM kv_role kv_consumer).
	RoleReadOnly IntegrationRole = "ReadOnly"
	// RoleWriteOnly only stores KV blocks (vLLM kv_role kv_producer).
	RoleWriteOnly IntegrationRole = "WriteOnly"
)

// DeploymentKind is the workload kind that runs the managed cache server.
// +kubebuilder:validation:Enum=Deployment;StatefulSet
type DeploymentKind string

const (
	// DeploymentKindDeployment runs the cache server as a Deployment; with
	// storage, all replicas share the PVC <name>-data.
	DeploymentKindDeployment DeploymentKind = "Deployment"
	// DeploymentKindStatefulSet runs the cache server as a StatefulSet; with
	// storage, each replica gets its own PVC from a volumeClaimTemplate
	// (mounted, not written, by lmcache_server 0.5.x).
	DeploymentKindStatefulSet DeploymentKind = "StatefulSet"
)

// RemoteStorageProvider names the remote KV store engines connect to.
// +kubebuilder:validation:Enum=LMCacheServer
type RemoteStorageProvider string

// ProviderLMCacheServer is LMCache's own lmcache_server.
const ProviderLMCacheServer RemoteStorageProvider = "LMCacheServer"

// Ownership says who runs the remote store.
// +kubebuilder:validation:Enum=Managed
type Ownership string

// OwnershipManaged means the operator runs the store as child objects of the CacheBackend.
const OwnershipManaged Ownership = "Managed"

// RetentionAction is what happens to persistent cache data.
// +kubebuilder:validation:Enum=Retain;Delete
type RetentionAction string

const (
	// RetentionRetain keeps the PVC (and whatever data is on it) after the event.
	RetentionRetain RetentionAction = "Retain"
	// RetentionDelete lets Kubernetes garbage-collect the PVC after the event.
	RetentionDelete RetentionAction = "Delete"
)

// EngineRestartPolicy says whether the operator rolls the wired engines when
// their cache server is replaced or restarts.
// +kubebuilder:validation:Enum=OnServerChange;Never
type EngineRestartPolicy string

const (
	// EngineRestartOnServerChange rolls the engine Deployments whose pods
	// carry this backend's receipt, once per server change.
	EngineRestartOnServerChange EngineRestartPolicy = "OnServerChange"
	// EngineRestartNever leaves engines alone.
	EngineRestartNever EngineRestartPolicy = "Never"
)

// CacheBackendSpec is the desired state of a CacheBackend.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'SGLangHiCache' || self.runtime == 'SGLang'",message="type SGLangHiCache requires runtime SGLang"
// +kubebuilder:validation:XValidation:rule="self.type != 'LMCache' || self.runtime == 'VLLM'",message="type LMCache is wired into vLLM engines only: runtime must be VLLM"
// +kubebuilder:validation:XValidation:rule="!has(self.hiCache) || self.type == 'SGLangHiCache'",message="hiCache is only valid with type SGLangHiCache"
// +kubebuilder:validation:XValidation:rule="!has(self.lmCache) || self.type == 'LMCache'",message="lmCache is only valid with type LMCache"
// +kubebuilder:validation:XValidation:rule="self.type == 'LMCache' || (!has(self.remoteStorage) && !has(self.storage) && !has(self.autoscaling))",message="type SGLangHiCache is engine-local: remoteStorage, storage and autoscaling are not allowed"
// +kubebuilder:validation:XValidation:rule="!has(self.multiprocess) || self.type == 'LMCache'",message="multiprocess is only valid with type LMCache"
type CacheBackendSpec struct {
	// Runtime is the inference engine whose pods are wired.
	// +kubebuilder:default=VLLM
	// +optional
	Runtime Runtime `json:"runtime,omitempty"`

	// Type is the kind of cache. LMCache runs a managed lmcache-server and
	// publishes its address in status.endpoint; SGLangHiCache injects SGLang's
	// hierarchical-cache flags into the engines and runs nothing. Immutable.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="type is immutable; create a new CacheBackend instead"
	Type BackendType `json:"type"`

	// Integration says how matched engines use the cache.
	// +optional
	Integration Integration `json:"integration,omitempty"`

	// EngineSelector selects, by label, the engine pods of this namespace that
	// the webhook wires at pod CREATE. Same semantics as a Service selector:
	// every key/value must be on the pod; an empty selector matches no pod.
	// +optional
	EngineSelector EngineSelector `json:"engineSelector,omitempty"`

	// Observation configures KV-event observation of the wired engines.
	// +optional
	Observation *Observation `json:"observation,omitempty"`

	// LMCache tunes the LMCache client inside the engines (type LMCache only).
	// +optional
	LMCache *LMCacheConfig `json:"lmCache,omitempty"`

	// RemoteStorage describes the shared store engines connect to (type LMCache only).
	// +optional
	RemoteStorage *RemoteStorage `json:"remoteStorage,omitempty"`

	// DeploymentKind is the workload kind of the managed cache server.
	// +kubebuilder:default=Deployment
	// +optional
	DeploymentKind DeploymentKind `json:"deploymentKind,omitempty"`

	// Storage gives the cache server persistent volume claims, mounted at
	// /data. lmcache_server (LMCache 0.5.x) keeps KV in memory only, with or
	// without them: it does not write the claim, and a restarted server
	// starts empty (the webhook warns). For KV that survives a restart, use
	// the engines' local disk tier (spec.lmCache.localDisk).
	// +optional
	Storage *Storage `json:"storage,omitempty"`

	// Autoscaling runs a HorizontalPodAutoscaler for the cache server. While
	// set, the HPA owns the replica count and remoteStorage.lmCacheServer.replicas
	// is not applied.
	// +optional
	Autoscaling *Autoscaling `json:"autoscaling,omitempty"`

	// EngineRestartPolicy: with OnServerChange (default) the operator rolls
	// the engine Deployments wired to this backend, the way kubectl rollout
	// restart does, when a cache-server pod is replaced or its container
	// restarts: engines otherwise keep dead connections to it. It also
	// heals a sync that applied engines before the endpoint existed: the
	// Deployments and StatefulSets of matched pods admitted unwired before
	// then are rolled once the endpoint has settled (condition
	// EnginesWired). Never turns both off and leaves only the report. Type
	// LMCache only.
	// +kubebuilder:default=OnServerChange
	// +optional
	EngineRestartPolicy EngineRestartPolicy `json:"engineRestartPolicy,omitempty"`

	// HiCache holds SGLang HiCache launch settings (type SGLangHiCache only).
	// +optional
	HiCache *HiCache `json:"hiCache,omitempty"`

	// Multiprocess runs LMCache's multiprocess mode (type LMCache only):
	// one `lmcache server` per node, as a DaemonSet named after the
	// CacheBackend on the nodes spec.remoteStorage.lmCacheServer.pod
	// selects (nodeSelector, tolerations, affinity), behind a node-local
	// Service (internalTrafficPolicy Local), and the engines wired with
	// LMCacheMPConnector to the server of their own node, by isolated
	// CUDA IPC (no hostIPC, no privileged pod: Pod Security baseline
	// admits both sides). Unset, the in-process lmcache_server runs as
	// before. spec.deploymentKind StatefulSet, spec.storage,
	// spec.autoscaling and lmCacheServer.replicas, .port and .extraArgs
	// belong to the in-process server and are refused with it.
	// +optional
	Multiprocess *Multiprocess `json:"multiprocess,omitempty"`
}

// MPEvictionPolicy is the MP server's L1 eviction policy (--eviction-policy).
// +kubebuilder:validation:Enum=LRU;ARC;IsolatedLRU
type MPEvictionPolicy string

// The MP server's eviction policies.
const (
	MPEvictionLRU         MPEvictionPolicy = "LRU"
	MPEvictionARC         MPEvictionPolicy = "ARC"
	MPEvictionIsolatedLRU MPEvictionPolicy = "IsolatedLRU"
)

// Multiprocess configures LMCache's multiprocess mode: the node-local
// server's ports, its host-memory tier (L1) and its L2 tiers, and the
// engines' private shared memory.
type Multiprocess struct {
	// Port is the server's ZMQ request port (lmcache server --port), on
	// which the engines' connector reaches it.
	// +kubebuilder:default=5555
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// HTTPPort is the server's HTTP port (--http-port): health (the pods'
	// exec probes), metrics and LMCache's unauthenticated admin API, bound to
	// the pod's loopback; the metrics-gate sidecar serves GET /metrics alone
	// on the pod IP at the same port.
	// +kubebuilder:default=8080
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	HTTPPort int32 `json:"httpPort,omitempty"`

	// L1 is the server's host-memory tier. The server container requests
	// L1 + 5Gi of memory with a limit of 1.5 times that (unless
	// lmCacheServer.resources is set).
	L1 MultiprocessL1 `json:"l1"`

	// L2 are the server's lower tiers: Redis or Valkey over RESP, and a
	// local disk.
	// +optional
	L2 *MultiprocessL2 `json:"l2,omitempty"`

	// EngineSharedMemory sizes the private memory-backed /dev/shm the
	// webhook gives each wired engine pod (an emptyDir of medium Memory),
	// which isolated IPC needs instead of the host's. A pod that mounts
	// its own /dev/shm keeps it. At most 1Pi.
	// +kubebuilder:default="1Gi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="engineSharedMemory must be greater than zero"
	// +optional
	EngineSharedMemory *resource.Quantity `json:"engineSharedMemory,omitempty"`
}

// MultiprocessL1 is the MP server's host-memory tier.
type MultiprocessL1 struct {
	// Size of the tier, a whole number of GiB of at least 1Gi and at most
	// 1Pi (--l1-size-gb).
	Size resource.Quantity `json:"size"`

	// EvictionPolicy is --eviction-policy.
	// +kubebuilder:default=LRU
	// +optional
	EvictionPolicy MPEvictionPolicy `json:"evictionPolicy,omitempty"`

	// EvictionWatermarkPercent is the fill level, in percent, at which
	// eviction starts (--eviction-trigger-watermark, a fraction).
	// +kubebuilder:default=80
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	EvictionWatermarkPercent int32 `json:"evictionWatermarkPercent,omitempty"`

	// EvictionRatioPercent is the share of the tier, in percent, one
	// eviction frees (--eviction-ratio, a fraction).
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	EvictionRatioPercent int32 `json:"evictionRatioPercent,omitempty"`
}

// MultiprocessL2 are the MP server's L2 tiers (each an --l2-adapter).
type MultiprocessL2 struct {
	// RESP is a Redis or Valkey server the MP server stores KV chunks in
	// (LMCache's resp adapter).
	// +optional
	RESP *MultiprocessRESP `json:"resp,omitempty"`

	// Disk is a bounded folder of node-local storage (LMCache's fs_native
	// adapter), on a generic ephemeral volume of the server pod: it
	// survives a container restart and is wiped when the server pod is
	// replaced (docs/guides/migrate-to-multiprocess.md).
	// +optional
	Disk *MultiprocessDisk `json:"disk,omitempty"`
}

// MultiprocessRESP is an L2 tier on a Redis or Valkey server.
type MultiprocessRESP struct {
	// Host is the server's DNS name or IP address.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host"`

	// Port is the server's port.
	// +kubebuilder:default=6379
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// TLS: LMCache 0.5.6's resp adapter has no TLS, so true is refused.
	// +optional
	TLS bool `json:"tls,omitempty"`

	// CredentialsSecretRef names a Secret of the CacheBackend's namespace
	// with the username (optional, an ACL user) and password the server
	// authenticates with. They reach the server's environment only
	// (LMCACHE_RESP_USERNAME, LMCACHE_RESP_PASSWORD), never its
	// arguments, which its HTTP port echoes. Whoever sets the reference,
	// or changes it or the host and port the credentials go to, must be
	// allowed to get the Secret: the validating webhook asks the API
	// server.
	// +optional
	CredentialsSecretRef *RESPCredentials `json:"credentialsSecretRef,omitempty"`

	// Capacity bounds what the tier stores, a whole number of GiB of at
	// least 1Gi and at most 1Pi (max_capacity_gb).
	Capacity resource.Quantity `json:"capacity"`
}

// RESPCredentials names the Secret and keys of the RESP credentials.
type RESPCredentials struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// UsernameKey is the Secret's key of the ACL username; unset, the
	// server authenticates with the password alone (requirepass).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	UsernameKey string `json:"usernameKey,omitempty"`

	// PasswordKey is the Secret's key of the password.
	// +kubebuilder:default=password
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PasswordKey string `json:"passwordKey,omitempty"`
}

// MultiprocessDisk is an L2 tier on node-local disk.
type MultiprocessDisk struct {
	// Path is the folder in the server container, absolute and not "/".
	// +kubebuilder:default="/var/lib/lmcache"
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Path string `json:"path,omitempty"`

	// Capacity bounds what the tier stores, a whole number of GiB of at
	// least 1Gi and at most 1Pi (max_capacity_gb); the volume requests as
	// much.
	Capacity resource.Quantity `json:"capacity"`

	// StorageClassName of the server pod's ephemeral volume claim; empty
	// uses the cluster default. A class of node-local disks (local NVMe)
	// keeps the tier on the node.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// Integration says how engines use the cache.
type Integration struct {
	// Role is the engine's KV role: ReadWrite (vLLM kv_both), ReadOnly
	// (kv_consumer) or WriteOnly (kv_producer).
	// +kubebuilder:default=ReadWrite
	// +optional
	Role IntegrationRole `json:"role,omitempty"`

	// EngineContainer names the container of the engine pod that is wired.
	// When empty, the first container of the pod is wired.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	EngineContainer string `json:"engineContainer,omitempty"`

	// EngineOverrides are applied to the engine container after the canonical
	// injection. No argument or env value may hold "$(", which the kubelet
	// would expand from the container's environment: write "$$(" for a
	// literal "$(".
	// +optional
	EngineOverrides *EngineOverrides `json:"engineOverrides,omitempty"`

	// Versions declares the vLLM and LMCache releases the selected engine
	// pods run, for pods that say nothing themselves. The webhook wires
	// each pod for the release it runs, read in this order: the pod's
	// annotations inferencecache.io/vllm-version and
	// inferencecache.io/lmcache-version; the tag of the engine container's
	// image, for the projects' Docker Hub images (vllm/vllm-openai:v0.34.0
	// is vLLM 0.34.0, lmcache/vllm-openai:v0.5.6 is LMCache 0.5.6); then
	// these. A pod whose vLLM release is unknown gets the wiring every
	// supported release accepts (docs/compatibility.md).
	// +optional
	Versions *EngineVersions `json:"versions,omitempty"`
}

// EngineVersions are releases, as major.minor[.patch] with an optional
// suffix (0.34.0, v0.34.0, 0.5.7rc2).
type EngineVersions struct {
	// VLLM is the vLLM release of the engines.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^v?[0-9]{1,4}[.][0-9]{1,4}([.][0-9]{1,4})?([.+-]?[a-z0-9]+)*$`
	// +optional
	VLLM string `json:"vllm,omitempty"`

	// LMCache is the LMCache release inside the engines (and, unless the
	// server image's tag names one, of the server).
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^v?[0-9]{1,4}[.][0-9]{1,4}([.][0-9]{1,4})?([.+-]?[a-z0-9]+)*$`
	// +optional
	LMCache string `json:"lmcache,omitempty"`
}

// EngineOverrides adds arguments and environment to the wired engine
// container. Every string is bounded, and so is their total: the webhook
// copies them into every matched pod, and every informer caches them.
//
// Args and Env hold only what the allow-list of docs/security.md names:
// engine and LMCache settings that are configuration and load no code.
// Anything else goes under OptIn, and reaches only the pods whose template
// opts in.
//
// No argument or env value (OptIn's included) may hold "$(": the kubelet
// would replace $(NAME) with NAME's value in the engine container's
// environment. Write "$$(" for a literal "$(".
//
// +kubebuilder:validation:XValidation:rule="(has(self.args) ? self.args.map(a, size(a)).sum() : 0) + (has(self.env) ? self.env.map(e, size(e.name) + (has(e.value) ? size(e.value) : 0)).sum() : 0) + (has(self.optIn) && has(self.optIn.args) ? self.optIn.args.map(a, size(a)).sum() : 0) + (has(self.optIn) && has(self.optIn.env) ? self.optIn.env.map(e, size(e.name) + (has(e.value) ? size(e.value) : 0)).sum() : 0) <= 65536",message="engineOverrides may hold at most 64 KiB of arguments, names and values in total"
type EngineOverrides struct {
	// Args are appended to the engine container's arguments: flags of the
	// allow-list (docs/security.md), each followed by its value when it
	// takes one.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +optional
	Args []string `json:"args,omitempty"`

	// Env sets environment variables on the engine container, by name:
	// only the names of the allow-list (docs/security.md), with a literal
	// value, a fieldRef or resourceFieldRef, or a Secret's key (which
	// reaches only pods annotated inferencecache.io/allow-secret-overrides).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, size(e.name) <= 256 && (!has(e.value) || size(e.value) <= 16384))",message="an env name may have at most 256 characters and a value at most 16384"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !has(e.valueFrom) || ((!has(e.valueFrom.secretKeyRef) || (size(e.valueFrom.secretKeyRef.key) <= 253 && (!has(e.valueFrom.secretKeyRef.name) || size(e.valueFrom.secretKeyRef.name) <= 253))) && (!has(e.valueFrom.configMapKeyRef) || (size(e.valueFrom.configMapKeyRef.key) <= 253 && (!has(e.valueFrom.configMapKeyRef.name) || size(e.valueFrom.configMapKeyRef.name) <= 253))) && (!has(e.valueFrom.fieldRef) || (size(e.valueFrom.fieldRef.fieldPath) <= 256 && (!has(e.valueFrom.fieldRef.apiVersion) || size(e.valueFrom.fieldRef.apiVersion) <= 64))) && (!has(e.valueFrom.resourceFieldRef) || (size(e.valueFrom.resourceFieldRef.resource) <= 64 && (!has(e.valueFrom.resourceFieldRef.containerName) || size(e.valueFrom.resourceFieldRef.containerName) <= 63))) && (!has(e.valueFrom.fileKeyRef) || (size(e.valueFrom.fileKeyRef.key) <= 253 && size(e.valueFrom.fileKeyRef.path) <= 1024 && size(e.valueFrom.fileKeyRef.volumeName) <= 63))))",message="valueFrom names, keys and paths are bounded (253 characters; paths 1024)"
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// OptIn holds arguments and environment outside the allow-list (any
	// flag the engine reads, any env name but those never injected, values
	// from ConfigMaps): settings that can make the engine load code, trust
	// other servers or read other files. A pod receives the CacheBackend's
	// wiring only if its template carries the annotation
	// inferencecache.io/allow-overrides: "true", which only someone who can
	// edit the workload can set; other pods are admitted unwired
	// (override-not-allowed).
	// +optional
	OptIn *OptInOverrides `json:"optIn,omitempty"`
}

// OptInOverrides are engineOverrides outside the allow-list; see
// EngineOverrides.OptIn.
type OptInOverrides struct {
	// Args are appended to the engine container's arguments after
	// engineOverrides.args.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	// +optional
	Args []string `json:"args,omitempty"`

	// Env sets environment variables on the engine container, by name
	// (after engineOverrides.env).
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, size(e.name) <= 256 && (!has(e.value) || size(e.value) <= 16384))",message="an env name may have at most 256 characters and a value at most 16384"
	// +kubebuilder:validation:XValidation:rule="self.all(e, !has(e.valueFrom) || ((!has(e.valueFrom.secretKeyRef) || (size(e.valueFrom.secretKeyRef.key) <= 253 && (!has(e.valueFrom.secretKeyRef.name) || size(e.valueFrom.secretKeyRef.name) <= 253))) && (!has(e.valueFrom.configMapKeyRef) || (size(e.valueFrom.configMapKeyRef.key) <= 253 && (!has(e.valueFrom.configMapKeyRef.name) || size(e.valueFrom.configMapKeyRef.name) <= 253))) && (!has(e.valueFrom.fieldRef) || (size(e.valueFrom.fieldRef.fieldPath) <= 256 && (!has(e.valueFrom.fieldRef.apiVersion) || size(e.valueFrom.fieldRef.apiVersion) <= 64))) && (!has(e.valueFrom.resourceFieldRef) || (size(e.valueFrom.resourceFieldRef.resource) <= 64 && (!has(e.valueFrom.resourceFieldRef.containerName) || size(e.valueFrom.resourceFieldRef.containerName) <= 63))) && (!has(e.valueFrom.fileKeyRef) || (size(e.valueFrom.fileKeyRef.key) <= 253 && size(e.valueFrom.fileKeyRef.path) <= 1024 && size(e.valueFrom.fileKeyRef.volumeName) <= 63))))",message="valueFrom names, keys and paths are bounded (253 characters; paths 1024)"
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
}

// EngineSelector selects engine pods by label.
type EngineSelector struct {
	// MatchLabels must all be present, with equal values, on an engine pod.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="label keys have at most 317 characters (prefix and name) and values at most 63"
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// Observation configures KV-event observation.
type Observation struct {
	// ModelID is the model the engines serve, e.g. Qwen/Qwen2.5-0.5B-Instruct.
	// The kvevent-subscriber sidecar is added only when it is set.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +optional
	ModelID string `json:"modelID,omitempty"`
}

// LMCacheConfig tunes the LMCache client in the engines. Sizes are
// Kubernetes quantities; the webhook converts them to the plain numbers of
// GiB that LMCache parses (exactly: LMCache multiplies them by 1024³ back
// into the quantity's bytes).
type LMCacheConfig struct {
	// ChunkSize is LMCache's token chunk size (LMCACHE_CHUNK_SIZE).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	// +optional
	ChunkSize *int32 `json:"chunkSize,omitempty"`

	// Serde is the serializer for the remote store (LMCACHE_REMOTE_SERDE).
	// +kubebuilder:validation:Enum=naive;cachegen
	// +kubebuilder:default=naive
	// +optional
	Serde string `json:"serde,omitempty"`

	// LocalCPU sets the size of LMCache's local CPU tier. Unset, LMCache's
	// own default applies: LMCache 0.5 keeps a local CPU tier of 5 GiB in
	// each engine.
	// +optional
	LocalCPU *LocalCPUTier `json:"localCPU,omitempty"`

	// LocalDisk enables LMCache's local disk tier.
	// +optional
	LocalDisk *LocalDiskTier `json:"localDisk,omitempty"`
}

// LocalCPUTier is LMCache's local CPU tier.
type LocalCPUTier struct {
	// MaxSize is the size of the tier (LMCACHE_MAX_LOCAL_CPU_SIZE, in GiB).
	MaxSize resource.Quantity `json:"maxSize"`
}

// LocalDiskTier is LMCache's local disk tier.
type LocalDiskTier struct {
	// Path is the directory in the engine container (LMCACHE_LOCAL_DISK).
	// It has no comma: LMCache splits LMCACHE_LOCAL_DISK at commas into
	// several directories.
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:XValidation:rule="!self.contains(',')",message="path must not contain a comma: LMCache splits LMCACHE_LOCAL_DISK at commas into several directories"
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path"`
	// MaxSize is the size of the tier (LMCACHE_MAX_LOCAL_DISK_SIZE, in GiB).
	MaxSize resource.Quantity `json:"maxSize"`
}

// RemoteStorage is the shared store engines connect to.
type RemoteStorage struct {
	// Provider is the store implementation.
	// +kubebuilder:default=LMCacheServer
	// +optional
	Provider RemoteStorageProvider `json:"provider,omitempty"`

	// Ownership says who runs the store; Managed means this operator.
	// +kubebuilder:default=Managed
	// +optional
	Ownership Ownership `json:"ownership,omitempty"`

	// LMCacheServer configures the managed lmcache-server.
	// +optional
	LMCacheServer *LMCacheServer `json:"lmCacheServer,omitempty"`
}

// ServerPod is what the managed server's pod template takes beyond the
// operator's own fields: the pod-spec fields a platform team sets to
// place and harden it, in bounded forms of the Kubernetes types. The
// validating webhook refuses labels the operator's selectors own and
// malformed keys, names and tolerations, with their field paths.
type ServerPod struct {
	// Labels added to the pods. Keys the operator's selectors use
	// (app.kubernetes.io/name, instance, managed-by, component,
	// inferencecache.io/cachebackend) are refused.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="label keys have at most 317 characters, values at most 63"
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the pods.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 4096)",message="annotation keys have at most 317 characters, values at most 4096"
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// NodeSelector of the pods.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && size(self[k]) <= 63)",message="node label keys have at most 317 characters, values at most 63"
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Tolerations of the pods.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Tolerations []ServerToleration `json:"tolerations,omitempty"`

	// TopologySpreadConstraints of the pods.
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	TopologySpreadConstraints []ServerTopologySpread `json:"topologySpreadConstraints,omitempty"`

	// Affinity of the pods: node affinity, and anti-affinity among the
	// server's own pods (its terms always select them, as the topology
	// spread constraints do).
	// +optional
	Affinity *ServerAffinity `json:"affinity,omitempty"`

	// PriorityClassName of the pods.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// ImagePullSecrets of the CacheBackend's namespace to pull the server
	// image with.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	ImagePullSecrets []ServerPullSecret `json:"imagePullSecrets,omitempty"`

	// SecurityContext of the pods. For Pod Security "restricted":
	// runAsNonRoot with a runAsUser the image can run as, and
	// seccompProfile RuntimeDefault (docs/security.md).
	// +optional
	SecurityContext *ServerPodSecurityContext `json:"securityContext,omitempty"`

	// ContainerSecurityContext of the server container. For Pod Security
	// "restricted": allowPrivilegeEscalation false and capabilities drop
	// ALL.
	// +optional
	ContainerSecurityContext *ServerContainerSecurityContext `json:"containerSecurityContext,omitempty"`
}

// ServerToleration is a toleration of the server's pods (corev1.Toleration,
// bounded).
type ServerToleration struct {
	// +kubebuilder:validation:MaxLength=317
	// +optional
	Key string `json:"key,omitempty"`
	// +kubebuilder:validation:Enum=Exists;Equal
	// +optional
	Operator corev1.TolerationOperator `json:"operator,omitempty"`
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Value string `json:"value,omitempty"`
	// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute
	// +optional
	Effect corev1.TaintEffect `json:"effect,omitempty"`
	// +optional
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}

// ServerTopologySpread spreads the server's pods (corev1.TopologySpreadConstraint,
// bounded; it always selects the server's own pods).
type ServerTopologySpread struct {
	// +kubebuilder:validation:Minimum=1
	MaxSkew int32 `json:"maxSkew"`
	// TopologyKey is a node label key, e.g. topology.kubernetes.io/zone.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	TopologyKey string `json:"topologyKey"`
	// +kubebuilder:validation:Enum=DoNotSchedule;ScheduleAnyway
	WhenUnsatisfiable corev1.UnsatisfiableConstraintAction `json:"whenUnsatisfiable"`
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinDomains *int32 `json:"minDomains,omitempty"`
}

// ServerAffinity is the affinity of the server's pods (corev1.Affinity,
// bounded): node affinity, and anti-affinity among the server's own pods.
// Pod affinity to other workloads is not offered.
type ServerAffinity struct {
	// +optional
	NodeAffinity *ServerNodeAffinity `json:"nodeAffinity,omitempty"`
	// +optional
	PodAntiAffinity *ServerPodAntiAffinity `json:"podAntiAffinity,omitempty"`
}

// ServerNodeAffinity is corev1.NodeAffinity, bounded; node selector terms
// match node labels (matchExpressions; matchFields is not offered).
type ServerNodeAffinity struct {
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution *ServerNodeSelector `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []ServerPreferredSchedulingTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// ServerNodeSelector is corev1.NodeSelector, bounded: a node matches when
// it matches one of the terms.
type ServerNodeSelector struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	NodeSelectorTerms []ServerNodeSelectorTerm `json:"nodeSelectorTerms"`
}

// ServerNodeSelectorTerm is corev1.NodeSelectorTerm, bounded: a node
// matches when it matches every expression.
type ServerNodeSelectorTerm struct {
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	MatchExpressions []ServerNodeSelectorRequirement `json:"matchExpressions"`
}

// ServerNodeSelectorRequirement is corev1.NodeSelectorRequirement, bounded.
type ServerNodeSelectorRequirement struct {
	// Key is a node label key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Key string `json:"key"`
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist;Gt;Lt
	Operator corev1.NodeSelectorOperator `json:"operator"`
	// Values: at least one for In and NotIn, none for Exists and
	// DoesNotExist, exactly one (an integer) for Gt and Lt.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=atomic
	// +optional
	Values []string `json:"values,omitempty"`
}

// ServerPreferredSchedulingTerm is corev1.PreferredSchedulingTerm, bounded.
type ServerPreferredSchedulingTerm struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight     int32                  `json:"weight"`
	Preference ServerNodeSelectorTerm `json:"preference"`
}

// ServerPodAntiAffinity keeps the server's pods apart from each other
// (corev1.PodAntiAffinity, bounded; each term's label selector is the
// server's own).
type ServerPodAntiAffinity struct {
	// +kubebuilder:validation:MaxItems=4
	// +listType=atomic
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution []ServerPodAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=4
	// +listType=atomic
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []ServerWeightedPodAffinityTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// ServerPodAffinityTerm is corev1.PodAffinityTerm over the server's own
// pods: only the topology key is chosen.
type ServerPodAffinityTerm struct {
	// TopologyKey is a node label key, e.g. kubernetes.io/hostname.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	TopologyKey string `json:"topologyKey"`
}

// ServerWeightedPodAffinityTerm is corev1.WeightedPodAffinityTerm, bounded.
type ServerWeightedPodAffinityTerm struct {
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Weight          int32                 `json:"weight"`
	PodAffinityTerm ServerPodAffinityTerm `json:"podAffinityTerm"`
}

// ServerPullSecret names a Secret of the CacheBackend's namespace.
type ServerPullSecret struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ServerSeccompProfile is a seccomp profile (corev1.SeccompProfile, bounded).
type ServerSeccompProfile struct {
	// +kubebuilder:validation:Enum=RuntimeDefault;Localhost;Unconfined
	Type corev1.SeccompProfileType `json:"type"`
	// LocalhostProfile is the profile's path on the node, with type Localhost.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	LocalhostProfile string `json:"localhostProfile,omitempty"`
}

// ServerPodSecurityContext is the server pods' securityContext
// (corev1.PodSecurityContext's fields Pod Security judges).
type ServerPodSecurityContext struct {
	// +optional
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	FSGroup *int64 `json:"fsGroup,omitempty"`
	// +optional
	SeccompProfile *ServerSeccompProfile `json:"seccompProfile,omitempty"`
}

// ServerCapabilities are capabilities the server container drops.
type ServerCapabilities struct {
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=atomic
	// +optional
	Drop []string `json:"drop,omitempty"`
}

// ServerContainerSecurityContext is the server container's securityContext
// (corev1.SecurityContext's fields Pod Security judges; nothing that adds
// privilege).
type ServerContainerSecurityContext struct {
	// +optional
	AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation,omitempty"`
	// +optional
	ReadOnlyRootFilesystem *bool `json:"readOnlyRootFilesystem,omitempty"`
	// +optional
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	// +optional
	Capabilities *ServerCapabilities `json:"capabilities,omitempty"`
	// +optional
	SeccompProfile *ServerSeccompProfile `json:"seccompProfile,omitempty"`
}

// LMCacheServer configures the managed lmcache-server workload.
type LMCacheServer struct {
	// Image is the container image that provides the lmcache_server command
	// and python3 (the container probes send LMCache's HEALTH request from
	// it). The default's tag is the LMCache version the operator is tested
	// with.
	// +kubebuilder:default="lmcache/vllm-openai:v0.5.6"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// Port is the TCP port the server listens on.
	// +kubebuilder:default=65432
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Resources of the server container. Unset, a server the operator
	// creates requests 500m CPU and 2Gi memory with an 8Gi memory limit
	// (lmcache_server keeps every chunk in memory and evicts nothing: the
	// limit bounds the cache); one created before these defaults keeps
	// none, like its other pod defaults.
	// +kubebuilder:validation:XValidation:rule="!has(self.claims) || self.claims.all(c, size(c.name) <= 63 && (!has(c.request) || size(c.request) <= 63))",message="resource claim names have at most 63 characters"
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// Replicas of the server when autoscaling is not set. Defaults to 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Pod places and hardens the server's pods: scheduling (nodeSelector,
	// tolerations, affinity, topology spread, priority class), image pull
	// secrets, pod labels and annotations, and security contexts. A server
	// the operator creates runs as user and group 65532 with seccomp
	// RuntimeDefault, no privilege escalation and all capabilities dropped
	// (Pod Security "restricted") for each of those fields left unset; a
	// server created by an operator before these defaults keeps its pod
	// template (the workload's inferencecache.io/server-pod-defaults
	// annotation says which applies), so upgrading restarts no server.
	// +optional
	Pod *ServerPod `json:"pod,omitempty"`

	// ExtraArgs is refused by the validating webhook when set or changed:
	// lmcache_server (LMCache 0.5.x) takes exactly `<host> <port> [device]`
	// and exits on any other argument, and the operator renders all three
	// (`lmcache_server 0.0.0.0 <port> cpu`). The field stays for
	// compatibility; values stored before the rule are kept, with a
	// warning, and never passed to the server.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=4096
	// +optional
	ExtraArgs []string `json:"extraArgs,omitempty"`
}

// Storage gives the cache server persistent volume claims. lmcache_server
// (LMCache 0.5.x) keeps KV in memory only: the claims are mounted at /data
// and kept as retention says, but the server does not write them.
type Storage struct {
	// PVC requests persistent volume claims, mounted at /data in the server
	// container (not written by lmcache_server 0.5.x).
	// +optional
	PVC *PVCStorage `json:"pvc,omitempty"`
}

// PVCStorage describes the persistent volume claims of the cache server.
type PVCStorage struct {
	// Size of each claim.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="size must be greater than zero"
	Size resource.Quantity `json:"size"`

	// StorageClassName of the claims; empty uses the cluster default.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`

	// AccessModes of the claims. Defaults to [ReadWriteOnce].
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:items:Enum=ReadWriteOnce;ReadOnlyMany;ReadWriteMany;ReadWriteOncePod
	// +kubebuilder:default={"ReadWriteOnce"}
	// +optional
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`

	// Retention says what happens to the claims, and whatever data is on
	// them, when the CacheBackend is deleted or scaled down. The default keeps
	// them. (lmcache_server 0.5.x writes no KV there.)
	// +optional
	Retention *PVCRetention `json:"retention,omitempty"`
}

// PVCRetention is what happens to the cache data's claims.
type PVCRetention struct {
	// WhenDeleted applies when the CacheBackend is deleted. Retain (default)
	// keeps the claims; Delete lets Kubernetes garbage-collect them with the
	// CacheBackend.
	// +kubebuilder:default=Retain
	// +optional
	WhenDeleted RetentionAction `json:"whenDeleted,omitempty"`

	// WhenScaled applies to per-replica claims of a StatefulSet when it is
	// scaled down. Retain (default) keeps them.
	// +kubebuilder:default=Retain
	// +optional
	WhenScaled RetentionAction `json:"whenScaled,omitempty"`
}

// Autoscaling configures a HorizontalPodAutoscaler for the cache server.
//
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must be less than or equal to maxReplicas"
type Autoscaling struct {
	// MinReplicas is the lower bound. Defaults to 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// MaxReplicas is the upper bound.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxReplicas int32 `json:"maxReplicas"`

	// TargetCPUUtilizationPercentage is the average CPU utilisation target.
	// When neither target is set, the HPA targets 80% CPU.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	TargetCPUUtilizationPercentage *int32 `json:"targetCPUUtilizationPercentage,omitempty"`

	// TargetMemoryUtilizationPercentage is the average memory utilisation target.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	TargetMemoryUtilizationPercentage *int32 `json:"targetMemoryUtilizationPercentage,omitempty"`
}

// HiCacheWritePolicy is SGLang's --hicache-write-policy.
// +kubebuilder:validation:Enum=write_back;write_through;write_through_selective
type HiCacheWritePolicy string

// HiCacheIOBackend is SGLang's --hicache-io-backend.
// +kubebuilder:validation:Enum=direct;kernel
type HiCacheIOBackend string

// HiCacheMemLayout is SGLang's --hicache-mem-layout.
// +kubebuilder:validation:Enum=layer_first;page_first;page_first_direct
type HiCacheMemLayout string

// HiCacheStorageBackend is SGLang's --hicache-storage-backend.
// +kubebuilder:validation:Enum=file;mooncake;hf3fs;nixl;aibrix;eic;dynamic
type HiCacheStorageBackend string

// HiCachePrefetchPolicy is SGLang's --hicache-storage-prefetch-policy.
// +kubebuilder:validation:Enum=best_effort;wait_complete;timeout
type HiCachePrefetchPolicy string

// HiCache holds SGLang hierarchical-cache launch settings. Each field maps to
// the SGLang flag of the same name; --enable-hierarchical-cache is always set.
//
// +kubebuilder:validation:XValidation:rule="!has(self.ratio) || !has(self.sizeGB)",message="set either ratio or sizeGB, not both (SGLang's --hicache-size overrides --hicache-ratio)"
// +kubebuilder:validation:XValidation:rule="!has(self.storagePrefetchPolicy) || has(self.storageBackend)",message="storagePrefetchPolicy needs storageBackend"
type HiCache struct {
	// Ratio of the host KV pool to the device pool (--hicache-ratio), a
	// decimal greater than 1, e.g. "2" or "1.5".
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="double(self) > 1.0",message="ratio must be greater than 1"
	// +optional
	Ratio *string `json:"ratio,omitempty"`

	// SizeGB is the host KV pool size in GB (--hicache-size).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	// +optional
	SizeGB *int32 `json:"sizeGB,omitempty"`

	// WritePolicy is --hicache-write-policy.
	// +optional
	WritePolicy HiCacheWritePolicy `json:"writePolicy,omitempty"`

	// IOBackend is --hicache-io-backend.
	// +optional
	IOBackend HiCacheIOBackend `json:"ioBackend,omitempty"`

	// MemLayout is --hicache-mem-layout.
	// +optional
	MemLayout HiCacheMemLayout `json:"memLayout,omitempty"`

	// StorageBackend is --hicache-storage-backend (the L3 tier).
	// +optional
	StorageBackend HiCacheStorageBackend `json:"storageBackend,omitempty"`

	// StoragePrefetchPolicy is --hicache-storage-prefetch-policy.
	// +optional
	StoragePrefetchPolicy HiCachePrefetchPolicy `json:"storagePrefetchPolicy,omitempty"`

	// PageSize is --page-size, in tokens.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	// +optional
	PageSize *int32 `json:"pageSize,omitempty"`
}

// CacheBackendStatus is the observed state of a CacheBackend.
type CacheBackendStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Progressing and Degraded always; Reconciling and
	// Stalled (kstatus) only while true.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Endpoint is the address engines use as LMCache's remote URL,
	// lm://<service>.<namespace>.svc.<cluster-domain>:<port>. Set only while the cache
	// server is available.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// MatchedEnginePods counts the pods of the namespace whose labels
	// currently match spec.engineSelector and that this CacheBackend
	// claims (terminating pods excluded): of the CacheBackends whose
	// selectors match a pod, the webhook wires it to the first by name. A
	// matched pod is not necessarily wired: see its receipt annotations.
	// +optional
	MatchedEnginePods int32 `json:"matchedEnginePods"`

	// WiredEnginePods counts the matched pods whose injection receipt
	// verifies (HMAC with the operator's keys) for this CacheBackend.
	// +optional
	WiredEnginePods int32 `json:"wiredEnginePods"`

	// UnwiredEnginePods counts the matched pods admitted without wiring and
	// without a skip (inferencecache.io/inject-skipped): no receipt, or one
	// that does not verify. Condition EnginesWired says why.
	// +optional
	UnwiredEnginePods int32 `json:"unwiredEnginePods"`

	// EngineSelectorMessage explains a selector that matches no pod of
	// this CacheBackend's: none at all, or only pods another CacheBackend
	// claims (named with their count).
	// +optional
	EngineSelectorMessage string `json:"engineSelectorMessage,omitempty"`

	// Replicas is the cache server's desired replica count.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// ReadyReplicas is the number of ready cache-server replicas.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// ObservedServerInstance identifies the serving cache-server pods, as
	// sorted <pod-uid>:<restart-count-sum> entries. A change from one
	// non-empty value to another means a server was replaced or restarted.
	// +optional
	ObservedServerInstance string `json:"observedServerInstance,omitempty"`

	// Capacity is the bound capacity of the shared claim <name>-data
	// (Deployment kind with storage only; per-replica claims of a
	// StatefulSet are not summed). lmcache_server (LMCache 0.5) never
	// writes the claim: condition StoragePersistent says so.
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// FirstAvailableAt is when the cache server first served.
	// +optional
	FirstAvailableAt *metav1.Time `json:"firstAvailableAt,omitempty"`

	// EndpointPublishedAt is when status.endpoint was last published: set
	// when the endpoint appears (or changes), removed with it. The webhook
	// wires pods with it once its cache holds it, a few seconds later.
	// Multiprocess mode's per-node cascade waits for that, not for Ready
	// (every node's server), before it evicts a node's engines.
	// +optional
	EndpointPublishedAt *metav1.Time `json:"endpointPublishedAt,omitempty"`

	// IndexParticipation is the KV-block index's view of the engine pods
	// (KV-event observation). Set only while spec.observation is set.
	// +optional
	IndexParticipation *IndexParticipation `json:"indexParticipation,omitempty"`

	// Multiprocess is the node-local servers of multiprocess mode (set
	// only with spec.multiprocess).
	// +optional
	Multiprocess *MultiprocessStatus `json:"multiprocess,omitempty"`
}

// MaxMultiprocessNodes bounds status.multiprocess.nodes.
const MaxMultiprocessNodes = 100

// MultiprocessStatus is the node-local servers' state.
type MultiprocessStatus struct {
	// DesiredServers is the number of nodes that should run a server
	// (the DaemonSet's desiredNumberScheduled).
	DesiredServers int32 `json:"desiredServers"`
	// ReadyServers is the number of those whose server is ready.
	ReadyServers int32 `json:"readyServers"`
	// Nodes lists the servers by node: the unready first, then by node
	// name, at most 100.
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=100
	// +optional
	Nodes []MultiprocessNode `json:"nodes,omitempty"`
}

// MultiprocessNode is the server of one node.
type MultiprocessNode struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Pod is the server pod's name.
	Pod string `json:"pod"`
	// Ready: the server pod is ready (its /healthcheck answers).
	Ready bool `json:"ready"`
	// Endpoint is the server's address on its node, tcp://<pod-ip>:<port>
	// (engines dial the node-local Service, which reaches it).
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
}

// CacheBackend wires a shared KV cache into the LLM engine pods its selector
// matches. For type LMCache the operator runs an lmcache-server (workload,
// Service, optional HPA and PVC) named after the CacheBackend.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cb,categories=inferencecache
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matchedEnginePods`
// +kubebuilder:printcolumn:name="Wired",type=integer,JSONPath=`.status.wiredEnginePods`
// +kubebuilder:printcolumn:name="Unwired",type=integer,JSONPath=`.status.unwiredEnginePods`,priority=1
// +kubebuilder:printcolumn:name="Servers",type=string,JSONPath=`.status.multiprocess.readyServers`,priority=1
// +kubebuilder:printcolumn:name="Indexed",type=string,JSONPath=`.status.indexParticipation.indexed`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label of at most 63 characters (lower-case letters, digits and '-', starting with a letter): it names the cache-server Service"
type CacheBackend struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CacheBackendSpec `json:"spec"`
	// +optional
	Status CacheBackendStatus `json:"status,omitempty"`
}

// CacheBackendList is a list of CacheBackends.
//
// +kubebuilder:object:root=true
type CacheBackendList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheBackend `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CacheBackend{}, &CacheBackendList{})
}
