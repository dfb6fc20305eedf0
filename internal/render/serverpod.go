package render

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// DefaultServerUID is the user and group the cache server runs as unless
// spec.remoteStorage.lmCacheServer.pod says otherwise: not root, and no
// user of the image (the conventional "nonroot" ID of distroless images).
// lmcache_server reads only the image's world-readable Python install and
// writes only to its scratch space (ScratchPath); test/conformance runs it,
// and the container's probe, as this ID.
const DefaultServerUID = int64(65532)

// Default resources of the server container when spec.remoteStorage.
// lmCacheServer.resources is unset. lmcache_server 0.5.x keeps every KV
// chunk it is sent in memory and evicts nothing (its local backend), so the
// memory limit bounds the cache: at the limit the server is OOM-killed and
// restarts empty, and engines miss until it fills again. Size it with
// .resources (docs/security.md, "The cache server's pod").
var (
	DefaultServerCPURequest    = resource.MustParse("500m")
	DefaultServerMemoryRequest = resource.MustParse("2Gi")
	DefaultServerMemoryLimit   = resource.MustParse("8Gi")
)

// DefaultResources are the server container's resources when the spec
// sets none.
func DefaultResources() *corev1.ResourceRequirements {
	return &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    DefaultServerCPURequest,
			corev1.ResourceMemory: DefaultServerMemoryRequest,
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: DefaultServerMemoryLimit,
		},
	}
}

// ServerPodDefaults is p (nil: none) with the hardened defaults in every
// field it leaves unset, the pod Pod Security "restricted" admits:
//   - runAsNonRoot true with runAsUser and runAsGroup DefaultServerUID, all
//     three only when none of them is set on the pod or the container (a
//     spec that names an identity, or runAsNonRoot false, keeps its own);
//   - seccompProfile RuntimeDefault unless either level sets one;
//   - allowPrivilegeEscalation false unless set;
//   - capabilities drop ALL unless capabilities are set.
//
// p itself is not changed.
func ServerPodDefaults(p *v1alpha1.ServerPod) *v1alpha1.ServerPod {
	out := &v1alpha1.ServerPod{}
	if p != nil {
		out = p.DeepCopy()
	}
	if out.SecurityContext == nil {
		out.SecurityContext = &v1alpha1.ServerPodSecurityContext{}
	}
	if out.ContainerSecurityContext == nil {
		out.ContainerSecurityContext = &v1alpha1.ServerContainerSecurityContext{}
	}
	psc, csc := out.SecurityContext, out.ContainerSecurityContext
	if psc.RunAsNonRoot == nil && psc.RunAsUser == nil && psc.RunAsGroup == nil && csc.RunAsNonRoot == nil && csc.RunAsUser == nil {
		uid := DefaultServerUID
		psc.RunAsNonRoot, psc.RunAsUser, psc.RunAsGroup = ptr.To(true), &uid, ptr.To(uid)
	}
	if psc.SeccompProfile == nil && csc.SeccompProfile == nil {
		psc.SeccompProfile = &v1alpha1.ServerSeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	if csc.AllowPrivilegeEscalation == nil {
		csc.AllowPrivilegeEscalation = ptr.To(false)
	}
	if csc.Capabilities == nil {
		csc.Capabilities = &v1alpha1.ServerCapabilities{Drop: []string{"ALL"}}
	}
	return out
}

// The server's scratch space: an emptyDir at ScratchPath, and numba's
// cache in it. LMCache compiles its numba kernels with cache=True when it
// is imported (lmcache/v1/platform/torch_ops/cachegen_kernels.py); numba
// needs a writable folder for that cache, next to the source or under
// HOME, and a user other than the image's root has neither (HOME is "/"
// for a user the image's passwd does not list): lmcache_server then exits
// at import with "cannot import name 'device_ops' from 'lmcache'" after
// "cannot cache function '_encode_single_channel': no locator available"
// (found by test/conformance running it as DefaultServerUID). The emptyDir
// also keeps the server working under readOnlyRootFilesystem.
const (
	ScratchVolumeName = "tmp"
	ScratchPath       = "/tmp"
	NumbaCacheDir     = ScratchPath + "/numba"
)

// noAPIToken keeps the namespace's ServiceAccount token out of a server
// pod (automountServiceAccountToken: false, issue 35): LMCache's server
// never calls the Kubernetes API, and a token in the pod would let
// anything that takes over the server through its unauthenticated ports
// act as that ServiceAccount. Part of the
// hardened defaults: a server created before them keeps its pods
// (Options.LegacyPod) and mounts the token until it opts in.
func noAPIToken(spec *corev1ac.PodSpecApplyConfiguration) {
	spec.WithAutomountServiceAccountToken(false)
}

// ScratchSizeLimit bounds the scratch emptyDir. numba writes its cache
// there only when a kernel is first compiled; importing lmcache's server
// wrote no file into it here (LMCache 0.5.6).
var ScratchSizeLimit = resource.MustParse("256Mi")

func scratch(spec *corev1ac.PodSpecApplyConfiguration, c *corev1ac.ContainerApplyConfiguration) {
	noAPIToken(spec)
	spec.WithVolumes(corev1ac.Volume().WithName(ScratchVolumeName).
		WithEmptyDir(corev1ac.EmptyDirVolumeSource().WithSizeLimit(ScratchSizeLimit)))
	c.WithVolumeMounts(corev1ac.VolumeMount().WithName(ScratchVolumeName).WithMountPath(ScratchPath))
	c.WithEnv(corev1ac.EnvVar().WithName("NUMBA_CACHE_DIR").WithValue(NumbaCacheDir))
}
