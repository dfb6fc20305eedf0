package validation

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func overrides(t v1alpha1.BackendType, args []string, env ...corev1.EnvVar) *v1alpha1.CacheBackend {
	rt := v1alpha1.RuntimeVLLM
	if t == v1alpha1.BackendTypeSGLangHiCache {
		rt = v1alpha1.RuntimeSGLang
	}
	return &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: "llm"},
		Spec: v1alpha1.CacheBackendSpec{Type: t, Runtime: rt, Integration: v1alpha1.Integration{
			EngineOverrides: &v1alpha1.EngineOverrides{Args: args, Env: env}}},
	}
}

// TestOwnedFlagsInEverySpelling: an override may not set a flag the
// injection owns under a spelling the engine reads as that flag.
func TestOwnedFlagsInEverySpelling(t *testing.T) {
	for _, tc := range []struct {
		t    v1alpha1.BackendType
		arg  string
		deny bool
	}{
		{v1alpha1.BackendTypeLMCache, "--kv-transfer-config", true},
		{v1alpha1.BackendTypeLMCache, "--kv_transfer_config", true},
		{v1alpha1.BackendTypeLMCache, `--kv-transfer-config={"kv_role":"kv_consumer"}`, true},
		{v1alpha1.BackendTypeLMCache, "--kv-transfer-config.kv_role=kv_consumer", true},
		{v1alpha1.BackendTypeLMCache, "--kv_events_config.publisher=null", true},
		{v1alpha1.BackendTypeLMCache, "--max-model-len=4096", false},
		{v1alpha1.BackendTypeSGLangHiCache, "--hicache-rat=4", true},
		{v1alpha1.BackendTypeSGLangHiCache, "--enable-hier", true},
		{v1alpha1.BackendTypeSGLangHiCache, "--page_size=64", true},
		{v1alpha1.BackendTypeSGLangHiCache, "--mem-fraction-static=0.8", false},
	} {
		errs := Validate(overrides(tc.t, []string{tc.arg}))
		if !tc.deny {
			assert.Empty(t, errs, tc.arg)
			continue
		}
		require.Len(t, errs, 1, tc.arg)
		assert.Equal(t, "spec.integration.engineOverrides.args[0]", errs[0].Field, tc.arg)
	}
}

func TestDeniedOverrideEnv(t *testing.T) {
	for _, name := range []string{"LD_PRELOAD", "LD_AUDIT", "BASH_ENV", "NODE_OPTIONS", "PYTHONPATH", "JAVA_TOOL_OPTIONS"} {
		errs := Validate(overrides(v1alpha1.BackendTypeLMCache, nil, corev1.EnvVar{Name: "VLLM_LOGGING_LEVEL", Value: "INFO"}, corev1.EnvVar{Name: name, Value: "/tmp/x.so"}))
		require.Len(t, errs, 1, name)
		assert.Equal(t, "spec.integration.engineOverrides.env[1].name", errs[0].Field, "the rejection names the field")
	}
	assert.Empty(t, Validate(overrides(v1alpha1.BackendTypeLMCache, nil, corev1.EnvVar{Name: "VLLM_LOGGING_LEVEL", Value: "DEBUG"})))
}

// FuzzValidate: any CacheBackend the schema could admit never panics the
// validating webhook's rules, and every rejection names a field under
// spec or metadata; in a CacheBackend it admits, no value that reaches a
// container's args or env expands a variable (the kubelet's own
// expansion, test/testutil/expansion).
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"metadata":{"name":"c"},"spec":{"type":"LMCache","integration":{"engineOverrides":{"args":["--kv_transfer_config"],"env":[{"name":"LD_PRELOAD"}]}}}}`,
		`{"metadata":{"name":"c"},"spec":{"type":"SGLangHiCache","runtime":"SGLang","deploymentKind":"StatefulSet","storage":{"pvc":{"size":"1Gi"}},"autoscaling":{"maxReplicas":100}}}`,
		`{"spec":{"engineSelector":{"matchLabels":{"a/b/c":"-"}},"integration":{"engineContainer":"A_B"}}}`,
		`{"metadata":{"name":"c"},"spec":{"type":"LMCache","integration":{"engineOverrides":{"args":["--served-model-name","$$$(HF_TOKEN)"],"env":[{"name":"VLLM_LOGGING_PREFIX","value":"$$(HF_TOKEN)"}]}},"observation":{"modelID":"m-$(X)"}}}`,
	} {
		f.Add([]byte(s), []byte(`{"metadata":{"name":"c"},"spec":{"type":"LMCache","storage":{"pvc":{"size":"2Gi"}}}}`))
	}
	f.Fuzz(func(t *testing.T, raw, oldRaw []byte) {
		cb, old := &v1alpha1.CacheBackend{}, &v1alpha1.CacheBackend{}
		if json.Unmarshal(raw, cb) != nil || json.Unmarshal(oldRaw, old) != nil {
			return
		}
		for _, errs := range []field.ErrorList{Validate(cb), ValidateUpdate(old, cb)} {
			for _, e := range errs {
				if !strings.HasPrefix(e.Field, "spec.") && !strings.HasPrefix(e.Field, "metadata.") {
					t.Fatalf("rejection without a field path: %q", e.Field)
				}
			}
		}
		if len(Validate(cb)) > 0 {
			return
		}
		for _, v := range containerValues(cb) {
			if !expandsNothing(v) {
				t.Fatalf("admitted %q, which the kubelet expands", v)
			}
		}
	})
}

// containerValues are the values of cb that the operator puts into a
// container's args or env values.
func containerValues(cb *v1alpha1.CacheBackend) []string {
	var out []string
	if o := cb.Spec.Integration.EngineOverrides; o != nil {
		out = append(append(out, o.Args...), envValues(o.Env)...)
		if o.OptIn != nil {
			out = append(append(out, o.OptIn.Args...), envValues(o.OptIn.Env)...)
		}
	}
	if lc := cb.Spec.LMCache; lc != nil && lc.LocalDisk != nil {
		out = append(out, lc.LocalDisk.Path)
	}
	if o := cb.Spec.Observation; o != nil {
		out = append(out, o.ModelID)
	}
	if mp := cb.Spec.Multiprocess; mp != nil && mp.L2 != nil && mp.L2.Disk != nil {
		out = append(out, mp.L2.Disk.Path)
	}
	return out
}
