package inject

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject/injecttest"
	"github.com/inferencecache/operator/internal/topology"
)

// TestMPWiringFollowsTheVLLMRelease: the multiprocess wiring follows the
// vLLM release the pod runs (annotation, then image tag, then the
// backend's declaration): 0.33 gets the connector with its module path,
// 0.34 the extensible KV cache turned off as well (vLLM 0.34 turns it on
// for a connector named by module path, and LMCache's isolated IPC cannot
// export it), an unknown release the connector without a module path
// (which every supported vLLM accepts and vLLM 0.34 treats as legacy CUDA
// IPC). The receipt records the release and where it was read.
func TestMPWiringFollowsTheVLLMRelease(t *testing.T) {
	const host = "cache.llm.svc.cluster.local"
	withImage := func(image string) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Containers[0].Image = image }
	}
	declared := func(v string) func(*v1alpha1.CacheBackend) {
		return func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{VLLM: v} }
	}
	withPath := MPKVTransferConfigFor(host, 5555, v1alpha1.RoleReadWrite, true)
	without := MPKVTransferConfigFor(host, 5555, v1alpha1.RoleReadWrite, false)
	model := []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"}
	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		backend  v1alpha1.CacheBackend
		outcome  Outcome
		reason   string
		args     []string
		wiredFor string
		message  string
	}{
		{
			name: "0.33 declared by the backend", pod: enginePod(), backend: mpBackend("cache", declared("0.33.0")),
			outcome: Injected, args: append(model, KVTransferConfigFlag, withPath), wiredFor: "vllm=0.33.0 (backend); lmcache=unknown",
		},
		{
			name: "0.34 from the image tag", pod: enginePod(withImage("vllm/vllm-openai:v0.34.0")), backend: mpBackend("cache", declared("0.33.0")),
			outcome: Injected, args: append(model, KVTransferConfigFlag, withPath, ExtensibleKVCacheOptOut), wiredFor: "vllm=0.34.0 (image); lmcache=unknown",
		},
		{
			name:    "the annotation before the image",
			pod:     enginePod(withImage("vllm/vllm-openai:v0.33.0"), injecttest.WithAnnotations(v1alpha1.AnnotationVLLMVersion, "0.34.1")),
			backend: mpBackend("cache"), outcome: Injected,
			args: append(model, KVTransferConfigFlag, withPath, ExtensibleKVCacheOptOut), wiredFor: "vllm=0.34.1 (annotation); lmcache=unknown",
		},
		{
			name: "unknown: no module path, no release-specific flag", pod: enginePod(withImage("example.com/engine:v1")), backend: mpBackend("cache", declared("")),
			outcome: Injected, args: append(model, KVTransferConfigFlag, without), wiredFor: "vllm=unknown; lmcache=unknown", message: "vLLM release is unknown",
		},
		{
			name: "an unreadable annotation is unknown, and said", pod: enginePod(injecttest.WithAnnotations(v1alpha1.AnnotationVLLMVersion, "newest")), backend: mpBackend("cache"),
			outcome: Injected, args: append(model, KVTransferConfigFlag, without), wiredFor: "vllm=unknown; lmcache=unknown", message: `inferencecache.io/vllm-version: "newest" is not a release version`,
		},
		{
			name: "0.34 whose pod turns the extensible cache off itself", pod: enginePod(withImage("vllm/vllm-openai:v0.34.0"), withArgsMP("--disable-extensible-kv-cache")), backend: mpBackend("cache"),
			outcome: Injected, args: append(model, "--disable-extensible-kv-cache", KVTransferConfigFlag, withPath), wiredFor: "vllm=0.34.0 (image); lmcache=unknown",
		},
		{
			name: "0.34 whose pod already opts out", pod: enginePod(withImage("vllm/vllm-openai:v0.34.0"), withArgsMP(ExtensibleKVCacheOptOut)), backend: mpBackend("cache"),
			outcome: Injected, args: append(model, ExtensibleKVCacheOptOut, KVTransferConfigFlag, withPath), wiredFor: "vllm=0.34.0 (image); lmcache=unknown",
		},
		{
			name: "0.34 whose pod turns the extensible cache on is left unwired", pod: enginePod(withImage("vllm/vllm-openai:v0.34.0"), withArgsMP("--enable-extensible-kv")), backend: mpBackend("cache"),
			outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, args: append(model, "--enable-extensible-kv"),
		},
		{
			name: "in-process: LMCache 0.5.7 in the engine is left unwired", pod: enginePod(withImage("lmcache/vllm-openai:v0.5.7rc2")), backend: backend("cache"),
			outcome: Skipped, reason: v1alpha1.SkippedEngineRelease, args: model, message: "has no in-process adapter",
		},
		{
			name: "in-process: LMCache 0.5.6 in the engine", pod: enginePod(withImage("lmcache/vllm-openai:v0.5.6")), backend: backend("cache"),
			outcome: Injected, args: append(model, KVTransferConfigFlag, kvTransferConfig(v1alpha1.RoleReadWrite)), wiredFor: "vllm=unknown; lmcache=0.5.6 (image)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := tc.backend
			cb.Status.Endpoint = topology.Endpoint(&cb, "")
			d := Decide(tc.pod, []v1alpha1.CacheBackend{cb}, Options{})
			require.Equal(t, tc.outcome, d.Outcome, d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			assert.Equal(t, tc.args, d.Pod.Spec.Containers[0].Args)
			assert.Equal(t, tc.wiredFor, d.Pod.Annotations[v1alpha1.AnnotationWiredFor])
			if tc.message != "" {
				assert.Contains(t, d.Message, tc.message)
			}
		})
	}
}

