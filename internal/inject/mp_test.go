package inject

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
)

// mpBackend is an LMCache CacheBackend in multiprocess mode whose
// status.endpoint is the one the operator publishes for it.
// mpBackend is a multiprocess-mode CacheBackend whose engines declare
// vLLM 0.33.0 (TestMPWiringFollowsTheVLLMRelease varies the release).
func mpBackend(name string, mut ...func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	cb := backend(name, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("8Gi")}}
		cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{VLLM: "0.33.0"}
	})
	for _, m := range mut {
		m(&cb)
	}
	cb.Status.Endpoint = topology.Endpoint(&cb, "")
	return cb
}

func withArgsMP(args ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, args...) }
}

func withEnv(name, value string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: name, Value: value})
	}
}

func dshmVolume(size string) corev1.Volume {
	return corev1.Volume{Name: v1alpha1.VolumeEngineSharedMemory, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse(size))},
	}}
}

var dshmMount = corev1.VolumeMount{Name: v1alpha1.VolumeEngineSharedMemory, MountPath: "/dev/shm"}

// The numba cache every LMCache-wired engine gets (numba.go).
var (
	numbaVolume = corev1.Volume{Name: v1alpha1.VolumeNumbaCache, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))},
	}}
	numbaMount = corev1.VolumeMount{Name: v1alpha1.VolumeNumbaCache, MountPath: NumbaCacheDir}
	numbaEnv   = corev1.EnvVar{Name: NumbaCacheEnv, Value: NumbaCacheDir}
)

