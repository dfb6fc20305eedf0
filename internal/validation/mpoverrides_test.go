package validation

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestMPEngineOverrides: in multiprocess mode engineOverrides still may not
// set --kv-transfer-config (the webhook's MP connector), and its env may
// not set the MP wiring's PYTHONHASHSEED or LMCACHE_TRACK_USAGE (neither is
// on the allow-list; optIn.env, with the pod's consent, may).
func TestMPEngineOverrides(t *testing.T) {
	cb := overrides(v1alpha1.BackendTypeLMCache, []string{"--kv-transfer-config", "{}"},
		corev1.EnvVar{Name: "PYTHONHASHSEED", Value: "1"}, corev1.EnvVar{Name: "LMCACHE_TRACK_USAGE", Value: "true"})
	cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("8Gi")}}
	got := map[string]bool{}
	for _, e := range Validate(cb) {
		got[e.Field] = true
	}
	for _, f := range []string{"spec.integration.engineOverrides.args[0]", "spec.integration.engineOverrides.env[0].name", "spec.integration.engineOverrides.env[1].name"} {
		assert.True(t, got[f], "%s refused; got %v", f, got)
	}
}
