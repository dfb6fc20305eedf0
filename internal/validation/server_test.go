package validation

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func lmcacheBackend(extra []string, pvc bool) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend"},
		ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: "llm"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			RemoteStorage: &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{ExtraArgs: extra}},
		},
	}
	if pvc {
		cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	}
	return cb
}

// TestExtraArgsRefused: lmcache_server exits on any argument beyond
// <host> <port> [device], so a non-empty extraArgs is refused with its
// field path and the reason; an update may keep the ones stored before the
// rule (they are never rendered), not add or change them.
func TestExtraArgsRefused(t *testing.T) {
	paths := func(cb *v1alpha1.CacheBackend, old *v1alpha1.CacheBackend) []string {
		var got []string
		errs := Validate(cb)
		if old != nil {
			errs = ValidateUpdate(old, cb)
		}
		for _, e := range errs {
			got = append(got, e.Field)
			assert.Equal(t, ExtraArgsRefused, e.Detail)
		}
		return got
	}
	const path = "spec.remoteStorage.lmCacheServer.extraArgs"
	assert.Equal(t, []string{path}, paths(lmcacheBackend([]string{"--verbose"}, false), nil))
	assert.Empty(t, paths(lmcacheBackend(nil, false), nil))
	assert.Empty(t, paths(lmcacheBackend([]string{}, false), nil))
	assert.Equal(t, []string{path}, paths(lmcacheBackend([]string{"--verbose"}, false), lmcacheBackend(nil, false)), "added on an update")
	assert.Equal(t, []string{path}, paths(lmcacheBackend([]string{"-v"}, false), lmcacheBackend([]string{"--verbose"}, false)), "changed on an update")
	assert.Empty(t, paths(lmcacheBackend([]string{"--verbose"}, false), lmcacheBackend([]string{"--verbose"}, false)), "kept as stored")
	assert.Empty(t, paths(lmcacheBackend(nil, false), lmcacheBackend([]string{"--verbose"}, false)), "removed")
}

// TestServerWarnings: storage.pvc is admitted with a warning that the
// server keeps KV in memory only; more than one replica with a warning
// that replicas share nothing; extraArgs kept from before the rule with a
// warning that they are ignored.
func TestServerWarnings(t *testing.T) {
	assert.Empty(t, Warnings(nil, lmcacheBackend(nil, false)))
	one := lmcacheBackend(nil, false)
	one.Spec.RemoteStorage.LMCacheServer.Replicas = ptr.To[int32](1)
	assert.Empty(t, Warnings(nil, one))
	three := lmcacheBackend(nil, false)
	three.Spec.RemoteStorage.LMCacheServer.Replicas = ptr.To[int32](3)
	assert.Equal(t, []string{ReplicasPartition}, Warnings(nil, three))
	hpa := lmcacheBackend(nil, false)
	hpa.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 2}
	assert.Equal(t, []string{ReplicasPartition}, Warnings(nil, hpa))
	hpa.Spec.Autoscaling.MaxReplicas = 1
	assert.Empty(t, Warnings(nil, hpa))
	assert.Equal(t, []string{StorageInMemoryOnly}, Warnings(nil, lmcacheBackend(nil, true)))
	kept := lmcacheBackend([]string{"--verbose"}, false)
	assert.Equal(t, []string{ExtraArgsIgnored}, Warnings(kept.DeepCopy(), kept))
	assert.Empty(t, Warnings(lmcacheBackend(nil, false), kept), "a refused change has no warning")
}

func review(t *testing.T, op admissionv1.Operation, cb, old *v1alpha1.CacheBackend) admission.Response {
	t.Helper()
	raw, err := json.Marshal(cb)
	require.NoError(t, err)
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Object: runtime.RawExtension{Raw: raw}}}
	if old != nil {
		rawOld, err := json.Marshal(old)
		require.NoError(t, err)
		req.OldObject = runtime.RawExtension{Raw: rawOld}
	}
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	return (&Handler{Decoder: admission.NewDecoder(scheme)}).Handle(context.Background(), req)
}