// TestDecideMultiprocess: a pod a multiprocess-mode CacheBackend selects
// gets the MP connector, its env and a private /dev/shm, or is left
// unwired with the reason.
func TestDecideMultiprocess(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	const host = "cache.llm.svc.cluster.local"
	wiredReceipts := map[string]string{v1alpha1.AnnotationInjectedBy: "llm/cache", v1alpha1.AnnotationInjectedByUID: "uid-cache-cache", v1alpha1.AnnotationInjectedGeneration: "3"}
	skipped := func(r string) map[string]string { return map[string]string{v1alpha1.AnnotationInjectSkipped: r} }
	cases := []struct {
		name     string
		pod      *corev1.Pod
		backend  v1alpha1.CacheBackend
		opts     Options
		outcome  Outcome
		reason   string
		receipts map[string]string
		check    func(t *testing.T, in, out *corev1.Pod, d Decision)
	}{
		{
			name: "wired: MP connector, env, private /dev/shm of 1Gi by default, signed receipt",
			pod:  enginePod(), backend: mpBackend("cache"), opts: Options{Key: &key},
			outcome: Injected, receipts: wiredReceipts,
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				c := out.Spec.Containers[0]
				assert.Equal(t, []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", KVTransferConfigFlag, MPKVTransferConfig(host, 5555, v1alpha1.RoleReadWrite)}, c.Args)
				assert.Equal(t, []corev1.EnvVar{{Name: "HF_HOME", Value: "/models"}, {Name: "PYTHONHASHSEED", Value: "0"}, {Name: "LMCACHE_TRACK_USAGE", Value: "false"}, numbaEnv}, c.Env,
					"no LMCACHE_REMOTE_URL or other in-process LMCache setting")
				assert.Equal(t, []corev1.VolumeMount{dshmMount, numbaMount}, c.VolumeMounts)
				require.Len(t, out.Spec.Volumes, 2)
				assert.True(t, equality.Semantic.DeepEqual(dshmVolume("1Gi"), out.Spec.Volumes[0]), "%+v", out.Spec.Volumes[0])
				assert.True(t, equality.Semantic.DeepEqual(numbaVolume, out.Spec.Volumes[1]), "%+v", out.Spec.Volumes[1])
				assert.Equal(t, receipt.Digest(out), out.Annotations[v1alpha1.AnnotationInjectedConfigDigest])
				require.NoError(t, receipt.Verify([]receipt.Key{key}, out, ClaimOf(out)), "the signed receipt verifies")
				tampered := out.DeepCopy()
				tampered.Spec.Containers[0].VolumeMounts = nil
				assert.ErrorIs(t, receipt.Verify([]receipt.Key{key}, tampered, ClaimOf(tampered)), receipt.ErrConfigMismatch, "the digest covers the /dev/shm mount")
			},
		},
		{
			name: "role, port, cluster domain and engineSharedMemory",
			pod:  enginePod(),
			backend: func() v1alpha1.CacheBackend {
				cb := mpBackend("cache", func(cb *v1alpha1.CacheBackend) {
					cb.Spec.Integration.Role = v1alpha1.RoleReadOnly
					cb.Spec.Multiprocess.Port = 6000
					cb.Spec.Multiprocess.EngineSharedMemory = ptr.To(resource.MustParse("4Gi"))
				})
				cb.Status.Endpoint = topology.Endpoint(&cb, "example.org")
				return cb
			}(),
			opts:    Options{ClusterDomain: "example.org"},
			outcome: Injected, receipts: wiredReceipts,
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				c := out.Spec.Containers[0]
				uses := FlagUses(c.Args, KVTransferConfigFlag, true)
				require.Len(t, uses, 1)
				assert.JSONEq(t, `{"kv_connector":"LMCacheMPConnector","kv_connector_module_path":"lmcache.integration.vllm.lmcache_mp_connector","kv_role":"kv_consumer",
					"kv_connector_extra_config":{"lmcache.mp.host":"tcp://cache.llm.svc.example.org","lmcache.mp.port":6000,"lmcache.mp.isolated_ipc":true}}`, uses[0].Value)
				require.Len(t, out.Spec.Volumes, 2)
				assert.True(t, equality.Semantic.DeepEqual(dshmVolume("4Gi"), out.Spec.Volumes[0]), "%+v", out.Spec.Volumes[0])
			},
		},
		{
			name: "the pod's own /dev/shm is kept and nothing is added but the numba cache",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "shm", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/shm"}}}}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "shm", MountPath: "/dev/shm/"}}
			}),
			backend: mpBackend("cache"), outcome: Injected, receipts: wiredReceipts,
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				assert.Equal(t, append(in.Spec.Volumes, numbaVolume), out.Spec.Volumes)
				assert.Equal(t, append(in.Spec.Containers[0].VolumeMounts, numbaMount), out.Spec.Containers[0].VolumeMounts)
				assert.Len(t, FlagUses(out.Spec.Containers[0].Args, KVTransferConfigFlag, true), 1, "still wired")
			},
		},
		{
			name:    "an equal MP config the pod already sets is accepted",
			pod:     enginePod(withArgsMP(KVTransferConfigFlag + "=" + MPKVTransferConfig(host, 5555, v1alpha1.RoleReadWrite))),
			backend: mpBackend("cache"), outcome: Injected, receipts: wiredReceipts,
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				assert.Equal(t, in.Spec.Containers[0].Args, out.Spec.Containers[0].Args, "flag not added twice")
			},
		},
		{
			name:    "the pod's own --kv-transfer-config is never overwritten",
			pod:     enginePod(withArgsMP(KVTransferConfigFlag, `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`)),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedUserConfig, receipts: skipped(v1alpha1.SkippedUserConfig),
			check: unchangedMP,
		},
		{
			name:    "the pod's own PYTHONHASHSEED is never overwritten",
			pod:     enginePod(withEnv("PYTHONHASHSEED", "42")),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedUserConfig, receipts: skipped(v1alpha1.SkippedUserConfig),
			check: unchangedMP,
		},
		{
			name: "a volume of the webhook's name not mounted at /dev/shm is a conflict",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: v1alpha1.VolumeEngineSharedMemory}}
			}),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedUserConfig, receipts: skipped(v1alpha1.SkippedUserConfig),
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				unchangedMP(t, in, out, d)
				assert.Contains(t, d.Message, "volume "+v1alpha1.VolumeEngineSharedMemory)
			},
		},
		{
			name:    "expandable segments: isolated IPC cannot share them",
			pod:     enginePod(withEnv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512, expandable_segments:True")),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, receipts: skipped(v1alpha1.SkippedIsolatedIPCUnsupported),
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				unchangedMP(t, in, out, d)
				assert.Contains(t, d.Message, "expandable_segments:True")
			},
		},
		{
			name:    "expandable segments under torch's newer variable",
			pod:     enginePod(withEnv("PYTORCH_ALLOC_CONF", "expandable_segments:true")),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, receipts: skipped(v1alpha1.SkippedIsolatedIPCUnsupported),
			check: unchangedMP,
		},
		{
			name: "an allocator setting from a ConfigMap cannot be checked",
			pod: enginePod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "PYTORCH_CUDA_ALLOC_CONF", ValueFrom: &corev1.EnvVarSource{
					ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "torch"}, Key: "conf"},
				}})
			}),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, receipts: skipped(v1alpha1.SkippedIsolatedIPCUnsupported),
			check: unchangedMP,
		},
		{
			name:    "expandable segments off is wired",
			pod:     enginePod(withEnv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")),
			backend: mpBackend("cache"), outcome: Injected, receipts: wiredReceipts,
		},
		{
			name:    "sleep mode: isolated IPC cannot share CuMemAllocator memory",
			pod:     enginePod(withArgsMP("--enable-sleep-mode")),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, receipts: skipped(v1alpha1.SkippedIsolatedIPCUnsupported),
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				unchangedMP(t, in, out, d)
				assert.Contains(t, d.Message, "--enable-sleep-mode")
			},
		},
		{
			name:    "sleep mode, underscored and abbreviated",
			pod:     enginePod(withArgsMP("--no-enable-sleep-mode", "--enable_sleep")),
			backend: mpBackend("cache"), outcome: Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, receipts: skipped(v1alpha1.SkippedIsolatedIPCUnsupported),
			check: unchangedMP,
		},
		{
			name:    "sleep mode turned off last is wired",
			pod:     enginePod(withArgsMP("--enable-sleep-mode", "--no-enable-sleep-mode")),
			backend: mpBackend("cache"), outcome: Injected, receipts: wiredReceipts,
		},
		{
			name:    "in-process mode ignores the isolated-IPC constraints",
			pod:     enginePod(withEnv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), withArgsMP("--enable-sleep-mode")),
			backend: backend("cache"), outcome: Injected, receipts: wiredReceipts,
			check: func(t *testing.T, in, out *corev1.Pod, d Decision) {
				assert.Equal(t, []corev1.Volume{numbaVolume}, out.Spec.Volumes, "no /dev/shm in-process")
				assert.Equal(t, []corev1.VolumeMount{numbaMount}, out.Spec.Containers[0].VolumeMounts)
				v, _ := env(out.Spec.Containers[0], "LMCACHE_REMOTE_URL")
				assert.Equal(t, endpoint, v)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.pod.DeepCopy()
			backends := []v1alpha1.CacheBackend{tc.backend}
			d := Decide(tc.pod, backends, tc.opts)
			assert.Equal(t, tc.outcome, d.Outcome, d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			assert.Equal(t, tc.receipts, receipts(d.Pod))
			assert.True(t, equality.Semantic.DeepEqual(in, tc.pod), "Decide does not modify its input")
			if tc.check != nil {
				tc.check(t, tc.pod, d.Pod, d)
			}
			again := Decide(d.Pod, backends, tc.opts)
			assert.Equal(t, d.Outcome, again.Outcome)
			assert.True(t, equality.Semantic.DeepEqual(d.Pod, again.Pod), "running the mutation on its own output changes nothing")

			// The webhook's patch turns the pod as sent into the decided one.
			raw, err := json.Marshal(tc.pod)
			require.NoError(t, err)
			ad, ops, err := Admit(raw, backends, tc.opts)
			require.NoError(t, err)
			require.Equal(t, d.Outcome, ad.Outcome)
			assertPatchApplies(t, raw, ops, ad.Pod)
		})
	}
}

