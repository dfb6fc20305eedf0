package inject

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestNumbaCache: an engine wired to LMCache (either shape) gets a
// writable numba cache unless it sets NUMBA_CACHE_DIR itself; a name or
// path of the webhook's already taken leaves the pod unwired with the
// reason; SGLang HiCache (no LMCache) gets none.
func TestNumbaCache(t *testing.T) {
	withMount := func(name, path string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name})
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: name, MountPath: path})
		}
	}
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		backend v1alpha1.CacheBackend
		outcome Outcome
		// env, mounts and volumes the engine container and pod end with,
		// beyond what they started with (nil: none).
		env     []corev1.EnvVar
		mounts  []corev1.VolumeMount
		volumes []corev1.Volume
		message string
	}{
		{name: "in-process", pod: enginePod(), backend: backend("cache"), outcome: Injected,
			env: []corev1.EnvVar{numbaEnv}, mounts: []corev1.VolumeMount{numbaMount}, volumes: []corev1.Volume{numbaVolume}},
		{name: "multiprocess", pod: enginePod(), backend: mpBackend("cache"), outcome: Injected,
			env: []corev1.EnvVar{numbaEnv}, mounts: []corev1.VolumeMount{dshmMount, numbaMount}, volumes: []corev1.Volume{dshmVolume("1Gi"), numbaVolume}},
		{name: "the container's own NUMBA_CACHE_DIR is kept, nothing added", pod: enginePod(withEnv(NumbaCacheEnv, "/scratch/numba")),
			backend: backend("cache"), outcome: Injected},
		{name: "a volume of the webhook's name is a conflict", pod: enginePod(withMount(v1alpha1.VolumeNumbaCache, "/elsewhere")),
			backend: backend("cache"), outcome: Skipped, message: "volume " + v1alpha1.VolumeNumbaCache},
		{name: "a mount at the cache's path is a conflict", pod: enginePod(withMount("mine", NumbaCacheDir+"/")),
			backend: backend("cache"), outcome: Skipped, message: "a volume mounted at " + NumbaCacheDir},
		{name: "SGLang HiCache loads no LMCache", pod: enginePod(), backend: backend("cache", sglang), outcome: Injected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.pod.DeepCopy()
			d := Decide(tc.pod, []v1alpha1.CacheBackend{tc.backend}, Options{})
			assert.Equal(t, tc.outcome, d.Outcome, d.Message)
			if tc.message != "" {
				assert.Contains(t, d.Message, tc.message)
			}
			if tc.outcome != Injected {
				assert.Equal(t, in.Spec, d.Pod.Spec, "unwired: nothing changed")
				return
			}
			c, was := d.Pod.Spec.Containers[0], in.Spec.Containers[0]
			var numba []corev1.EnvVar
			for _, e := range c.Env {
				if e.Name == NumbaCacheEnv {
					numba = append(numba, e)
				}
			}
			want := tc.env
			for _, e := range was.Env {
				if e.Name == NumbaCacheEnv {
					want = append(want, e)
				}
			}
			assert.Equal(t, want, numba, "NUMBA_CACHE_DIR")
			assert.Equal(t, append(was.VolumeMounts, tc.mounts...), c.VolumeMounts)
			assert.Equal(t, append(in.Spec.Volumes, tc.volumes...), d.Pod.Spec.Volumes)
		})
	}
}
