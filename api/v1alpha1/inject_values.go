package v1alpha1

// Values the pod webhook writes in the annotations of the pods it admits
// (AnnotationInjectSkipped, AnnotationKVEventsSkipped) and the reasons of
// its fail-open verdicts. They are API: users, tools and the CLI match on
// them.

// Values of AnnotationInjectSkipped: why the pod webhook left a matched pod unwired.
const (
	// SkippedByAnnotation: the pod carries a truthy skip-inject annotation.
	SkippedByAnnotation = "skip-inject-annotation"
	// SkippedUserConfig: the engine container already sets a value the
	// injection would set differently (its own --kv-transfer-config, an
	// LMCACHE_* variable, a HiCache flag, or an override's name); the
	// webhook never overwrites it.
	SkippedUserConfig = "user-config-conflict"
	// SkippedShellWrapper: the engine container runs `sh -c ...`, whose
	// inner command line the webhook cannot extend.
	SkippedShellWrapper = "shell-wrapped-command"
	// SkippedOverrideNotAllowed: the CacheBackend's engineOverrides set an
	// env var the guard denies, or read a Secret into a pod that did not
	// opt in (see overrides.go).
	SkippedOverrideNotAllowed = "override-not-allowed"
	// SkippedIsolatedIPCUnsupported: the CacheBackend runs LMCache's
	// multiprocess mode, whose isolated IPC shares only memory from plain
	// cudaMalloc, and the engine container allocates otherwise: its env
	// PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) turns on
	// expandable_segments, or it turns on vLLM's sleep mode
	// (--enable-sleep-mode, CuMemAllocator).
	SkippedIsolatedIPCUnsupported = "isolated-ipc-unsupported"
	// SkippedEngineRelease: the engine runs a release the CacheBackend's
	// shape cannot serve: LMCache 0.5.7 or later in an engine of an
	// in-process CacheBackend (LMCache 0.5.7 removed the in-process
	// adapter vLLM's LMCacheConnectorV1 imports, and the lm:// connector).
	SkippedEngineRelease = "engine-release-unsupported"
	// SkippedChunkSizeMisaligned: the CacheBackend runs LMCache's
	// multiprocess mode, whose server chunk (256 tokens) must be a
	// multiple of the engine's block size times its decode context
	// parallel size, and the engine's command line sets a block size that
	// is not (LMCache's MP connector refuses it at start; LMCache 0.5.7
	// would renegotiate the node server's chunk for every engine).
	SkippedChunkSizeMisaligned = "chunk-size-misaligned"
)

// Reasons the pod webhook admits a matched pod unwired and without
// annotations (fail open): the reason label of its decisions metric and
// of the warning it returns.
const (
	FailOpenNoEndpoint = "no-endpoint"
	// FailOpenEndpointMismatch: status.endpoint is not the address the
	// operator derives from the spec (someone with cachebackends/status
	// write set it); the webhook never injects an address from status.
	FailOpenEndpointMismatch  = "endpoint-mismatch"
	FailOpenContainerNotFound = "engine-container-not-found"
	FailOpenInternalError     = "internal-error"
)

// Values of AnnotationKVEventsSkipped: why a wired pod has no
// kvevent-subscriber sidecar.
const (
	// KVEventsUserConfig: the engine sets its own --kv-events-config. The
	// webhook keeps it and adds no sidecar: the user's endpoint may be one
	// the sidecar cannot reach (another pod, a connect-mode address), and
	// following it would silently depend on the user's choice.
	KVEventsUserConfig = "user-kv-events-config"
	// KVEventsDataParallel: the data-parallel flags are not a single
	// positive size the webhook can follow (not a number, set twice, more
	// than 1024, or multi-node ranks that do not start at 0 in this pod).
	KVEventsDataParallel = "data-parallel-unsupported"
	// KVEventsNameTaken: the pod already has a container named
	// kvevent-subscriber or a volume named inferencecache-index-token.
	KVEventsNameTaken = "name-taken"
	// KVEventsHostNetwork: the pod sets spec.hostNetwork. Its network
	// namespace is the node's, so an abstract socket (ipc://@name) or a
	// loopback port would be reachable by every process on the node, and two
	// such engine pods on one node would collide on the name: the webhook
	// wires no event stream and no sidecar (the cache is still wired).
	KVEventsHostNetwork = "host-network"
	// KVEventsPrefixCachingOff: the vLLM engine turns prefix caching off
	// (--no-enable-prefix-caching last): vLLM then only logs a warning and
	// publishes no block events, so a sidecar would report a pod that never
	// streams anything.
	KVEventsPrefixCachingOff = "prefix-caching-off"
)
