package validation

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
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

// TestMPSizesAreBounded: issue 35. Every size of spec.multiprocess above
// 1Pi is refused with its field path (4Ei was admitted and rendered
// --l1-size-gb 0: the GiB count overflowed int32), and the largest
// admitted size renders exactly: the server's arguments, its L2 adapters'
// capacities and its memory.
func TestMPSizesAreBounded(t *testing.T) {
	backend := func(l1, resp, disk, shm string) *v1alpha1.CacheBackend {
		return &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
			Multiprocess: &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse(l1)},
				EngineSharedMemory: ptr.To(resource.MustParse(shm)),
				L2: &v1alpha1.MultiprocessL2{RESP: &v1alpha1.MultiprocessRESP{Host: "redis", Capacity: resource.MustParse(resp)},
					Disk: &v1alpha1.MultiprocessDisk{Capacity: resource.MustParse(disk)}}}}}
	}
	paths := func(cb *v1alpha1.CacheBackend) []string {
		var out []string
		for _, e := range Validate(cb) {
			out = append(out, e.Field)
			assert.Contains(t, e.Detail, "must be at most 1Pi", e.Field)
		}
		return out
	}
	for _, big := range []string{"4Ei", "1025Ti", "8Ei"} {
		assert.Equal(t, []string{"spec.multiprocess.l1.size", "spec.multiprocess.engineSharedMemory",
			"spec.multiprocess.l2.resp.capacity", "spec.multiprocess.l2.disk.capacity"}, paths(backend(big, big, big, big)), big)
	}

	largest := backend("1Pi", "1Pi", "1Pi", "1Pi")
	require.Empty(t, Validate(largest))
	s := render.MPServerFor(largest)
	args := render.MPServerArgs(s)
	at := slices.Index(args, "--l1-size-gb")
	require.GreaterOrEqual(t, at, 0)
	assert.Equal(t, "1048576", args[at+1])
	assert.Contains(t, strings.Join(args, " "), `"max_capacity_gb":1048576,"port":6379,"type":"resp"`)
	assert.Contains(t, strings.Join(args, " "), `"max_capacity_gb":1048576,"type":"fs_native"`)
	res := render.MPResources(s)
	assert.Equal(t, "1048581Gi", ptr.To((*res.Requests)[corev1.ResourceMemory]).String(), "L1 + 5Gi")
	assert.Equal(t, "1572872Gi", ptr.To((*res.Limits)[corev1.ResourceMemory]).String(), "1.5 × (L1 + 5Gi), rounded up")
}
