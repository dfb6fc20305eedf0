package validation

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestMPServerMemoryLimit: in multiprocess mode a memory limit of the
// server below its L1 plus the measured headroom (the server holds L1 from
// its start) is refused with its field path, as a backend moving from the
// in-process server with its old resources would have it; at or above it,
// or no limit, is admitted; in-process the rule does not apply.
func TestMPServerMemoryLimit(t *testing.T) {
	const path = "spec.remoteStorage.lmCacheServer.resources.limits.memory"
	for _, tc := range []struct {
		name    string
		mp      bool
		res     *corev1.ResourceRequirements
		refused bool
	}{
		{"an 8Gi limit beside a 20Gi L1", true, limits("8Gi"), true},
		{"just below L1 + 1Gi", true, limits("21503Mi"), true},
		{"L1 + 1Gi", true, limits("21Gi"), false},
		{"no limit, a request only", true, &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}}, false},
		{"no resources: derived from L1", true, nil, false},
		{"in-process", false, limits("8Gi"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
				RemoteStorage:  &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Resources: tc.res}}}}
			if tc.mp {
				cb.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("20Gi")}}
			}
			var found bool
			for _, e := range Validate(cb) {
				if e.Field == path {
					found = true
					assert.Contains(t, e.Detail, "at least 21Gi")
				}
			}
			assert.Equal(t, tc.refused, found, "%v", Validate(cb))
		})
	}
}

func limits(memory string) *corev1.ResourceRequirements {
	return &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}}
}
