package controller

// The operator's permissions, in one place: `make manifests` generates
// kustomize/base/rbac/role.yaml from these markers (and those of
// internal/certs). Least privilege, checked by test/gitops:
//
//   - Secrets: only in the operator's namespace, get and update only by
//     name (the receipt key, the webhook certificate); create cannot be
//     limited to a name by RBAC, so it is allowed in that namespace only.
//   - Leases (leader election): only in the operator's namespace.
//   - cachebackends/finalizers update: the owner references the operator
//     sets with blockOwnerDeletion need it where the
//     OwnerReferencesPermissionEnforcement admission plugin is on.
//   - tokenreviews and subjectaccessreviews create: the metrics endpoint
//     authenticates and authorizes its scrapers through the API server,
//     and the CacheBackend validating webhook asks whether the requesting
//     user may get each Secret a CacheBackend names
//     (internal/validation/secrets.go).
//   - Pods: read only (get, list, watch). The receipt controller records
//     one event per pod and never writes to the pod (docs/security.md).
//   - pods/eviction create is not here: it is a ClusterRole of its own,
//     inferencecache-operator-engine-eviction
//     (kustomize/base/rbac/engine_eviction.yaml, written by hand), which an
//     install may leave out (kustomize/components/without-engine-eviction,
//     the chart's engineEviction.enabled=false). The per-node restart
//     cascade of multiprocess mode evicts with it the wired engine pods of
//     a node whose server was replaced (a Deployment spans nodes: rolling
//     it would restart the engines of every node); an eviction respects
//     the pod's PodDisruptionBudget, and never changes the pod. Without
//     it, the cascade names the pods to restart (EngineEvictionForbidden).

// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends,verbs=get;list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends/status,verbs=get;patch;update
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=inferencecache-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=inferencecache-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=inferencecache-system,resources=secrets,resourceNames=inferencecache-receipt-key,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