func unchangedMP(t *testing.T, in, out *corev1.Pod, _ Decision) { unchangedSpec(t, in, out) }

// TestMPEndpointMismatch: a multiprocess backend whose status names the
// in-process address (or any other) is not followed.
func TestMPEndpointMismatch(t *testing.T) {
	cb := mpBackend("cache")
	cb.Status.Endpoint = "lm://cache.llm.svc.cluster.local:5555"
	d := Decide(enginePod(), []v1alpha1.CacheBackend{cb}, Options{})
	assert.Equal(t, FailOpen, d.Outcome)
	assert.Equal(t, v1alpha1.FailOpenEndpointMismatch, d.Reason)
	assert.Contains(t, d.Message, "tcp://cache.llm.svc.cluster.local:5555")
}

func TestExpandableSegments(t *testing.T) {
	for conf, want := range map[string]bool{
		"expandable_segments:True": true, "expandable_segments:true": true, " expandable_segments : True ": true,
		"max_split_size_mb:128,expandable_segments:True": true, "expandable_segments:False": false,
		"": false, "garbage_collection_threshold:0.6": false, "expandable_segments_handle_type:posix_fd": false,
	} {
		assert.Equal(t, want, ExpandableSegments(conf), "%q", conf)
	}
}

func TestSleepModeOn(t *testing.T) {
	for _, tc := range []struct {
		cmdline []string
		want    bool
	}{
		{nil, false},
		{[]string{"vllm", "serve", "m"}, false},
		{[]string{"vllm", "serve", "m", "--enable-sleep-mode"}, true},
		{[]string{"--enable_sleep_mode"}, true},
		{[]string{"--enable-sleep"}, true},
		{[]string{"--enable-sleep-mode", "--no-enable-sleep-mode"}, false},
		{[]string{"--no-enable-sleep-mode", "--enable-sleep-mode"}, true},
		{[]string{"--", "--enable-sleep-mode"}, false},
		{[]string{"--sleep-mode-backend", "x"}, false},
	} {
		assert.Equal(t, tc.want, SleepModeOn(tc.cmdline), "%q", tc.cmdline)
	}
}

