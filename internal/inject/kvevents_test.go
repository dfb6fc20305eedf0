package inject

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

const (
	subscriberImage = "example.com/kvevent-subscriber:v1"
	indexEndpoint   = "cache-index.inferencecache-system.svc.cluster.local:9400"
)

func observed(cb *v1alpha1.CacheBackend) {
	cb.Spec.Observation = &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"}
}

func sglang(cb *v1alpha1.CacheBackend) {
	cb.Spec.Runtime, cb.Spec.Type, cb.Status.Endpoint = v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache, ""
}

func withArgs(args ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, args...) }
}

func sidecarEnv(t *testing.T, p *corev1.Pod) map[string]string {
	t.Helper()
	require.NotEmpty(t, p.Spec.InitContainers)
	c := p.Spec.InitContainers[len(p.Spec.InitContainers)-1]
	require.Equal(t, SubscriberContainer, c.Name)
	out := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			out[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
			continue
		}
		out[e.Name] = e.Value
	}
	return out
}

func kvEventsJSON(t *testing.T, p *corev1.Pod, abbrev bool) map[string]any {
	t.Helper()
	uses := FlagUses(p.Spec.Containers[0].Args, KVEventsConfigFlag, abbrev)
	require.Len(t, uses, 1)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal([]byte(uses[0].Value), &cfg))
	return cfg
}

func hashAlgos(p *corev1.Pod) []string {
	var out []string
	for _, u := range FlagUses(p.Spec.Containers[0].Args, HashAlgoFlag, false) {
		out = append(out, u.Value)
	}
	return out
}

