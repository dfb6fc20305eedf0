package inject

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject/injecttest"
)

// The shared fixtures, under the names these tests use.
var (
	backend         = injecttest.Backend
	enginePod       = injecttest.EnginePod
	withAnnotations = injecttest.WithAnnotations
	forgedReceipt   = injecttest.ForgedReceipt
)

const endpoint = "lm://cache.llm.svc.cluster.local:65432"

func env(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func receipts(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, k := range []string{v1alpha1.AnnotationInjectedBy, v1alpha1.AnnotationInjectedByUID, v1alpha1.AnnotationInjectedGeneration, v1alpha1.AnnotationInjectSkipped} {
		if v, ok := p.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// TestDecide covers the binding seed's lifecycle and failure-modes table.
func TestDecide(t *testing.T) {
	kvBoth := `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`
	cases := []struct {
		name     string
		pod      *corev1.Pod
		backends []v1alpha1.CacheBackend
		opts     Options
		outcome  Outcome
		reason   string
		backend  string
		receipts map[string]string
		check    func(t *testing.T, in, out *corev1.Pod)
	}{
		{
			name: "lifecycle 3: matched pod with a published endpoint is wired",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				c := out.Spec.Containers[0]
				assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", KVTransferConfigFlag, kvBoth}, c.Args)
				v, _ := env(c, "LMCACHE_REMOTE_URL")
				assert.Equal(t, endpoint, v)
				v, _ = env(c, "LMCACHE_REMOTE_SERDE")
				assert.Equal(t, "naive", v)
				v, _ = env(c, "HF_HOME")
				assert.Equal(t, "/models", v, "the pod's own env is kept")
				// The sidecar is a native sidecar (an init container): look
				// for it there, and among the containers too.
				assert.Len(t, out.Spec.Containers, 1, "no sidecar without --kvevent-subscriber-image")
				assert.Empty(t, out.Spec.InitContainers, "no sidecar without --kvevent-subscriber-image")
				assert.Empty(t, FlagUses(c.Args, KVEventsConfigFlag, false), "no event stream without --kvevent-subscriber-image")
			},
		},
		{
			name: "lifecycle 3: no endpoint yet fails open, unwired and without annotations",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "" })},
			outcome: FailOpen, reason: v1alpha1.FailOpenNoEndpoint, backend: "cache", receipts: map[string]string{},
			check: unchangedSpec,
		},
		{
			name: "fail-open strips a hand-written receipt",
			pod:  enginePod(forgedReceipt), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "" })},
			outcome: FailOpen, reason: v1alpha1.FailOpenNoEndpoint, backend: "cache", receipts: map[string]string{},
		},
		{
			name: "failure mode: selector and labels do not overlap",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen-typo"}
			})},
			outcome: NoMatch, receipts: map[string]string{}, check: unchangedSpec,
		},
		{
			name: "an empty selector matches nothing",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels = nil })},
			outcome: NoMatch, receipts: map[string]string{},
		},
		{
			name: "no match strips a hand-written receipt",
			pod:  enginePod(forgedReceipt), backends: nil,
			outcome: NoMatch, receipts: map[string]string{},
		},
		{
			name: "failure mode: overlapping selectors pick the first name",
			pod:  enginePod(),
			backends: []v1alpha1.CacheBackend{
				backend("zeta"), backend("alpha"), backend("mid", func(cb *v1alpha1.CacheBackend) {
					cb.Spec.EngineSelector.MatchLabels = map[string]string{"pod-template-hash": "abc"}
				}),
			},
			outcome: Injected, backend: "alpha",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/alpha", v1alpha1.AnnotationInjectedByUID: "uid-cache-alpha", v1alpha1.AnnotationInjectedGeneration: "3"},
		},
		{
			name:     "a deleted CacheBackend claims no pod",
			pod:      enginePod(),
			backends: []v1alpha1.CacheBackend{backend("alpha", func(cb *v1alpha1.CacheBackend) { cb.DeletionTimestamp = ptr.To(metav1.Now()) }), backend("beta")},
			outcome:  Injected, backend: "beta",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/beta", v1alpha1.AnnotationInjectedByUID: "uid-cache-beta", v1alpha1.AnnotationInjectedGeneration: "3"},
		},
		{
			name: "failure mode: intentional opt-out is stamped skip-inject-annotation",
			pod:  enginePod(withAnnotations(v1alpha1.AnnotationSkipInject, "true")), backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome: Skipped, reason: v1alpha1.SkippedByAnnotation, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedByAnnotation},
			check: func(t *testing.T, in, out *corev1.Pod) {
				unchangedSpec(t, in, out)
				assert.Equal(t, "true", out.Annotations[v1alpha1.AnnotationSkipInject], "the skip annotation is kept")
			},
		},
		{
			name: "skip strips a hand-written receipt",
			pod:  enginePod(forgedReceipt, withAnnotations(v1alpha1.AnnotationSkipInject, "yes")), backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome: Skipped, reason: v1alpha1.SkippedByAnnotation, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedByAnnotation},
		},
		{
			name: "failure mode: skip annotation with a falsey value still wires",
			pod:  enginePod(withAnnotations(v1alpha1.AnnotationSkipInject, "false")), backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
		},
		{
			name: "a stale receipt of another backend is replaced",
			pod:  enginePod(forgedReceipt, withAnnotations(v1alpha1.AnnotationInjectSkipped, "skip-inject-annotation")), backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
		},
		{
			name: "the pod's own --kv-transfer-config is never overwritten",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, KVTransferConfigFlag, `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`)
			}),
			backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome:  Skipped, reason: v1alpha1.SkippedUserConfig, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedUserConfig}, check: unchangedSpec,
		},
		{
			name: "the pod's own LMCACHE_ variable is never overwritten",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "LMCACHE_REMOTE_URL", Value: "lm://elsewhere:1"})
			}),
			backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome:  Skipped, reason: v1alpha1.SkippedUserConfig, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedUserConfig}, check: unchangedSpec,
		},
		{
			name: "an equal --kv-transfer-config written as --flag=value is accepted",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, KVTransferConfigFlag+`={"kv_role":"kv_both","kv_connector":"LMCacheConnectorV1"}`)
			}),
			backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome:  Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				assert.Equal(t, in.Spec.Containers[0].Args, out.Spec.Containers[0].Args, "flag not added twice")
			},
		},
		{
			name: "a shell-wrapped engine command is skipped",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Command = []string{"/bin/sh", "-c"}
				p.Spec.Containers[0].Args = []string{"vllm serve Qwen/Qwen2.5-0.5B-Instruct"}
			}),
			backends: []v1alpha1.CacheBackend{backend("cache")},
			outcome:  Skipped, reason: v1alpha1.SkippedShellWrapper, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedShellWrapper}, check: unchangedSpec,
		},
		{
			name: "engineContainer names the wired container",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers = append([]corev1.Container{{Name: "proxy", Image: "envoy"}}, p.Spec.Containers...)
			}),
			backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.EngineContainer = "vllm" })},
			outcome:  Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				assert.Equal(t, in.Spec.Containers[0], out.Spec.Containers[0], "the proxy is untouched")
				_, ok := env(out.Spec.Containers[1], "LMCACHE_REMOTE_URL")
				assert.True(t, ok)
			},
		},
		{
			name:     "a missing engineContainer fails open",
			pod:      enginePod(),
			backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.EngineContainer = "engine" })},
			outcome:  FailOpen, reason: v1alpha1.FailOpenContainerNotFound, backend: "cache", receipts: map[string]string{}, check: unchangedSpec,
		},
		{
			name: "roles, LMCache tiers and overrides",
			pod:  enginePod(),
			backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Integration.Role = v1alpha1.RoleReadOnly
				cb.Spec.LMCache = &v1alpha1.LMCacheConfig{
					ChunkSize: ptr.To[int32](256),
					LocalCPU:  &v1alpha1.LocalCPUTier{MaxSize: resource.MustParse("4Gi")},
					LocalDisk: &v1alpha1.LocalDiskTier{Path: "/cache", MaxSize: resource.MustParse("512Mi")},
				}
				cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{
					Args: []string{"--max-model-len", "4096"},
					Env:  []corev1.EnvVar{{Name: "LMCACHE_REMOTE_SERDE", Value: "cachegen"}, {Name: "VLLM_LOGGING_LEVEL", Value: "DEBUG"}},
				}
			})},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				c := out.Spec.Containers[0]
				assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", KVTransferConfigFlag,
					`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_consumer"}`, "--max-model-len", "4096"}, c.Args)
				for name, want := range map[string]string{
					"LMCACHE_CHUNK_SIZE": "256", "LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "4",
					"LMCACHE_LOCAL_DISK": "file:///cache/", "LMCACHE_MAX_LOCAL_DISK_SIZE": "0.5",
					"LMCACHE_REMOTE_SERDE": "cachegen", "VLLM_LOGGING_LEVEL": "DEBUG",
				} {
					got, _ := env(c, name)
					assert.Equal(t, want, got, name)
				}
			},
		},
		{
			name: "the subscriber sidecar needs both the manager's image and a model id",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Observation = &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"}
			})},
			opts:    Options{KVEventSubscriberImage: "example.com/kvevent-subscriber:v1"},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				require.Len(t, out.Spec.Containers, 1)
				require.Len(t, out.Spec.InitContainers, 1)
				assert.Equal(t, SubscriberContainer, out.Spec.InitContainers[0].Name)
				uses := FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false)
				require.Len(t, uses, 1)
				assert.Contains(t, uses[0].Value, `"publisher":"zmq"`)
			},
		},
		{
			name: "model id without the manager's image: no sidecar",
			pod:  enginePod(), backends: []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Observation = &v1alpha1.Observation{ModelID: "m"}
			})},
			outcome: Injected, backend: "cache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				assert.Len(t, out.Spec.Containers, 1)
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false))
			},
		},
		{
			name: "an SGLang pod that sets a flag SGLang refuses with HiCache (abbreviated) is left unwired",
			pod:  enginePod(withArgs("--disable-radix")),
			backends: []v1alpha1.CacheBackend{backend("hicache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Runtime, cb.Spec.Type, cb.Status.Endpoint = v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache, ""
			})},
			outcome: Skipped, reason: v1alpha1.SkippedUserConfig, backend: "hicache",
			receipts: map[string]string{v1alpha1.AnnotationInjectSkipped: v1alpha1.SkippedUserConfig}, check: unchangedSpec,
		},
		{
			name: "SGLang HiCache flags, no endpoint needed",
			pod:  enginePod(),
			backends: []v1alpha1.CacheBackend{backend("hicache", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Runtime, cb.Spec.Type, cb.Status.Endpoint = v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache, ""
				cb.Spec.HiCache = &v1alpha1.HiCache{
					Ratio: ptr.To("2"), WritePolicy: "write_through", IOBackend: "kernel", MemLayout: "page_first",
					StorageBackend: "file", StoragePrefetchPolicy: "best_effort", PageSize: ptr.To[int32](64),
				}
			})},
			outcome: Injected, backend: "hicache",
			receipts: map[string]string{v1alpha1.AnnotationInjectedBy: "llm/hicache", v1alpha1.AnnotationInjectedByUID: "uid-cache-hicache", v1alpha1.AnnotationInjectedGeneration: "3"},
			check: func(t *testing.T, in, out *corev1.Pod) {
				c := out.Spec.Containers[0]
				assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", "--enable-hierarchical-cache",
					"--hicache-ratio", "2", "--hicache-write-policy", "write_through", "--hicache-io-backend", "kernel",
					"--hicache-mem-layout", "page_first", "--hicache-storage-backend", "file",
					"--hicache-storage-prefetch-policy", "best_effort", "--page-size", "64"}, c.Args)
				_, ok := env(c, "LMCACHE_REMOTE_URL")
				assert.False(t, ok)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.pod.DeepCopy()
			d := Decide(tc.pod, tc.backends, tc.opts)
			assert.Equal(t, tc.outcome, d.Outcome, d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			if tc.backend == "" {
				assert.Nil(t, d.Backend)
			} else {
				require.NotNil(t, d.Backend)
				assert.Equal(t, tc.backend, d.Backend.Name)
			}
			assert.Equal(t, tc.receipts, receipts(d.Pod))
			assert.True(t, equality.Semantic.DeepEqual(in, tc.pod), "Decide does not modify its input")
			if tc.check != nil {
				tc.check(t, tc.pod, d.Pod)
			}
			// Idempotence: deciding on the output changes nothing.
			again := Decide(d.Pod, tc.backends, tc.opts)
			assert.Equal(t, d.Outcome, again.Outcome)
			assert.True(t, equality.Semantic.DeepEqual(d.Pod, again.Pod), "running the mutation on its own output changes nothing")
		})
	}
}

