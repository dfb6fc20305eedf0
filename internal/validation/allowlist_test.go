package validation

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
)

// refusal is one expected rejection: its field path and a part of its
// message.
type refusal struct{ field, says string }

// TestEngineOverridesAllowList: engineOverrides.args and .env admit only the
// allow-list; anything else is refused with its field path and a message
// saying how to opt in per pod; optIn admits it, but never a name the
// operator never injects nor a flag the injection owns.
func TestEngineOverridesAllowList(t *testing.T) {
	optIn := `move it to spec.integration.engineOverrides.optIn.`
	annotation := inject.AnnotationAllowOverrides + `: "true"`
	env := func(kv ...string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := 0; i < len(kv); i += 2 {
			out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		t    v1alpha1.BackendType
		o    v1alpha1.EngineOverrides
		want []refusal
	}{
		{"the PYTHONWARNINGS and BROWSER attack", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Env: env("PYTHONWARNINGS", "ignore::antigravity.x", "BROWSER", "sh -c 'id' %s")},
			[]refusal{{"spec.integration.engineOverrides.env[0].name", optIn + "env"}, {"spec.integration.engineOverrides.env[1].name", annotation}}},
		{"remote code and a tokenizer of the attacker's", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Args: []string{"--trust-remote-code", "--tokenizer", "attacker/tok"}},
			[]refusal{{"spec.integration.engineOverrides.args[0]", "--trust-remote-code is not on the allow-list"}, {"spec.integration.engineOverrides.args[1]", optIn + "args"}}},
		{"flags that load code or read files", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Args: []string{"--hf-overrides", "{}", "--worker-extension-cls", "x.Y", "--tool-parser-plugin", "/p.py", "--chat-template", "/etc/passwd"}},
			[]refusal{{"spec.integration.engineOverrides.args[0]", "--hf-overrides"}, {"spec.integration.engineOverrides.args[2]", "--worker-extension-cls"},
				{"spec.integration.engineOverrides.args[4]", "--tool-parser-plugin"}, {"spec.integration.engineOverrides.args[6]", "--chat-template"}}},
		{"names that load code or name servers", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Env: env("LMCACHE_CONFIG_FILE", "/x", "LMCACHE_CONTROLLER_URL", "x:1", "LMCACHE_LOOKUP_URL", "x:1", "PYTHONHASHSEED", "0",
				"HOME", "/tmp", "VLLM_LOGGING_CONFIG_PATH", "/x.json", "GIT_SSH_COMMAND", "id")},
			[]refusal{{"spec.integration.engineOverrides.env[0].name", "LMCACHE_CONFIG_FILE"}, {"spec.integration.engineOverrides.env[1].name", "LMCACHE_CONTROLLER_URL"},
				{"spec.integration.engineOverrides.env[2].name", "LMCACHE_LOOKUP_URL"}, {"spec.integration.engineOverrides.env[3].name", "PYTHONHASHSEED"},
				{"spec.integration.engineOverrides.env[4].name", "HOME"}, {"spec.integration.engineOverrides.env[5].name", "VLLM_LOGGING_CONFIG_PATH"},
				{"spec.integration.engineOverrides.env[6].name", "GIT_SSH_COMMAND"}}},
		{"a listed name from a ConfigMap", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "LMCACHE_CHUNK_SIZE", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "other-app"}, Key: "k"}}}}},
			[]refusal{{"spec.integration.engineOverrides.env[0].name", "ConfigMap"}}},
		{"listed flags and names", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{
				Args: []string{"--max-model-len", "4096", "--enable-prefix-caching", "--served-model-name", "a", "b", "--gpu-memory-utilization=0.8", "--seed", "-1"},
				Env:  append(env("VLLM_LOGGING_LEVEL", "DEBUG", "LMCACHE_CHUNK_SIZE", "512"), corev1.EnvVar{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "t"}}})},
			nil},
		{"a flag without its value", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Args: []string{"--max-model-len", "--enforce-eager", "--max-num-seqs"}},
			[]refusal{{"spec.integration.engineOverrides.args[0]", "needs a value"}, {"spec.integration.engineOverrides.args[2]", "needs a value"}}},
		{"a switch with a value, a positional, an abbreviation", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Args: []string{"--enforce-eager=true", "serve", "--max-model", "4096"}},
			[]refusal{{"spec.integration.engineOverrides.args[0]", "takes no value"}, {"spec.integration.engineOverrides.args[1]", "is not a flag"},
				{"spec.integration.engineOverrides.args[2]", "spelled in full"}}},
		{"another engine's names", v1alpha1.BackendTypeSGLangHiCache,
			v1alpha1.EngineOverrides{Args: []string{"--max-model-len", "1"}, Env: env("VLLM_LOGGING_LEVEL", "DEBUG", "LMCACHE_CHUNK_SIZE", "256", "SGLANG_LOG_GC", "1")},
			[]refusal{{"spec.integration.engineOverrides.args[0]", "for SGLang"}, {"spec.integration.engineOverrides.env[0].name", "VLLM_LOGGING_LEVEL"},
				{"spec.integration.engineOverrides.env[1].name", "LMCACHE_CHUNK_SIZE"}}},
		{"optIn admits what the allow-list does not", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Args: []string{"--trust-remote-code", "--chat-template", "/t.jinja"}, Env: env("PYTHONWARNINGS", "default")}},
			nil},
		{"optIn never admits a denied name, an owned flag or a name set twice", v1alpha1.BackendTypeLMCache,
			v1alpha1.EngineOverrides{Env: env("LMCACHE_CHUNK_SIZE", "256"), OptIn: &v1alpha1.OptInOverrides{
				Args: []string{"--kv-transfer-config={}"}, Env: env("LD_PRELOAD", "/x.so", "LMCACHE_REMOTE_URL", "lm://evil:1", "LMCACHE_CHUNK_SIZE", "1")}},
			[]refusal{{"spec.integration.engineOverrides.optIn.args[0]", "set by the injection"}, {"spec.integration.engineOverrides.optIn.env[0].name", "LD_*"},
				{"spec.integration.engineOverrides.optIn.env[1].name", "derived from the backend's spec"}, {"spec.integration.engineOverrides.optIn.env[2].name", "Duplicate"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			cb := overrides(tc.t, nil)
			cb.Spec.Integration.EngineOverrides = &o
			var got []refusal
			for _, e := range Validate(cb) {
				got = append(got, refusal{e.Field, e.Error()})
			}
			assert.Len(t, got, len(tc.want), "%v", got)
			for i := range min(len(got), len(tc.want)) {
				assert.Equal(t, tc.want[i].field, got[i].field)
				assert.Contains(t, got[i].says, tc.want[i].says)
			}
		})
	}
}