// TestKVEventsWiring is the KV-event wiring's table: endpoints, replay,
// hash algorithm, native sidecar, token volume, the user's own flags, and
// when there is no sidecar.
func TestKVEventsWiring(t *testing.T) {
	opts := Options{KVEventSubscriberImage: subscriberImage, IndexEndpoint: indexEndpoint}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		backend v1alpha1.CacheBackend
		opts    Options
		skipped string // v1alpha1.AnnotationKVEventsSkipped, "" when absent
		check   func(t *testing.T, out *corev1.Pod)
	}{
		{
			name: "data-parallel size 1: ipc PUB and replay sockets in the pod, sidecar told both",
			pod:  enginePod(), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				cfg := kvEventsJSON(t, out, false)
				assert.Equal(t, map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
					"endpoint": KVEventsPubIPC, "replay_endpoint": KVEventsReplayIPC, "topic": KVEventsTopic}, cfg)
				env := sidecarEnv(t, out)
				assert.Equal(t, KVEventsPubIPC, env["KV_EVENTS_ENDPOINT"])
				assert.Equal(t, KVEventsReplayIPC, env["KV_EVENTS_REPLAY_ENDPOINT"])
				assert.Equal(t, KVEventsTopic, env["KV_EVENTS_TOPIC"])
				assert.Equal(t, "1", env["KV_EVENTS_DP_SIZE"])
				assert.Equal(t, "vllm", env["KV_EVENTS_ENGINE"])
				assert.Empty(t, out.Spec.Containers[0].Ports, "no port opened on the engine")
			},
		},
		{
			name: "vLLM gets sha256_cbor and the sidecar is told",
			pod:  enginePod(), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, []string{HashAlgoSHA256CBOR}, hashAlgos(out))
				assert.Equal(t, HashAlgoSHA256CBOR, sidecarEnv(t, out)["KV_EVENTS_HASH_ALGORITHM"])
			},
		},
		{
			name: "the user's own hash algorithm (--flag=value) is kept and passed on",
			pod:  enginePod(withArgs("--prefix-caching-hash-algo=xxhash")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, []string{"xxhash"}, hashAlgos(out), "never clobbered, never added twice")
				assert.Equal(t, "xxhash", sidecarEnv(t, out)["KV_EVENTS_HASH_ALGORITHM"])
			},
		},
		{
			name: "the user's own hash algorithm (an abbreviation vLLM's parser takes) is kept",
			pod:  enginePod(withArgs("--prefix-caching-hash", "xxhash_cbor")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, hashAlgos(out), "no --prefix-caching-hash-algo added after the user's own")
				assert.Equal(t, "xxhash_cbor", sidecarEnv(t, out)["KV_EVENTS_HASH_ALGORITHM"])
			},
		},
		{
			name: "the user's own hash algorithm (underscore spelling) is kept",
			pod:  enginePod(withArgs("--prefix_caching_hash_algo", "sha256")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, []string{"sha256"}, hashAlgos(out))
				assert.Equal(t, "sha256", sidecarEnv(t, out)["KV_EVENTS_HASH_ALGORITHM"])
			},
		},
		{
			name: "PYTHONHASHSEED and --block-size reach the subscriber",
			pod: enginePod(withArgs("--block-size", "32"), func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "PYTHONHASHSEED", Value: "0"})
			}), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				env := sidecarEnv(t, out)
				assert.Equal(t, "0", env["KV_EVENTS_HASH_SEEDS"])
				assert.Equal(t, "32", env["KV_EVENTS_BLOCK_SIZE"])
			},
		},
		{
			name: "native sidecar: the last init container, restartPolicy Always, started before the engine",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "fetch-model", Image: "busybox"}}
			}), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				require.Len(t, out.Spec.InitContainers, 2)
				assert.Equal(t, "fetch-model", out.Spec.InitContainers[0].Name, "the pod's own init containers keep their order")
				c := out.Spec.InitContainers[1]
				assert.Equal(t, SubscriberContainer, c.Name)
				assert.Equal(t, subscriberImage, c.Image)
				require.NotNil(t, c.RestartPolicy)
				assert.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy)
				require.NotNil(t, c.StartupProbe, "the kubelet starts the engine once the subscriber is up")
				assert.Equal(t, "/readyz", c.StartupProbe.HTTPGet.Path)
				assert.Len(t, out.Spec.Containers, 1, "no regular container added")
				env := sidecarEnv(t, out)
				assert.Equal(t, "fieldRef:metadata.name", env["POD_NAME"])
				assert.Equal(t, "fieldRef:metadata.namespace", env["POD_NAMESPACE"])
				assert.Equal(t, "fieldRef:metadata.uid", env["POD_UID"])
				assert.Equal(t, "fieldRef:spec.nodeName", env["NODE_NAME"])
				assert.Equal(t, "Qwen/Qwen2.5-0.5B-Instruct", env["MODEL_ID"])
				assert.Equal(t, "llm/cache", env["CACHEBACKEND"])
			},
		},
		{
			name: "projected token of the index's audience, mounted read-only, INDEX_TOKEN_FILE and INDEX_ENDPOINT set",
			pod:  enginePod(), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				require.Len(t, out.Spec.Volumes, 3, "the numba cache, the empty API-token path, the index token")
				v := out.Spec.Volumes[2]
				assert.Equal(t, v1alpha1.VolumeIndexToken, v.Name)
				require.NotNil(t, v.Projected)
				require.Len(t, v.Projected.Sources, 1)
				tok := v.Projected.Sources[0].ServiceAccountToken
				require.NotNil(t, tok)
				assert.Equal(t, "inferencecache-index", tok.Audience, "cache-index's default --audience")
				assert.Equal(t, v1alpha1.IndexTokenAudience, tok.Audience)
				c := out.Spec.InitContainers[0]
				assert.Equal(t, []corev1.VolumeMount{noAPITokenMount, {Name: v1alpha1.VolumeIndexToken, MountPath: IndexTokenDir, ReadOnly: true}}, c.VolumeMounts)
				env := sidecarEnv(t, out)
				assert.Equal(t, IndexTokenDir+"/"+tok.Path, env["INDEX_TOKEN_FILE"])
				assert.Equal(t, indexEndpoint, env["INDEX_ENDPOINT"])
				assert.Equal(t, []corev1.VolumeMount{numbaMount}, out.Spec.Containers[0].VolumeMounts, "the engine does not see the token")
			},
		},
		{
			name: "no index endpoint: mirror-only sidecar, no token",
			pod:  enginePod(), backend: backend("cache", observed), opts: Options{KVEventSubscriberImage: subscriberImage},
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, []corev1.Volume{numbaVolume, noAPITokenVolume}, out.Spec.Volumes, "only the engine's numba cache and the sidecar's empty API-token path")
				assert.Equal(t, []corev1.VolumeMount{noAPITokenMount}, out.Spec.InitContainers[0].VolumeMounts)
				env := sidecarEnv(t, out)
				assert.NotContains(t, env, "INDEX_ENDPOINT")
				assert.NotContains(t, env, "INDEX_TOKEN_FILE")
			},
		},
		{
			name: "data-parallel size 4 (vLLM -dp): TCP, PUB ports 5557+r, replay on loopback past them",
			pod:  enginePod(withArgs("-dp", "4")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				cfg := kvEventsJSON(t, out, false)
				assert.Equal(t, "tcp://*:5557", cfg["endpoint"], "vLLM binds a PUB endpoint only with a wildcard")
				assert.Equal(t, "tcp://127.0.0.1:5561", cfg["replay_endpoint"], "the replay ROUTER always binds: loopback only")
				env := sidecarEnv(t, out)
				assert.Equal(t, "tcp://127.0.0.1:5557", env["KV_EVENTS_ENDPOINT"])
				assert.Equal(t, "tcp://127.0.0.1:5561", env["KV_EVENTS_REPLAY_ENDPOINT"])
				assert.Equal(t, "4", env["KV_EVENTS_DP_SIZE"])
			},
		},
		{
			name: "data-parallel size 2 (--data-parallel-size=2)",
			pod:  enginePod(withArgs("--data-parallel-size=2")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, "tcp://127.0.0.1:5559", sidecarEnv(t, out)["KV_EVENTS_REPLAY_ENDPOINT"])
				assert.Equal(t, "2", sidecarEnv(t, out)["KV_EVENTS_DP_SIZE"])
			},
		},
		{
			name: "multi-node data parallelism: no sidecar, reason recorded, cache still wired",
			pod:  enginePod(withArgs("--data-parallel-size", "4", "--data-parallel-size-local", "2")), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsDataParallel,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false))
				assert.Len(t, FlagUses(out.Spec.Containers[0].Args, KVTransferConfigFlag, false), 1)
			},
		},
		{
			name: "the user's own --kv-events-config is kept: no sidecar, no hash flag, reason recorded",
			pod:  enginePod(withArgs("--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000"}`)), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsUserConfig,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Equal(t, []corev1.Volume{numbaVolume}, out.Spec.Volumes, "the engine's numba cache alone")
				assert.Empty(t, hashAlgos(out))
				uses := FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false)
				require.Len(t, uses, 1)
				assert.Contains(t, uses[0].Value, "tcp://*:6000")
				_, wired := env(out.Spec.Containers[0], envRemoteURL)
				assert.True(t, wired, "the cache wiring does not depend on the sidecar")
			},
		},
		{
			name: "the user's own kv-events sub-key (dotted spelling) counts as their own",
			pod:  enginePod(withArgs("--kv_events_config.endpoint=tcp://*:6000")), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsUserConfig,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", "--kv_events_config.endpoint=tcp://*:6000",
					KVTransferConfigFlag, `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`}, out.Spec.Containers[0].Args)
			},
		},
		{
			name: "hostNetwork: no event stream on the node's namespace, no sidecar, reason recorded, cache still wired",
			pod:  enginePod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsHostNetwork,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Equal(t, []corev1.Volume{numbaVolume}, out.Spec.Volumes, "no index token")
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false))
				assert.Empty(t, hashAlgos(out))
				_, wired := env(out.Spec.Containers[0], envRemoteURL)
				assert.True(t, wired, "the cache wiring does not depend on the sidecar")
			},
		},
		{
			name:    "hostNetwork with data-parallel size 2: no TCP PUB socket on the node's interfaces either",
			pod:     enginePod(withArgs("--data-parallel-size=2"), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
			backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsHostNetwork,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false))
			},
		},
		{
			name: "vLLM with prefix caching off: it publishes no block events, so no stream and no sidecar; cache still wired",
			pod:  enginePod(withArgs("--no-enable-prefix-caching")), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsPrefixCachingOff,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, true))
				_, wired := env(out.Spec.Containers[0], envRemoteURL)
				assert.True(t, wired, "the cache wiring does not depend on the sidecar")
			},
		},
		{
			name: "vLLM with prefix caching off in an abbreviated underscore spelling",
			pod:  enginePod(withArgs("--no_enable_prefix")), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsPrefixCachingOff,
			check:   func(t *testing.T, out *corev1.Pod) { assert.Empty(t, out.Spec.InitContainers) },
		},
		{
			name: "vLLM with prefix caching off, then on again: the last one counts, the sidecar is added",
			pod:  enginePod(withArgs("--no-enable-prefix-caching", "--enable-prefix-caching")), backend: backend("cache", observed), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) { assert.Len(t, out.Spec.InitContainers, 1) },
		},
		{
			name: "SGLang with hostNetwork: no --kv-events-config, no sidecar",
			pod:  enginePod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), backend: backend("hicache", observed, sglang), opts: opts,
			skipped: v1alpha1.KVEventsHostNetwork,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, true))
			},
		},
		{
			name: "hostNetwork and the user's own --kv-events-config: theirs is kept, and that is the reason",
			pod: enginePod(withArgs("--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000"}`),
				func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
			backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsUserConfig,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
			},
		},
		{
			name: "a container already named kvevent-subscriber: no sidecar, reason recorded",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: SubscriberContainer, Image: "mine"})
			}), backend: backend("cache", observed), opts: opts,
			skipped: v1alpha1.KVEventsNameTaken,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Len(t, out.Spec.Containers, 2)
			},
		},
		{
			name: "no sidecar without the manager's image",
			pod:  enginePod(), backend: backend("cache", observed), opts: Options{IndexEndpoint: indexEndpoint},
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Equal(t, []corev1.Volume{numbaVolume}, out.Spec.Volumes, "the engine's numba cache alone")
				assert.Empty(t, FlagUses(out.Spec.Containers[0].Args, KVEventsConfigFlag, false))
				assert.Empty(t, hashAlgos(out), "no hash flag without observation")
			},
		},
		{
			name: "no sidecar without spec.observation.modelID",
			pod:  enginePod(), backend: backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Spec.Observation = &v1alpha1.Observation{} }), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
				assert.Empty(t, hashAlgos(out))
			},
		},
		{
			name: "SGLang: --kv-events-config without vLLM's switch, no vLLM hash flag, page size passed on",
			pod:  enginePod(), backend: backend("hicache", observed, sglang, func(cb *v1alpha1.CacheBackend) {
				cb.Spec.HiCache = &v1alpha1.HiCache{PageSize: ptrInt32(64)}
			}), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				cfg := kvEventsJSON(t, out, true)
				assert.Equal(t, map[string]any{"publisher": "zmq", "endpoint": KVEventsPubIPC, "replay_endpoint": KVEventsReplayIPC, "topic": KVEventsTopic}, cfg)
				assert.Empty(t, hashAlgos(out))
				env := sidecarEnv(t, out)
				assert.Equal(t, "sglang", env["KV_EVENTS_ENGINE"])
				assert.Equal(t, "sglang_sha256", env["KV_EVENTS_HASH_ALGORITHM"])
				assert.Equal(t, "64", env["KV_EVENTS_BLOCK_SIZE"])
				// The router-facing URL: the pod's IP and SGLang's default port.
				assert.Equal(t, "fieldRef:status.podIP", env["POD_IP"])
				assert.Equal(t, "30000", env["WORKER_PORT"])
			},
		},
		{
			name: "SGLang --port: the worker's URL follows it",
			pod:  enginePod(withArgs("--port=8080")), backend: backend("hicache", observed, sglang), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, "8080", sidecarEnv(t, out)["WORKER_PORT"])
			},
		},
		{
			name: "SGLang: the user's abbreviated --kv-events flag is their own",
			pod:  enginePod(withArgs("--kv-events", `{"publisher":"zmq"}`)), backend: backend("hicache", observed, sglang), opts: opts,
			skipped: v1alpha1.KVEventsUserConfig,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Empty(t, out.Spec.InitContainers)
			},
		},
		{
			name: "SGLang --dp-size 2: TCP ports",
			pod:  enginePod(withArgs("--dp-size", "2")), backend: backend("hicache", observed, sglang), opts: opts,
			check: func(t *testing.T, out *corev1.Pod) {
				assert.Equal(t, "tcp://*:5557", kvEventsJSON(t, out, true)["endpoint"])
				assert.Equal(t, "2", sidecarEnv(t, out)["KV_EVENTS_DP_SIZE"])
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cbs := []v1alpha1.CacheBackend{tc.backend}
			d := Decide(tc.pod, cbs, tc.opts)
			require.Equal(t, Injected, d.Outcome, d.Message)
			if tc.skipped == "" {
				assert.NotContains(t, d.Pod.Annotations, v1alpha1.AnnotationKVEventsSkipped)
			} else {
				assert.Equal(t, tc.skipped, d.Pod.Annotations[v1alpha1.AnnotationKVEventsSkipped])
			}
			tc.check(t, d.Pod)
			// The receipt covers what was added.
			assert.Equal(t, receipt.Digest(d.Pod), d.Pod.Annotations[v1alpha1.AnnotationInjectedConfigDigest])
			// Admitted twice (reinvocation): nothing changes.
			again := Decide(d.Pod, cbs, tc.opts)
			assert.True(t, equality.Semantic.DeepEqual(d.Pod, again.Pod), "deciding on the output changes nothing")
			// The patch applies and touches only what was added.
			raw, err := json.Marshal(tc.pod)
			require.NoError(t, err)
			ad, ops, err := Admit(raw, cbs, tc.opts)
			require.NoError(t, err)
			assertPatchApplies(t, raw, ops, ad.Pod)
			// The served path (which decodes only part of the pod) decides the same.
			assert.Equal(t, d.Pod.Annotations[v1alpha1.AnnotationKVEventsSkipped], ad.Pod.Annotations[v1alpha1.AnnotationKVEventsSkipped], "served path: kv-events-skipped")
			assert.Equal(t, d.Pod.Annotations[v1alpha1.AnnotationInjectedConfigDigest], ad.Pod.Annotations[v1alpha1.AnnotationInjectedConfigDigest], "served path: receipt digest")
			for _, op := range ops {
				assert.Equal(t, "add", op.Operation, op.Path)
				assert.Regexp(t, `^/(metadata/annotations(/.*)?|spec/containers/0/(args|env|volumeMounts)(/-)?|spec/initContainers(/-)?|spec/volumes(/-)?)$`, op.Path)
			}
		})
	}
}

