package inject

import (
	"encoding/json"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestAdmitPatchesOnlyChangedPaths: the patch names only the paths the
// webhook changes; fields this build's Pod type does not know, and every
// field it does not change, stay exactly as the API server sent them.
func TestAdmitPatchesOnlyChangedPaths(t *testing.T) {
	raw := []byte(`{"apiVersion":"v1","kind":"Pod",
	 "metadata":{"name":"engine","namespace":"llm","labels":{"app":"qwen"},"annotations":{"team":"a/b~c"},"futureMeta":1},
	 "spec":{"futureSpecField":{"x":[1,2]},"containers":[{"name":"vllm","image":"vllm","args":["--model","m"],
	   "env":[{"name":"HF_HOME","value":"/models","futureEnvField":true}],"futureContainerField":"keep"}],
	   "nodeSelector":{"a":"b"}}}`)
	cb := backend("cache")
	d, ops, err := Admit(raw, []v1alpha1.CacheBackend{cb}, Options{})
	require.NoError(t, err)
	require.Equal(t, Injected, d.Outcome, d.Message)
	for _, op := range ops {
		assert.Equal(t, "add", op.Operation, op.Path)
		ok := strings.HasPrefix(op.Path, "/metadata/annotations/inferencecache.io~1") ||
			op.Path == "/spec/containers/0/args/-" || op.Path == "/spec/containers/0/env/-" ||
			// The numba cache (the pod had no volumes and the container no
			// mounts: whole lists).
			op.Path == "/spec/volumes" || op.Path == "/spec/containers/0/volumeMounts"
		assert.True(t, ok, "unexpected patch path %s", op.Path)
	}
	pb, err := json.Marshal(ops)
	require.NoError(t, err)
	patch, err := jsonpatch.DecodePatch(pb)
	require.NoError(t, err)
	patched, err := patch.Apply(raw)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(patched, &doc))
	spec := doc["spec"].(map[string]any)
	assert.Equal(t, map[string]any{"x": []any{1.0, 2.0}}, spec["futureSpecField"])
	c := spec["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, "keep", c["futureContainerField"])
	assert.Equal(t, true, c["env"].([]any)[0].(map[string]any)["futureEnvField"])
	assert.Equal(t, 1.0, doc["metadata"].(map[string]any)["futureMeta"])
	assert.Equal(t, "a/b~c", doc["metadata"].(map[string]any)["annotations"].(map[string]any)["team"])
}

func TestFlagSpellings(t *testing.T) {
	own := `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`
	hicache := func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
		cb.Spec.HiCache = &v1alpha1.HiCache{Ratio: ptr.To("2")}
	}
	for _, tc := range []struct {
		name    string
		args    []string
		mut     func(*v1alpha1.CacheBackend)
		outcome Outcome
	}{
		{"underscore spelling with another role is the user's own config", []string{"--kv_transfer_config", `{"kv_connector":"X","kv_role":"kv_consumer"}`}, nil, Skipped},
		{"dotted sub-key is the user's own config", []string{"--kv-transfer-config.kv_role=kv_consumer"}, nil, Skipped},
		{"equals-joined same value is kept, not duplicated", []string{"--kv-transfer-config=" + own}, nil, Injected},
		{"underscore spelling with the same value", []string{"--kv_transfer_config", own}, nil, Injected},
		{"the flag twice", []string{"--kv-transfer-config", own, "--kv-transfer-config", `{"kv_connector":"X"}`}, nil, Skipped},
		{"vLLM prefix abbreviation with another connector is the user's own config", []string{"--kv-transfer-conf", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`}, nil, Skipped},
		{"vLLM prefix abbreviation with the same value is kept, not duplicated", []string{"--kv_transfer=" + own}, nil, Injected},
		{"SGLang prefix abbreviation with another ratio", []string{"--hicache-rat", "3"}, hicache, Skipped},
		{"SGLang abbreviated boolean flag is already set", []string{"--enable-hier"}, hicache, Injected},
		{"SGLang underscore spelling", []string{"--hicache_ratio=3"}, hicache, Skipped},
		{"positional after -- is not a flag", []string{"--", "--hicache-ratio", "3"}, hicache, Injected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var muts []func(*v1alpha1.CacheBackend)
			if tc.mut != nil {
				muts = append(muts, tc.mut)
			}
			pod := enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Args = tc.args })
			d := Decide(pod, []v1alpha1.CacheBackend{backend("cache", muts...)}, Options{})
			require.Equal(t, tc.outcome, d.Outcome, d.Message)
			if d.Outcome == Skipped {
				assert.Equal(t, v1alpha1.SkippedUserConfig, d.Reason)
				return
			}
			args := d.Pod.Spec.Containers[0].Args
			for _, name := range []string{KVTransferConfigFlag, "--enable-hierarchical-cache", "--hicache-ratio"} {
				assert.LessOrEqual(t, len(FlagUses(args, name, true)), 1, "%s set once: %q", name, args)
			}
		})
	}
}

func TestDuplicatesAndEnvFromConflict(t *testing.T) {
	for name, mut := range map[string]func(*corev1.Pod){
		"env name twice (the kubelet keeps the last)": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LMCACHE_REMOTE_URL", Value: "lm://cache.llm.svc.cluster.local:65432"}, {Name: "LMCACHE_REMOTE_URL", Value: "lm://evil:1"}}
		},
		"envFrom": func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "lmcache"}}}}
		},
		"valueFrom on an injected name": func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LMCACHE_REMOTE_SERDE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := Decide(enginePod(mut), []v1alpha1.CacheBackend{backend("cache")}, Options{})
			assert.Equal(t, Skipped, d.Outcome)
			assert.Equal(t, v1alpha1.SkippedUserConfig, d.Reason)
			assert.Empty(t, d.Pod.Annotations[v1alpha1.AnnotationInjectedBy])
		})
	}
}

func TestShellDetectionThroughWrappers(t *testing.T) {
	for _, tc := range []struct {
		cmd, args []string
		wrapped   bool
	}{
		{[]string{"tini", "--"}, []string{"sh", "-c", "vllm serve m"}, true},
		{[]string{"/usr/bin/tini", "-g", "--", "/bin/bash", "-lc", "vllm serve m"}, nil, true},
		{[]string{"dumb-init", "--single-child", "sh", "-c", "vllm serve"}, nil, true},
		{[]string{"/usr/bin/env", "-u", "X", "FOO=1", "bash", "-ec", "vllm serve"}, nil, true},
		{[]string{"env", "-S", "sh -c 'vllm serve'"}, nil, true},
		{[]string{"busybox", "sh", "-c", "vllm serve"}, nil, true},
		{[]string{"tini", "--", "vllm", "serve"}, []string{"-c", "x"}, false},
		{[]string{"env", "FOO=1", "python3", "-m", "vllm.entrypoints.openai.api_server"}, nil, false},
		{[]string{"bash", "/start.sh"}, nil, false},
		// Behind programs the walk does not know: the shell still eats the flags.
		{[]string{"nohup", "sh", "-c", "vllm serve m"}, nil, true},
		{[]string{"timeout", "--signal=TERM", "1h", "sh", "-c"}, []string{"vllm serve m"}, true},
		{[]string{"gosu", "vllm", "/bin/bash", "-o", "pipefail", "-c", "vllm serve m"}, nil, true},
		{[]string{"stdbuf", "-oL", "setsid", "dash", "-ec", "vllm serve m"}, nil, true},
		{[]string{"nohup", "vllm", "serve", "m"}, nil, false},
		{[]string{"taskset", "-c", "0-3", "vllm", "serve", "m"}, nil, false},
		// issue 25: wrappers and interpreters the check missed.
		{[]string{"numactl", "--cpunodebind=0", "--membind=0", "sh", "-c", "vllm serve m"}, nil, true},
		{[]string{"taskset", "-c", "0-3", "bash", "-c", "vllm serve m"}, nil, true},
		{[]string{"su-exec", "vllm", "sh", "-c", "vllm serve m"}, nil, true},
		{[]string{"nice", "-n", "5", "timeout", "1h", "zsh", "-c", "vllm serve m"}, nil, true},
		{[]string{"fish", "-c", "vllm serve m"}, nil, true},
		{[]string{"su", "vllm", "-c", "vllm serve m"}, nil, true},
		{[]string{"runuser", "-u", "vllm", "--", "sh", "-c", "vllm serve m"}, nil, true},
		{[]string{"python3", "-c", "import runpy; runpy.run_module('vllm.entrypoints.openai.api_server')"}, nil, true},
		{[]string{"/usr/bin/python3.12", "-u", "-c", "import vllm"}, nil, true},
		{[]string{"python3", "-uc", "import vllm"}, nil, true},
		{[]string{"python3", "-Wignore", "-Xfaulthandler", "-c", "import vllm"}, nil, true},
		{[]string{"python3", "-X", "faulthandler", "-c", "import vllm"}, nil, true},
		{[]string{"python3", "-Xfaulthandler", "-m", "vllm.entrypoints.openai.api_server"}, nil, false},
		{[]string{"numactl", "-N0", "python3", "-c", "import vllm"}, nil, true},
		{[]string{"python3", "-m", "vllm.entrypoints.openai.api_server"}, []string{"-cc", "{}"}, false},
		{[]string{"python3", "-u", "-W", "ignore", "-m", "vllm.entrypoints.openai.api_server"}, nil, false},
		{[]string{"numactl", "-N0", "python3", "-m", "vllm.entrypoints.openai.api_server"}, nil, false},
		{[]string{"python3", "/app/serve.py"}, []string{"-c", "x"}, false},
	} {
		pod := enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Command, p.Spec.Containers[0].Args = tc.cmd, tc.args })
		d := Decide(pod, []v1alpha1.CacheBackend{backend("cache")}, Options{})
		if tc.wrapped {
			assert.Equal(t, v1alpha1.SkippedShellWrapper, d.Reason, "%q %q", tc.cmd, tc.args)
		} else {
			assert.Equal(t, Injected, d.Outcome, "%q %q: %s", tc.cmd, tc.args, d.Message)
		}
	}
}

func TestSidecarIsRestricted(t *testing.T) {
	cb := backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Spec.Observation = &v1alpha1.Observation{ModelID: "m"} })
	d := Decide(enginePod(), []v1alpha1.CacheBackend{cb}, Options{KVEventSubscriberImage: "sub:v1"})
	require.Equal(t, Injected, d.Outcome)
	require.Len(t, d.Pod.Spec.InitContainers, 1)
	c := d.Pod.Spec.InitContainers[0]
	require.Equal(t, SubscriberContainer, c.Name)
	sc := c.SecurityContext
	require.NotNil(t, sc)
	// Pod Security Standard "restricted", container level.
	assert.Equal(t, ptr.To(false), sc.AllowPrivilegeEscalation)
	assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	assert.Empty(t, sc.Capabilities.Add)
	assert.Equal(t, ptr.To(true), sc.RunAsNonRoot)
	assert.Equal(t, ptr.To(true), sc.ReadOnlyRootFilesystem)
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
	assert.Nil(t, sc.Privileged)
	if sc.RunAsUser != nil {
		assert.NotZero(t, *sc.RunAsUser)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		assert.Contains(t, c.Resources.Requests, r)
		assert.Contains(t, c.Resources.Limits, r)
	}
}

// TestStatusEndpointIsNeverInjected: status.endpoint only gates; the
// address injected is derived from the spec, and a status naming another
// address wires nothing.
func TestStatusEndpointIsNeverInjected(t *testing.T) {
	tampered := backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "lm://attacker.example:65432" })
	d := Decide(enginePod(), []v1alpha1.CacheBackend{tampered}, Options{})
	assert.Equal(t, FailOpen, d.Outcome)
	assert.Equal(t, v1alpha1.FailOpenEndpointMismatch, d.Reason)
	_, set := env(d.Pod.Spec.Containers[0], envRemoteURL)
	assert.False(t, set)

	shortName := backend("cache", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "lm://cache.llm.svc:65432" })
	assert.Equal(t, v1alpha1.FailOpenEndpointMismatch, Decide(enginePod(), []v1alpha1.CacheBackend{shortName}, Options{}).Reason,
		"the short name goes through the resolver's search path")

	d = Decide(enginePod(), []v1alpha1.CacheBackend{backend("cache", func(cb *v1alpha1.CacheBackend) {
		cb.Status.Endpoint = "lm://cache.llm.svc.corp.example:65432"
	})}, Options{ClusterDomain: "corp.example"})
	require.Equal(t, Injected, d.Outcome, d.Message)
	v, _ := env(d.Pod.Spec.Containers[0], envRemoteURL)
	assert.Equal(t, "lm://cache.llm.svc.corp.example:65432", v)
}

func TestEngineOverridesGuard(t *testing.T) {
	withEnv := func(e corev1.EnvVar) func(*v1alpha1.CacheBackend) {
		return func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{e}}
		}
	}
	secret := corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}
	for _, name := range []string{"LD_PRELOAD", "LD_ANYTHING", "BASH_ENV", "NODE_OPTIONS", "PYTHONPATH"} {
		d := Decide(enginePod(), []v1alpha1.CacheBackend{backend("cache", withEnv(corev1.EnvVar{Name: name, Value: "/x"}))}, Options{})
		assert.Equal(t, v1alpha1.SkippedOverrideNotAllowed, d.Reason, name)
		_, set := env(d.Pod.Spec.Containers[0], name)
		assert.False(t, set, name)
	}
	d := Decide(enginePod(), []v1alpha1.CacheBackend{backend("cache", withEnv(secret))}, Options{})
	assert.Equal(t, v1alpha1.SkippedOverrideNotAllowed, d.Reason, "a Secret only for pods that opt in")
	d = Decide(enginePod(withAnnotations(AnnotationAllowSecretOverrides, "true")), []v1alpha1.CacheBackend{backend("cache", withEnv(secret))}, Options{})
	assert.Equal(t, Injected, d.Outcome, d.Message)
	d = Decide(enginePod(), []v1alpha1.CacheBackend{backend("cache", withEnv(corev1.EnvVar{Name: "VLLM_LOGGING_LEVEL", Value: "DEBUG"}))}, Options{})
	assert.Equal(t, Injected, d.Outcome, d.Message)
}

// TestOptInOverrides: engineOverrides.optIn (and entries outside the
// allow-list stored before it was enforced) reach only pods whose template
// opts in; the names never injected stay out even then.
func TestOptInOverrides(t *testing.T) {
	optIn := func(o v1alpha1.OptInOverrides) func(*v1alpha1.CacheBackend) {
		return func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--max-model-len", "4096"}, OptIn: &o}
		}
	}
	legacy := func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "PYTHONWARNINGS", Value: "ignore::antigravity.x"}}}
	}
	trust := optIn(v1alpha1.OptInOverrides{Args: []string{"--trust-remote-code"}, Env: []corev1.EnvVar{{Name: "VLLM_LOGGING_CONFIG_PATH", Value: "/etc/logging.json"}}})
	opted := withAnnotations(AnnotationAllowOverrides, "true")
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		mut     func(*v1alpha1.CacheBackend)
		outcome Outcome
		args    []string
	}{
		{"optIn, pod without the annotation", enginePod(), trust, Skipped, nil},
		{"optIn, pod annotated false", enginePod(withAnnotations(AnnotationAllowOverrides, "false")), trust, Skipped, nil},
		{"optIn, pod opted in", enginePod(opted), trust, Injected, []string{"--max-model-len", "4096", "--trust-remote-code"}},
		{"stored before the allow-list, pod without the annotation", enginePod(), legacy, Skipped, nil},
		{"stored before the allow-list, pod opted in", enginePod(opted), legacy, Injected, nil},
		{"a denied name in optIn, pod opted in", enginePod(opted), optIn(v1alpha1.OptInOverrides{Env: []corev1.EnvVar{{Name: "LD_PRELOAD", Value: "/x.so"}}}), Skipped, nil},
		{"allow-listed only, no annotation needed", enginePod(), optIn(v1alpha1.OptInOverrides{}), Injected, []string{"--max-model-len", "4096"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.pod, []v1alpha1.CacheBackend{backend("cache", tc.mut)}, Options{})
			require.Equal(t, tc.outcome, d.Outcome, d.Message)
			if tc.outcome == Skipped {
				assert.Equal(t, v1alpha1.SkippedOverrideNotAllowed, d.Reason)
				assert.NotContains(t, d.Pod.Spec.Containers[0].Args, "--trust-remote-code")
				_, set := env(d.Pod.Spec.Containers[0], "LD_PRELOAD")
				assert.False(t, set)
				if !strings.Contains(d.Message, "LD_PRELOAD") {
					assert.Contains(t, d.Message, AnnotationAllowOverrides+`: "true"`, "the message says how to opt in")
				}
				return
			}
			for _, a := range tc.args {
				assert.Contains(t, d.Pod.Spec.Containers[0].Args, a)
			}
		})
	}
}