// TestMPChunkGuard: LMCache's MP connector refuses an engine whose block
// size (times its decode context parallel size) does not divide the
// server's chunk of 256 tokens: such a pod is left unwired with the
// reason, in every spelling of the flags vLLM reads; vLLM's own default
// block sizes (16, 64) and the divisors of 256 are wired.
func TestMPChunkGuard(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		wired bool
	}{
		{nil, true},
		{[]string{"--block-size", "16"}, true},
		{[]string{"--block-size=128"}, true},
		{[]string{"--block-size", "256"}, true},
		{[]string{"--block-size", "48"}, false},
		{[]string{"--block_size", "400"}, false},
		{[]string{"--block-size", "512"}, false},
		{[]string{"--block-size", "128", "-dcp", "2"}, true},
		{[]string{"--block-size", "128", "-dcp", "4"}, false},
		{[]string{"--block-size", "64", "--decode-context-parallel-size=8"}, false},
		{[]string{"--block-size", "48", "--block-size", "32"}, true}, // argparse keeps the last
	} {
		d := Decide(enginePod(withArgsMP(tc.args...)), []v1alpha1.CacheBackend{mpBackend("cache")}, Options{})
		if tc.wired {
			assert.Equal(t, Injected, d.Outcome, "%q: %s", tc.args, d.Message)
			continue
		}
		assert.Equal(t, Skipped, d.Outcome, "%q", tc.args)
		assert.Equal(t, v1alpha1.SkippedChunkSizeMisaligned, d.Reason, "%q", tc.args)
		assert.Contains(t, d.Message, "does not divide the multiprocess server's chunk of 256 tokens", "%q", tc.args)
	}
}

// TestWiredForIsLMCaches: the receipt records the releases for pods of an
// LMCache backend, whose wiring follows them; a pod wired with SGLang's
// HiCache flags gets no such record.
func TestWiredForIsLMCaches(t *testing.T) {
	hicache := backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Runtime, cb.Spec.Type, cb.Status.Endpoint = v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache, ""
	})
	d := Decide(enginePod(), []v1alpha1.CacheBackend{hicache}, Options{})
	require.Equal(t, Injected, d.Outcome, d.Message)
	assert.NotContains(t, d.Pod.Annotations, v1alpha1.AnnotationWiredFor)
	lm := backend("cache")
	lm.Status.Endpoint = topology.Endpoint(&lm, "")
	d = Decide(enginePod(), []v1alpha1.CacheBackend{lm}, Options{})
	require.Equal(t, Injected, d.Outcome, d.Message)
	assert.Equal(t, "vllm=unknown; lmcache=unknown", d.Pod.Annotations[v1alpha1.AnnotationWiredFor])
	assert.True(t, VLLMReleaseUnknown(d.Pod.Annotations[v1alpha1.AnnotationWiredFor]))
	assert.False(t, VLLMReleaseUnknown("vllm=0.34.0 (image); lmcache=unknown"))
	assert.False(t, VLLMReleaseUnknown("vllm=unknownish"))
	assert.False(t, VLLMReleaseUnknown(""))
}
