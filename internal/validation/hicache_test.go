package validation

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/operator/api/v1alpha1"
)

func hiCacheBackend(h *v1alpha1.HiCache, args ...string) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend"},
		ObjectMeta: metav1.ObjectMeta{Name: "hicache", Namespace: "llm"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeSGLang, Type: v1alpha1.BackendTypeSGLangHiCache, HiCache: h,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
		},
	}
	if args != nil {
		// Most of these flags are outside the allow-list: they reach only
		// the pods that opt in.
		cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Args: args}}
	}
	return cb
}

// TestHiCacheWarnings: each combination SGLang 0.5.23 rewrites gets one
// warning per rewritten field, naming the field and what SGLang runs.
func TestHiCacheWarnings(t *testing.T) {
	cases := []struct {
		name string
		h    *v1alpha1.HiCache
		args []string
		// want are the warnings' field paths and values SGLang runs, in order.
		want [][2]string
	}{
		{"no hiCache", nil, nil, nil},
		{"SGLang's defaults", &v1alpha1.HiCache{}, nil, nil},
		{"the example's settings", &v1alpha1.HiCache{Ratio: ptr.To("2"), WritePolicy: "write_through", IOBackend: "kernel", MemLayout: "page_first", PageSize: ptr.To[int32](64)}, nil, nil},
		{"page_first_direct with the kernel backend", &v1alpha1.HiCache{MemLayout: "page_first_direct", IOBackend: "kernel"}, nil,
			[][2]string{{"spec.hiCache.ioBackend", "direct"}}},
		{"page_first_direct with the default backend", &v1alpha1.HiCache{MemLayout: "page_first_direct"}, nil,
			[][2]string{{"spec.hiCache.ioBackend", "direct"}}},
		{"page_first_direct with direct", &v1alpha1.HiCache{MemLayout: "page_first_direct", IOBackend: "direct"}, nil, nil},
		{"direct with page_first", &v1alpha1.HiCache{MemLayout: "page_first", IOBackend: "direct"}, nil,
			[][2]string{{"spec.hiCache.memLayout", "page_first_direct"}}},
		{"direct with the default layout", &v1alpha1.HiCache{IOBackend: "direct"}, nil,
			[][2]string{{"spec.hiCache.memLayout", "page_first_direct"}}},
		{"direct with layer_first", &v1alpha1.HiCache{MemLayout: "layer_first", IOBackend: "direct"}, nil, nil},
		{"mooncake with layer_first", &v1alpha1.HiCache{StorageBackend: "mooncake", MemLayout: "layer_first"}, nil,
			[][2]string{{"spec.hiCache.memLayout", "page_first"}}},
		{"mooncake with layer_first, direct", &v1alpha1.HiCache{StorageBackend: "mooncake", MemLayout: "layer_first", IOBackend: "direct"}, nil,
			[][2]string{{"spec.hiCache.memLayout", "page_first_direct"}}},
		{"mooncake with page_first, direct", &v1alpha1.HiCache{StorageBackend: "mooncake", IOBackend: "direct"}, nil,
			[][2]string{{"spec.hiCache.memLayout", "page_first_direct"}}},
		{"file with layer_first", &v1alpha1.HiCache{StorageBackend: "file", MemLayout: "layer_first"}, nil, nil},
		{"buffer_only with write_back", &v1alpha1.HiCache{StorageBackend: "file", WritePolicy: "write_back"}, []string{"--hicache-host-memory-mode", "buffer_only"},
			[][2]string{{"spec.hiCache.writePolicy", "write_through"}}},
		{"buffer_only with write_back, mooncake layer_first", &v1alpha1.HiCache{StorageBackend: "mooncake", WritePolicy: "write_back", MemLayout: "layer_first"},
			[]string{"--hicache-host-memory-mode=buffer_only"},
			[][2]string{{"spec.hiCache.writePolicy", "write_through"}, {"spec.hiCache.memLayout", "page_first"}}},
		{"cache mode keeps write_back", &v1alpha1.HiCache{WritePolicy: "write_back"}, []string{"--hicache-host-memory-mode", "cache"}, nil},
		{"refused backends get no warning", &v1alpha1.HiCache{IOBackend: "direct"}, []string{"--disable-radix-cache"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := HiCacheWarnings(hiCacheBackend(tc.h, tc.args...))
			require.Len(t, got, len(tc.want), "%q", got)
			for i, w := range tc.want {
				assert.True(t, strings.HasPrefix(got[i], w[0]+": SGLang runs "), "%q", got[i])
				assert.Contains(t, got[i], " "+w[1]+", not ")
				assert.Contains(t, got[i], "set "+w[0]+": "+w[1])
			}
		})
	}
	// The dynamic storage backend fails at start without its class.
	w := HiCacheWarnings(hiCacheBackend(&v1alpha1.HiCache{StorageBackend: "dynamic"}))
	require.Len(t, w, 1)
	assert.True(t, strings.HasPrefix(w[0], "spec.hiCache.storageBackend: dynamic "), w[0])
	assert.Contains(t, w[0], "Unknown storage backend 'dynamic'")
	assert.Empty(t, HiCacheWarnings(hiCacheBackend(&v1alpha1.HiCache{StorageBackend: "dynamic"},
		"--hicache-storage-backend-extra-config={\"backend_name\":\"b\",\"module_path\":\"m\",\"class_name\":\"C\"}")))
	// A field left unset is named as SGLang's default.
	w = HiCacheWarnings(hiCacheBackend(&v1alpha1.HiCache{IOBackend: "direct"}))
	require.Len(t, w, 1)
	assert.Contains(t, w[0], "not page_first (SGLang's default, the field being unset)")
	// Only SGLangHiCache backends.
	lm := hiCacheBackend(&v1alpha1.HiCache{IOBackend: "direct"})
	lm.Spec.Type, lm.Spec.Runtime = v1alpha1.BackendTypeLMCache, v1alpha1.RuntimeVLLM
	assert.Empty(t, HiCacheWarnings(lm))
}

