package conformance_test

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// lmcacheIntent is what LMCache's config must hold for a CacheBackend.
type lmcacheIntent struct {
	url, serde string
	// chunkSize is 0 when the spec leaves LMCache's default.
	chunkSize int
	// cpuBytes, diskBytes are the tiers' sizes in bytes (-1: tier not set).
	cpuBytes, diskBytes int64
	diskPath            string
}

type lmcacheCase struct {
	name    string
	backend v1alpha1.CacheBackend
	opts    inject.Options
	want    lmcacheIntent
}

func intentOf(cb v1alpha1.CacheBackend, domain string) lmcacheIntent {
	if domain == "" {
		domain = "cluster.local"
	}
	port := int32(65432)
	if rs := cb.Spec.RemoteStorage; rs != nil && rs.LMCacheServer != nil && rs.LMCacheServer.Port != 0 {
		port = rs.LMCacheServer.Port
	}
	w := lmcacheIntent{
		url:   fmt.Sprintf("lm://%s.%s.svc.%s:%d", cb.Name, cb.Namespace, domain, port),
		serde: "naive", cpuBytes: -1, diskBytes: -1,
	}
	if lc := cb.Spec.LMCache; lc != nil {
		if lc.Serde != "" {
			w.serde = lc.Serde
		}
		if lc.ChunkSize != nil {
			w.chunkSize = int(*lc.ChunkSize)
		}
		if lc.LocalCPU != nil {
			w.cpuBytes = lc.LocalCPU.MaxSize.Value()
		}
		if lc.LocalDisk != nil {
			w.diskBytes, w.diskPath = lc.LocalDisk.MaxSize.Value(), lc.LocalDisk.Path
		}
	}
	return w
}

func withLMCache(lc v1alpha1.LMCacheConfig) func(*v1alpha1.CacheBackend) {
	return func(cb *v1alpha1.CacheBackend) { cb.Spec.LMCache = &lc }
}

// sizes are quantities a user writes for the tiers.
var sizes = []string{"4Gi", "512Mi", "10G", "1500Mi", "1", "1Ki", "100M", "2.5Gi", "1Ti", "750m", "0.5Gi", "3e9"}

func lmcacheCases() []lmcacheCase {
	var cases []lmcacheCase
	add := func(name string, opts inject.Options, mut ...func(*v1alpha1.CacheBackend)) {
		cb := lmcacheVLLM(mut...)
		cb.Status.Endpoint = topology.Endpoint(&cb, opts.ClusterDomain) // what the operator publishes in that domain
		cases = append(cases, lmcacheCase{name: name, backend: cb, opts: opts, want: intentOf(cb, opts.ClusterDomain)})
	}
	add("no spec.lmCache", inject.Options{})
	add("cluster domain and port", inject.Options{ClusterDomain: "example.org"}, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Port: 7000}}
	})
	for _, serde := range []string{"", "naive", "cachegen"} {
		add("serde "+serde, inject.Options{}, withLMCache(v1alpha1.LMCacheConfig{Serde: serde}))
	}
	for _, n := range []int32{1, 256, 512, 65536} {
		add(fmt.Sprintf("chunkSize %d", n), inject.Options{}, withLMCache(v1alpha1.LMCacheConfig{ChunkSize: ptr.To(n)}))
	}
	for _, s := range sizes {
		add("localCPU "+s, inject.Options{}, withLMCache(v1alpha1.LMCacheConfig{LocalCPU: &v1alpha1.LocalCPUTier{MaxSize: resource.MustParse(s)}}))
		add("localDisk "+s, inject.Options{}, withLMCache(v1alpha1.LMCacheConfig{LocalDisk: &v1alpha1.LocalDiskTier{Path: "/var/cache/lmcache", MaxSize: resource.MustParse(s)}}))
	}
	for _, p := range []string{"/data", "/data/", "/mnt/nvme0/lmcache/", "/data/with space"} {
		add("localDisk path "+p, inject.Options{}, withLMCache(v1alpha1.LMCacheConfig{LocalDisk: &v1alpha1.LocalDiskTier{Path: p, MaxSize: resource.MustParse("20Gi")}}))
	}
	add("every field", inject.Options{ClusterDomain: "corp.internal"}, withLMCache(v1alpha1.LMCacheConfig{
		ChunkSize: ptr.To[int32](128), Serde: "cachegen",
		LocalCPU:  &v1alpha1.LocalCPUTier{MaxSize: resource.MustParse("1500Mi")},
		LocalDisk: &v1alpha1.LocalDiskTier{Path: "/cache", MaxSize: resource.MustParse("10G")},
	}))
	add("every field, KV events on", observeOptions(), observed, withLMCache(v1alpha1.LMCacheConfig{
		ChunkSize: ptr.To[int32](256), LocalCPU: &v1alpha1.LocalCPUTier{MaxSize: resource.MustParse("4Gi")},
	}))
	// An engineOverrides variable replaces the canonical one.
	cb := lmcacheVLLM(withLMCache(v1alpha1.LMCacheConfig{ChunkSize: ptr.To[int32](256)}), func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "LMCACHE_CHUNK_SIZE", Value: "1024"}}}
	})
	want := intentOf(cb, "")
	want.chunkSize = 1024
	cases = append(cases, lmcacheCase{name: "engineOverrides LMCACHE_CHUNK_SIZE", backend: cb, want: want})
	return cases
}