func unchangedSpec(t *testing.T, in, out *corev1.Pod) {
	t.Helper()
	assert.True(t, equality.Semantic.DeepEqual(in.Spec, out.Spec), "pod spec unchanged")
}

// TestSkipRequested is the seed's full opt-out value table. The rule is
// exact: values are not trimmed, so whitespace around a falsey word (or
// whitespace alone) is a non-empty value outside the falsey set, which opts
// the pod out.
func TestSkipRequested(t *testing.T) {
	keepIn := []string{"", "false", "FALSE", "False", "f", "F", "0", "no", "NO", "No", "off", "OFF", "Off", "disable", "DISABLE", "Disable", "disabled", "DISABLED", "Disabled"}
	optOut := []string{"true", "TRUE", "True", "t", "T", "1", "yes", "on", "enabled", "skip", "anything", "2",
		" ", "  ", "\t", " false ", "false ", " no", " 0", "off\n"}
	for _, v := range keepIn {
		assert.False(t, SkipRequested(v), "%q keeps the pod in", v)
	}
	for _, v := range optOut {
		assert.True(t, SkipRequested(v), "%q opts the pod out", v)
	}
}

func TestGiB(t *testing.T) {
	for in, want := range map[string]string{"4Gi": "4", "512Mi": "0.5", "1536Mi": "1.5", "10G": "9.313225746154785", "100Gi": "100", "1Ti": "1024", "1500Mi": "1.46484375", "1Ki": "0.00000095367431640625"} {
		assert.Equal(t, want, GiB(resource.MustParse(in)), in)
	}
}

