package inject

import (
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// The numba cache of an engine wired to LMCache.
const (
	// NumbaCacheEnv is numba's cache folder variable.
	NumbaCacheEnv = "NUMBA_CACHE_DIR"
	// NumbaCacheDir is where the webhook mounts the cache's volume.
	NumbaCacheDir = "/var/cache/inferencecache/numba"
)

// NumbaCacheSize is the sizeLimit of the numba cache's volume. LMCache's
// compiled kernels take well under a megabyte; the limit only bounds the
// node's disk.
var NumbaCacheSize = resource.MustParse("256Mi")

// ensureNumbaCache gives the engine container c of pod p, wired to
// LMCache, a writable numba cache. Importing LMCache (0.5.6, 0.5.7)
// compiles its numba kernels with cache=True, and numba refuses to when
// neither the package's own folder nor $HOME/.cache is writable: a user
// other than the image's (Pod Security restricted runs engines as
// non-root) or a read-only root file system. lmcache then loads without
// its device_ops, and both connectors the webhook names fail to import
// ("cannot import name 'device_ops' from 'lmcache'"): the engine would not
// start. Unless c sets NUMBA_CACHE_DIR itself (kept), the webhook points
// it at an empty volume of its own. It returns a conflict when the pod
// already has a volume of that name, or c mounts something at its path.
func ensureNumbaCache(p *corev1.Pod, c *corev1.Container) []string {
	if slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == NumbaCacheEnv }) {
		return nil
	}
	name := v1alpha1.VolumeNumbaCache
	if slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }) {
		return []string{"volume " + name}
	}
	if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == NumbaCacheDir }) {
		return []string{"a volume mounted at " + NumbaCacheDir}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: NumbaCacheEnv, Value: NumbaCacheDir})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: NumbaCacheDir})
	size := NumbaCacheSize.DeepCopy()
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size},
	}})
	return nil
}