// TestHiCacheRefusals: a combination SGLang refuses to start with is
// refused with the field path.
func TestHiCacheRefusals(t *testing.T) {
	cases := []struct {
		name   string
		h      *v1alpha1.HiCache
		args   []string
		fields []string
		detail string
	}{
		{"disable-radix-cache", &v1alpha1.HiCache{}, []string{"--schedule-policy", "lpm", "--disable-radix-cache"},
			[]string{"spec.integration.engineOverrides.optIn.args[2]"}, "mutually exclusive"},
		{"abbreviated, underscores", nil, []string{"--disable_radix"}, []string{"spec.integration.engineOverrides.optIn.args[0]"}, "--disable-radix-cache"},
		{"enable-lmcache", nil, []string{"--enable-lmcache"}, []string{"spec.integration.engineOverrides.optIn.args[0]"}, "mutually exclusive"},
		{"external linker", nil, []string{"--enable-unified-cache-external-linker"}, []string{"spec.integration.engineOverrides.optIn.args[0]"}, "mutually exclusive"},
		{"buffer_only without storage", &v1alpha1.HiCache{}, []string{"--hicache-host-memory-mode", "buffer_only"},
			[]string{"spec.integration.engineOverrides.optIn.args[0]"}, "spec.hiCache.storageBackend"},
		{"buffer_only without hiCache", nil, []string{"--hicache-host-memory-mode=buffer_only"},
			[]string{"spec.integration.engineOverrides.optIn.args[0]"}, "spec.hiCache.storageBackend"},
		{"unknown host memory mode", &v1alpha1.HiCache{StorageBackend: "file"}, []string{"--hicache-host-memory-mode", "buffer"},
			[]string{"spec.integration.engineOverrides.optIn.args[0]"}, "supported values"},
		{"buffer_only with storage", &v1alpha1.HiCache{StorageBackend: "file"}, []string{"--hicache-host-memory-mode", "buffer_only"}, nil, ""},
		{"the last host memory mode counts", &v1alpha1.HiCache{}, []string{"--hicache-host-memory-mode", "buffer_only", "--hicache-host-memory-mode", "cache"}, nil, ""},
		{"other flags", &v1alpha1.HiCache{}, []string{"--hicache-storage-backend-extra-config", "{}", "--radix-eviction-policy", "lru"}, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := Validate(hiCacheBackend(tc.h, tc.args...))
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
				assert.Contains(t, e.Error(), tc.detail)
			}
			assert.Equal(t, tc.fields, got)
		})
	}
	// The same flags are an LMCache engine's own business.
	lm := hiCacheBackend(nil, "--disable-radix-cache")
	lm.Spec.Type, lm.Spec.Runtime = v1alpha1.BackendTypeLMCache, v1alpha1.RuntimeVLLM
	assert.Empty(t, Validate(lm))
}

// TestHandlerReturnsHiCacheWarnings: the validating webhook admits a
// combination SGLang rewrites with the warnings in its response, and
// refuses one SGLang refuses with the field path.
func TestHandlerReturnsHiCacheWarnings(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	h := &Handler{Decoder: admission.NewDecoder(scheme)}
	review := func(op admissionv1.Operation, cb *v1alpha1.CacheBackend) admission.Request {
		raw, err := json.Marshal(cb)
		require.NoError(t, err)
		req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: op, Object: runtime.RawExtension{Raw: raw}}}
		if op == admissionv1.Update {
			req.OldObject = runtime.RawExtension{Raw: raw}
		}
		return req
	}
	for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
		resp := h.Handle(context.Background(), review(op, hiCacheBackend(&v1alpha1.HiCache{MemLayout: "page_first_direct", IOBackend: "kernel"})))
		assert.True(t, resp.Allowed, "%s", op)
		require.Len(t, resp.Warnings, 1, "%s", op)
		assert.True(t, strings.HasPrefix(resp.Warnings[0], "spec.hiCache.ioBackend: SGLang runs --hicache-io-backend direct, not kernel"), resp.Warnings[0])

		resp = h.Handle(context.Background(), review(op, hiCacheBackend(&v1alpha1.HiCache{MemLayout: "page_first", IOBackend: "kernel"})))
		assert.True(t, resp.Allowed)
		assert.Empty(t, resp.Warnings, "a combination SGLang runs as given")

		resp = h.Handle(context.Background(), review(op, hiCacheBackend(&v1alpha1.HiCache{}, "--disable-radix-cache")))
		assert.False(t, resp.Allowed)
		require.NotNil(t, resp.Result)
		assert.Contains(t, resp.Result.Message, "spec.integration.engineOverrides.optIn.args[0]")
		assert.Contains(t, resp.Result.Message, "mutually exclusive")
	}
}