func TestKVRole(t *testing.T) {
	assert.Equal(t, "kv_both", KVRole(v1alpha1.RoleReadWrite))
	assert.Equal(t, "kv_both", KVRole(""))
	assert.Equal(t, "kv_consumer", KVRole(v1alpha1.RoleReadOnly))
	assert.Equal(t, "kv_producer", KVRole(v1alpha1.RoleWriteOnly))
}

// TestAdmitPatchApplies: the patch Admit returns turns the raw pod into the
// decided pod.
func TestAdmitPatchApplies(t *testing.T) {
	raw, err := json.Marshal(enginePod(forgedReceipt))
	require.NoError(t, err)
	d, ops, err := Admit(raw, []v1alpha1.CacheBackend{backend("cache")}, Options{})
	require.NoError(t, err)
	require.Equal(t, Injected, d.Outcome)
	assertPatchApplies(t, raw, ops, d.Pod)
}

func assertPatchApplies(t testing.TB, raw []byte, ops any, want *corev1.Pod) {
	t.Helper()
	pb, err := json.Marshal(ops)
	require.NoError(t, err)
	patch, err := jsonpatch.DecodePatch(pb)
	require.NoError(t, err)
	patched, err := patch.Apply(raw)
	require.NoError(t, err, "patch applies to the pod")
	// The decision holds the part of the pod the webhook decodes: compare
	// that part; minimalPatch touches nothing else.
	o, err := ReadObject(patched)
	require.NoError(t, err)
	got, err := o.Pod()
	require.NoError(t, err)
	require.True(t, equality.Semantic.DeepEqual(want, got), "patched pod equals the decided pod")
}

var _ = admissionv1.Create