// TestKVEventsPatchIsMinimal: with the pod's own init containers and
// volumes the patch appends to them, never replaces them.
func TestKVEventsPatchIsMinimal(t *testing.T) {
	pod := enginePod(func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "fetch-model", Image: "busybox"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "models"}}
	})
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	d, ops, err := Admit(raw, []v1alpha1.CacheBackend{backend("cache", observed)}, Options{KVEventSubscriberImage: subscriberImage, IndexEndpoint: indexEndpoint})
	require.NoError(t, err)
	assertPatchApplies(t, raw, ops, d.Pod)
	paths := map[string]int{}
	for _, op := range ops {
		paths[op.Path]++
	}
	assert.Equal(t, 1, paths["/spec/initContainers/-"])
	assert.Equal(t, 3, paths["/spec/volumes/-"], "the empty API-token path, the index token and the numba cache")
	assert.NotContains(t, paths, "/spec/initContainers")
	assert.NotContains(t, paths, "/spec/volumes")
}

// TestDataParallelSize: the sizes the webhook follows and those it does not.
func TestDataParallelSize(t *testing.T) {
	for _, tc := range []struct {
		rt   v1alpha1.Runtime
		args []string
		n    int
		ok   bool
	}{
		{v1alpha1.RuntimeVLLM, nil, 1, true},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-size", "8"}, 8, true},
		{v1alpha1.RuntimeVLLM, []string{"--data_parallel_size=3"}, 3, true},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "2"}, 2, true},
		{v1alpha1.RuntimeVLLM, []string{"-dp=2"}, 2, true},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "0"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "x"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "2000"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "2", "--data-parallel-size", "2"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"-dp", "4", "-dpl", "2"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-start-rank", "2"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-rank=1"}, 0, false},
		// vLLM's parser takes unique prefixes: abbreviated multi-node flags count.
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-size", "4", "--data-parallel-size-l", "2"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-size", "4", "--data-parallel-start", "2"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-ra=1"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--data-parallel-size", "4", "--data_parallel_size_local", "4"}, 0, false},
		{v1alpha1.RuntimeVLLM, []string{"--", "-dp", "2"}, 1, true},
		{v1alpha1.RuntimeSGLang, []string{"--dp-size", "2"}, 2, true},
		{v1alpha1.RuntimeSGLang, []string{"--dp", "4"}, 4, true},
		{v1alpha1.RuntimeSGLang, []string{"--dp-si=2"}, 2, true},
		{v1alpha1.RuntimeSGLang, []string{"--dp-size", "2", "--node-rank", "1"}, 0, false},
	} {
		n, ok := DataParallelSize(tc.args, tc.rt)
		assert.Equal(t, tc.ok, ok, "%s %q", tc.rt, tc.args)
		if tc.ok {
			assert.Equal(t, tc.n, n, "%s %q", tc.rt, tc.args)
		}
	}
}

