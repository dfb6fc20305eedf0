package conformance_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// TestWiredEngineImportsLMCacheReadOnly: an engine wired to LMCache
// imports the connector module the webhook's --kv-transfer-config names
// (LMCache's MP connector; for the in-process server, the adapter vLLM's
// LMCacheConnectorV1 imports) where the image's files and $HOME are not
// writable (a non-root engine, as Pod Security restricted runs it, or a
// read-only root file system), with the environment the webhook gives it:
// NUMBA_CACHE_DIR on the webhook's own volume (a folder here). Without it
// the same import fails: LMCache compiles its numba kernels with
// cache=True on import and numba finds nowhere to write them ("cannot
// import name 'device_ops' from 'lmcache'"), so the engine would not
// start. Held to every supported LMCache (pyenv.Cells); the environment's
// folder is mounted read-only in a mount namespace of its own (root).
func TestWiredEngineImportsLMCacheReadOnly(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "lmcache") {
		t.Run(cell.Env, func(t *testing.T) {
			dir := pyenv.Dir(t, cell.Env)
			shapes := []struct {
				name, module string
				backend      v1alpha1.CacheBackend
			}{
				{"multiprocess", inject.LMCacheMPConnectorModulePath, newBackend(v1alpha1.RuntimeVLLM, v1alpha1.BackendTypeLMCache, func(cb *v1alpha1.CacheBackend) {
					cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")}}
				})},
				{"in-process", "lmcache.integration.vllm.vllm_v1_adapter", newBackend(v1alpha1.RuntimeVLLM, v1alpha1.BackendTypeLMCache)},
			}
			for _, s := range shapes {
				t.Run(s.name, func(t *testing.T) {
					pod := newEnginePod(corev1.Container{Image: "lmcache/vllm-openai:v" + cell.LMCache(), Args: []string{"--model", model}},
						func(p *corev1.Pod) { p.Annotations[v1alpha1.AnnotationVLLMVersion] = cell.VLLM() })
					d, engine := admit(t, s.backend, pod, inject.Options{})
					if d.Outcome != inject.Injected {
						// LMCache 0.5.7 has no in-process server: unwired
						// (TestInProcessRefusalsAreLMCaches).
						require.Equal(t, "in-process", s.name, "%s: %s", d.Reason, d.Message)
						t.Logf("unwired for LMCache %s: %s", cell.LMCache(), d.Reason)
						return
					}
					var cache string
					env := []string{"PATH=/usr/bin:/bin", "HOME=/proc", "CUDA_VISIBLE_DEVICES=", "PYTHONDONTWRITEBYTECODE=1"}
					for _, e := range engine.Env {
						if e.Name == inject.NumbaCacheEnv {
							cache = e.Value
							continue
						}
						if e.ValueFrom == nil {
							env = append(env, e.Name+"="+e.Value)
						}
					}
					require.Equal(t, inject.NumbaCacheDir, cache, "the webhook sets NUMBA_CACHE_DIR")
					assert.Contains(t, engine.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.VolumeNumbaCache, MountPath: cache}, "on its own volume")
					imports := func(env []string) (string, error) {
						script := fmt.Sprintf("mount --bind %[1]s %[1]s && mount -o remount,ro,bind %[1]s && cd / && exec %[1]s/bin/python -c 'import %[2]s'", dir, s.module)
						cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
						cmd.Env = env
						out, err := cmd.CombinedOutput()
						return string(out), err
					}
					out, err := imports(append(env, inject.NumbaCacheEnv+"="+t.TempDir()))
					require.NoError(t, err, "with the webhook's environment, %s does not import:\n%s", s.module, tail(out, 3000))
					out, err = imports(env)
					require.Error(t, err, "without NUMBA_CACHE_DIR, %s imports: the webhook's volume is not needed", s.module)
					assert.True(t, strings.Contains(out, "device_ops"), "without NUMBA_CACHE_DIR: %s", tail(out, 1500))
				})
			}
		})
	}
}