// TestMPDigestCoversSharedMemoryVolume: the receipt covers the /dev/shm
// volume the webhook adds, the webhook's partial decode digests a pod as
// the full pod does (a user's volume of that name too), and a receipt
// copied onto a pod whose volume of that name has another source does not
// verify.
func TestMPDigestCoversSharedMemoryVolume(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	opts := Options{Key: &key}
	backends := []v1alpha1.CacheBackend{mpBackend("cache")}
	hostShm := corev1.Volume{Name: v1alpha1.VolumeEngineSharedMemory, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/shm"}}}
	for name, pod := range map[string]*corev1.Pod{
		"added by the webhook": enginePod(),
		"the user's, kept": enginePod(func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{hostShm}
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{dshmMount}
		}),
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := json.Marshal(pod)
			require.NoError(t, err)
			d, _, err := Admit(raw, backends, opts)
			require.NoError(t, err)
			require.Equal(t, Injected, d.Outcome, d.Message)
			// The pod as the API server stores it: the full pod, patched.
			full := Decide(pod, backends, opts).Pod
			require.NoError(t, receipt.Verify([]receipt.Key{key}, full, ClaimOf(d.Pod)), "the webhook's digest is the full pod's")
			require.Len(t, full.Spec.Volumes, 2)
			moved := full.DeepCopy()
			moved.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/other"}}
			assert.ErrorIs(t, receipt.Verify([]receipt.Key{key}, moved, ClaimOf(moved)), receipt.ErrConfigMismatch)
		})
	}
}