// TestHandlerServerRules: the webhook's answer carries the refusal with
// the field path, and the warnings on an admitted backend.
func TestHandlerServerRules(t *testing.T) {
	resp := review(t, admissionv1.Create, lmcacheBackend([]string{"--verbose"}, false), nil)
	assert.False(t, resp.Allowed)
	require.NotNil(t, resp.Result)
	assert.Contains(t, resp.Result.Message, "spec.remoteStorage.lmCacheServer.extraArgs: Forbidden: lmcache_server")

	resp = review(t, admissionv1.Create, lmcacheBackend(nil, true), nil)
	assert.True(t, resp.Allowed)
	assert.Equal(t, []string{StorageInMemoryOnly}, resp.Warnings)

	kept := lmcacheBackend([]string{"--verbose"}, true)
	resp = review(t, admissionv1.Update, kept, kept.DeepCopy())
	assert.True(t, resp.Allowed)
	assert.Equal(t, []string{StorageInMemoryOnly, ExtraArgsIgnored}, resp.Warnings)
}

// TestInProcessServerNeedsLMCacheWithLMCacheServer: LMCache 0.5.7 removed
// lmcache_server, so the in-process shape with an image of that release
// (read from an lmcache/* tag, else spec.integration.versions.lmcache) is
// refused at the image's path; multiprocess mode takes it, the default
// (0.5.6) and an image whose release is unknown are admitted, and an
// update that keeps what was stored is let through.
func TestInProcessServerNeedsLMCacheWithLMCacheServer(t *testing.T) {
	withImage := func(image, declared string, mp bool) *v1alpha1.CacheBackend {
		cb := lmcacheBackend(nil, false)
		cb.Spec.RemoteStorage.LMCacheServer.Image = image
		if declared != "" {
			cb.Spec.Integration.Versions = &v1alpha1.EngineVersions{LMCache: declared}
		}
		if mp {
			cb.Spec.Multiprocess = &v1alpha1.Multiprocess{Port: 5555, HTTPPort: 8080, L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("4Gi")}}
		}
		return cb
	}
	const path = "spec.remoteStorage.lmCacheServer.image"
	for _, tc := range []struct {
		name     string
		cb       *v1alpha1.CacheBackend
		old      *v1alpha1.CacheBackend
		refused  bool
		readFrom string
	}{
		{name: "the default image (0.5.6)", cb: withImage("", "", false)},
		{name: "0.5.6", cb: withImage("lmcache/vllm-openai:v0.5.6", "", false)},
		{name: "0.5.7rc2", cb: withImage("lmcache/vllm-openai:v0.5.7rc2", "", false), refused: true, readFrom: "image tag"},
		{name: "0.5.7", cb: withImage("docker.io/lmcache/vllm-openai:v0.5.7", "", false), refused: true, readFrom: "image tag"},
		{name: "0.6.0 by digest and tag", cb: withImage("lmcache/vllm-openai:v0.6.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", false), refused: true, readFrom: "image tag"},
		{name: "declared", cb: withImage("registry.example.com/lmcache:prod", "0.5.7", false), refused: true, readFrom: "spec.integration.versions.lmcache"},
		{name: "the tag before the declaration", cb: withImage("lmcache/vllm-openai:v0.5.6", "0.5.7", false)},
		{name: "unknown release", cb: withImage("registry.example.com/lmcache:prod", "", false)},
		{name: "multiprocess on 0.5.7", cb: withImage("lmcache/vllm-openai:v0.5.7rc2", "", true)},
		{name: "changed to 0.5.7 on an update", cb: withImage("lmcache/vllm-openai:v0.5.7rc2", "", false), old: withImage("", "", false), refused: true, readFrom: "image tag"},
		{name: "multiprocess dropped on an update", cb: withImage("lmcache/vllm-openai:v0.5.7rc2", "", false), old: withImage("lmcache/vllm-openai:v0.5.7rc2", "", true), refused: true, readFrom: "image tag"},
		{name: "kept as stored", cb: withImage("lmcache/vllm-openai:v0.5.7rc2", "", false), old: withImage("lmcache/vllm-openai:v0.5.7rc2", "", false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := Validate(tc.cb)
			if tc.old != nil {
				errs = ValidateUpdate(tc.old, tc.cb)
			}
			if !tc.refused {
				assert.Empty(t, errs)
				return
			}
			require.Len(t, errs, 1)
			assert.Equal(t, path, errs[0].Field)
			assert.Contains(t, errs[0].Detail, "has no lmcache_server")
			assert.Contains(t, errs[0].Detail, "(read from the "+tc.readFrom+")")
			assert.Contains(t, errs[0].Detail, "spec.multiprocess")
		})
	}
}