// TestKVEventsSkippedCannotBePreset: a pod creator cannot pre-set the
// skipped reason (it would hide a missing sidecar behind a made-up reason).
func TestKVEventsSkippedCannotBePreset(t *testing.T) {
	pod := enginePod(withAnnotations(v1alpha1.AnnotationKVEventsSkipped, v1alpha1.KVEventsUserConfig))
	d := Decide(pod, []v1alpha1.CacheBackend{backend("cache", observed)}, Options{KVEventSubscriberImage: subscriberImage})
	assert.NotContains(t, d.Pod.Annotations, v1alpha1.AnnotationKVEventsSkipped)
	assert.Len(t, d.Pod.Spec.InitContainers, 1)
}

func ptrInt32(v int32) *int32 { return &v }

// TestDefaultIndexEndpoint: by default the sidecars forward to the install
// bundle's index Service, named in the operator's namespace and the
// cluster's domain.
func TestDefaultIndexEndpoint(t *testing.T) {
	assert.Equal(t, "inferencecache-index-peers.inferencecache-system.svc.cluster.local:9400", DefaultIndexEndpoint("inferencecache-system", ""))
	assert.Equal(t, "inferencecache-index-peers.ops.svc.corp.example:9400", DefaultIndexEndpoint("ops", "corp.example"))
}

