package validation

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func TestValidate(t *testing.T) {
	base := func() *v1alpha1.CacheBackend {
		return &v1alpha1.CacheBackend{
			ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: "llm"},
			Spec: v1alpha1.CacheBackendSpec{
				Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "qwen"}},
			},
		}
	}
	cases := []struct {
		name   string
		mutate func(*v1alpha1.CacheBackend)
		fields []string
	}{
		{"valid", func(*v1alpha1.CacheBackend) {}, nil},
		{"selector key", func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels = map[string]string{"-bad": "x"} },
			[]string{"spec.engineSelector.matchLabels[-bad]"}},
		{"selector value too long", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": strings.Repeat("a", 64)}
		}, []string{"spec.engineSelector.matchLabels[app]"}},
		{"owned vLLM flag as --flag=value", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--max-model-len", "4096", "--kv-events-config={}"}}
		}, []string{"spec.integration.engineOverrides.args[2]"}},
		{"owned HiCache flag", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--hicache-ratio", "2"}}
		}, []string{"spec.integration.engineOverrides.args[0]"}},
		{"HiCache flags are free for LMCache engines", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Args: []string{"--hicache-ratio", "2"}}}
		}, nil},
		{"endpoint override and bad env name", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "LMCACHE_REMOTE_URL"}, {Name: "A B"}}}
		}, []string{"spec.integration.engineOverrides.env[0].name", "spec.integration.engineOverrides.env[1].name"}},
		{"engine container", func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.EngineContainer = "Engine" },
			[]string{"spec.integration.engineContainer"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := base()
			tc.mutate(cb)
			var got []string
			for _, e := range Validate(cb) {
				got = append(got, e.Field)
			}
			assert.ElementsMatch(t, tc.fields, got)
		})
	}
}