type lmcacheResult struct {
	Name     string         `json:"name"`
	Error    string         `json:"error"`
	Warnings []string       `json:"warnings"`
	Unknown  []string       `json:"unknown"`
	Config   map[string]any `json:"config"`
	// DiskPaths are the directories LMCache's local disk tier uses.
	DiskPaths []string `json:"disk_paths"`
}

// TestLMCacheReadsEveryEnvironment feeds every LMCACHE_* set the webhook
// produces, as the engine process receives it, to LMCache's own config
// loader (LMCacheEngineConfig.from_env, then validate) in one Python
// process: no conversion warning, every name one LMCache defines, every
// value the CacheBackend's intent.
func TestLMCacheReadsEveryEnvironment(t *testing.T) {
	cases := lmcacheCases()
	type in struct {
		Name string            `json:"name"`
		Env  map[string]string `json:"env"`
	}
	var req struct {
		Cases []in `json:"cases"`
	}
	for _, tc := range cases {
		d, c := admit(t, tc.backend, newEnginePod(shapes[0].c()), tc.opts)
		require.Equal(t, inject.Injected, d.Outcome, "%s: %s", tc.name, d.Message)
		p := startContainer(t, c, vllmEntrypoint, vllmStubs...)
		env := map[string]string{}
		for k, v := range p.Env {
			if strings.HasPrefix(k, "LMCACHE_") {
				env[k] = v
			}
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "LMCACHE_") {
				require.Equal(t, e.Value, env[e.Name], "%s: the engine process does not get %s", tc.name, e.Name)
			}
		}
		req.Cases = append(req.Cases, in{Name: tc.name, Env: env})
	}
	var resp struct {
		LMCache string          `json:"lmcache"`
		Results []lmcacheResult `json:"results"`
	}
	pyenv.RunJSON(t, pyenv.VLLM, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "lmcache_env.py"), req, &resp)
	require.Len(t, resp.Results, len(cases))
	t.Logf("LMCache %s read %d environments", resp.LMCache, len(cases))

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, w := resp.Results[i], tc.want
			names := make([]string, 0, len(req.Cases[i].Env))
			for k, v := range req.Cases[i].Env {
				names = append(names, k+"="+v)
			}
			sort.Strings(names)
			t.Logf("env: %s", strings.Join(names, " "))
			require.Empty(t, res.Error, "LMCache's loader refused the environment")
			assert.Empty(t, res.Warnings, "LMCache warned while reading the environment")
			assert.Empty(t, res.Unknown, "LMCACHE_* names LMCache ignores")
			cfg := res.Config
			assert.Equal(t, w.url, cfg["remote_url"])
			assert.Equal(t, w.serde, cfg["remote_serde"])
			if w.chunkSize != 0 {
				assert.Equal(t, float64(w.chunkSize), cfg["chunk_size"])
			} else {
				assert.Equal(t, 256.0, cfg["chunk_size"], "LMCache's default chunk size")
			}
			if w.cpuBytes >= 0 {
				assert.Equal(t, true, cfg["local_cpu"])
				assertGiB(t, w.cpuBytes, cfg["max_local_cpu_size"], "max_local_cpu_size")
			} else {
				// Without spec.lmCache.localCPU the webhook sets nothing and
				// LMCache's own default applies: a 5 GiB local CPU tier.
				assert.Equal(t, true, cfg["local_cpu"], "LMCache's default local_cpu")
				assert.Equal(t, 5.0, cfg["max_local_cpu_size"], "LMCache's default max_local_cpu_size")
			}
			if w.diskBytes >= 0 {
				assert.Equal(t, strings.TrimSuffix(w.diskPath, "/")+"/", cfg["local_disk"], "local_disk is the directory")
				assert.Equal(t, []string{strings.TrimSuffix(w.diskPath, "/") + "/"}, res.DiskPaths, "LMCache's disk tier uses the one directory")
				assertGiB(t, w.diskBytes, cfg["max_local_disk_size"], "max_local_disk_size")
			} else {
				assert.Nil(t, cfg["local_disk"])
			}
		})
	}
}

// assertGiB checks a size LMCache reads as GiB (it allocates
// int(size * 1024**3) bytes: lmcache/v1/storage_backend) against the
// quantity's bytes.
func assertGiB(t *testing.T, bytes int64, got any, name string) {
	t.Helper()
	f, ok := got.(float64)
	require.True(t, ok, "%s = %v (%T)", name, got, got)
	assert.Equal(t, float64(bytes)/(1<<30), f, "%s in GiB", name)
	assert.Equal(t, bytes, int64(f*(1<<30)), "%s: LMCache's tier is not the quantity's size", name)
}