var (
	noAPITokenVolume = corev1.Volume{Name: v1alpha1.VolumeNoAPIToken, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	noAPITokenMount  = corev1.VolumeMount{Name: v1alpha1.VolumeNoAPIToken, MountPath: ServiceAccountTokenDir, ReadOnly: true}
)

// TestSidecarIsStoredAsSigned (issue 37, found on the real node): the API
// server defaults every container field a webhook leaves unset, after the
// webhook, and runs its ServiceAccount admission again on the containers
// the webhook added; the receipt's digest covers the sidecar, so the
// webhook sets each of those fields as the API server would (probe
// scheme, timeout and success threshold; termination message path and
// policy; the pull policy the image's tag gives; the projected token's
// mode) and mounts an empty volume over the API token's path, which that
// admission skips.
func TestSidecarIsStoredAsSigned(t *testing.T) {
	for _, img := range []struct {
		image string
		want  corev1.PullPolicy
	}{
		{"ghcr.io/inferencecache/inferencecache-kvevent-subscriber:v0.9.0", corev1.PullIfNotPresent},
		{"ghcr.io/inferencecache/inferencecache-kvevent-subscriber:latest", corev1.PullAlways},
		{"ghcr.io/inferencecache/inferencecache-kvevent-subscriber", corev1.PullAlways},
		{"localhost:5000/inferencecache-kvevent-subscriber", corev1.PullAlways},
		{"localhost:5000/inferencecache-kvevent-subscriber:v1", corev1.PullIfNotPresent},
		{"localhost/inferencecache-kvevent-subscriber@sha256:22f129c3bed97dbef6034c3d3419e8797eb2b480212d51c4a57de5fa4cd25e1a", corev1.PullIfNotPresent},
		{"ghcr.io/x/y:latest@sha256:22f129c3bed97dbef6034c3d3419e8797eb2b480212d51c4a57de5fa4cd25e1a", corev1.PullAlways},
	} {
		out := Decide(enginePod(), []v1alpha1.CacheBackend{backend("cache", observed)}, Options{KVEventSubscriberImage: img.image, IndexEndpoint: indexEndpoint}).Pod
		require.Len(t, out.Spec.InitContainers, 1, img.image)
		c := out.Spec.InitContainers[0]
		assert.Equal(t, img.want, c.ImagePullPolicy, img.image)
		assert.Equal(t, corev1.TerminationMessagePathDefault, c.TerminationMessagePath)
		assert.Equal(t, corev1.TerminationMessageReadFile, c.TerminationMessagePolicy)
		p := c.StartupProbe
		assert.Equal(t, corev1.URISchemeHTTP, p.HTTPGet.Scheme)
		assert.Equal(t, int32(1), p.TimeoutSeconds)
		assert.Equal(t, int32(1), p.SuccessThreshold)
		assert.Contains(t, c.VolumeMounts, noAPITokenMount)
		assert.Contains(t, out.Spec.Volumes, noAPITokenVolume)
		i := slices.IndexFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == v1alpha1.VolumeIndexToken })
		require.GreaterOrEqual(t, i, 0)
		assert.Equal(t, ptr.To(corev1.ProjectedVolumeSourceDefaultMode), out.Spec.Volumes[i].Projected.DefaultMode)
	}
}
